//! The console's connections, bounded as the wire server's are: the server, not the client, decides what one may
//! cost, and no client can keep another out.
//!
//! * **Places before login.** From its accept until a request of a logged-in session arrives on it, a connection
//!   holds one of `max_pending_logins` places (`max_pending_logins_per_address` per address), shared out exactly
//!   as the wire server's are ([`dpfusion_server::pending`]): a newcomer is never turned away, it takes the place
//!   of a *silent* connection first (no request yet), of the address group holding the most places, the oldest;
//!   that connection is closed. A flood of silent or idle sockets, from any number of addresses, takes places only
//!   from itself once a real client has sent its request.
//! * **Logged-in connections.** A request of a logged-in session gives its connection's place back and makes it one
//!   of the session's [`crate::sessions::CONNECTIONS_PER_SESSION`] connections, never closed to make room (a session's further
//!   connections keep their places). Sessions are capped ([`crate::sessions`]), so at most `max_pending_logins +
//!   max_connections × CONNECTIONS_PER_SESSION` connections are open at once.
//! * A client that reads nothing of a response for `idle_timeout_secs` is cut off
//!   ([`dpfusion_server::deadline`]): a stalled reader cannot keep one of its session's connections.
//! * TLS (when configured) within `login_timeout_secs`, and each request's headers (the first byte of the next
//!   request on a kept-alive connection included) within it too (hyper's header read timeout), at most
//!   [`MAX_HEADER_BYTES`] of them; a slower client is disconnected.
//! * A body longer than [`body_limit`] is refused (413) from its announced length before it is read, or as soon
//!   as it grows past it; a body must arrive within `login_timeout_secs` (408).
//! * Every response says `Cache-Control: no-store` and forbids framing, and pages run only the console's own
//!   script (a Content-Security-Policy).

use crate::State;
use crate::log;
use crate::sessions::{HeldConnection, Session};
use axum::Router;
use axum::http::{HeaderValue, header};
use dpfusion::config::ServerSettings;
use dpfusion::error::Result;
use dpfusion_server::TlsAcceptor;
use dpfusion_server::deadline::WriteDeadline;
use dpfusion_server::pending::{PendingLogins, PendingPlace};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;

/// The most bytes of request line and headers hyper reads for one request (its smallest buffer).
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// What a form may hold besides its SQL text (the other fields, their names and encoding).
pub const FORM_OVERHEAD: usize = 16 * 1024;

/// The longest request body accepted: a form with a statement of `max_query_bytes` (URL-encoding may triple its
/// bytes: each non-ASCII or reserved byte is written `%XX`).
pub fn body_limit(settings: &ServerSettings) -> usize {
    settings.max_query_bytes.saturating_mul(3).saturating_add(FORM_OVERHEAD)
}

/// The client address of a request (for the login throttle and the log).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub SocketAddr);

/// What a connection holds (see the module docs), shared by its task and its requests' extensions.
#[derive(Clone)]
pub struct Link(Arc<Mutex<Standing>>);

enum Standing {
    /// A pre-login place.
    Place(PendingPlace),
    /// One of a logged-in session's connections (given back when dropped).
    Session { _held: HeldConnection },
}

impl Link {
    /// Its client sent a request (or finished its TLS handshake): among the places, it has spoken, and recently.
    fn step(&self) {
        if let Ok(standing) = self.0.lock()
            && let Standing::Place(place) = &*standing
        {
            place.step();
        }
    }

    /// A request of `session` arrived on it: it gives its place back and becomes one of the session's connections
    /// (unless the session holds as many as it may, or it is one already).
    pub(crate) fn logged_in(&self, session: &Arc<Session>) {
        if let Ok(mut standing) = self.0.lock()
            && matches!(*standing, Standing::Place(_))
            && let Some(held) = session.hold_connection()
        {
            *standing = Standing::Session { _held: held };
        }
    }
}

/// The headers every response carries.
fn secured(app: Router) -> Router {
    let csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
               form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
    app.layer(SetResponseHeaderLayer::overriding(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(csp)))
        .layer(SetResponseHeaderLayer::overriding(header::CACHE_CONTROL, HeaderValue::from_static("no-store")))
        .layer(SetResponseHeaderLayer::overriding(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")))
        .layer(SetResponseHeaderLayer::overriding(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")))
        .layer(SetResponseHeaderLayer::overriding(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")))
}

/// Accepts connections until `shutdown`, each served by hyper within the limits above.
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: Router,
    state: Arc<State>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let settings = &state.settings;
    let app = secured(app)
        .layer(RequestBodyTimeoutLayer::new(settings.login_timeout))
        .layer(axum::extract::DefaultBodyLimit::max(body_limit(settings)))
        .layer(RequestBodyLimitLayer::new(body_limit(settings)));
    let places = Arc::new(PendingLogins::new(settings.max_pending_logins));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let (socket, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        log(&format!("accept failed: {e}"));
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let mut place = match places.take(&socket, peer.ip(), settings) {
                    Ok(place) => place,
                    Err(e) => {
                        log(&format!("connection from {peer} closed: {e}"));
                        continue;
                    }
                };
                let Some(eviction) = place.eviction() else { continue };
                let link = Link(Arc::new(Mutex::new(Standing::Place(place))));
                let _ = socket.set_nodelay(true);
                let (tls, app, stopped) = (tls.clone(), app.clone(), stopped.clone());
                let timeout = settings.login_timeout;
                // A client that stops reading its responses is cut off after the idle timeout.
                let socket = WriteDeadline::new(socket, settings.idle_timeout);
                tasks.spawn(async move {
                    let ended = connection(socket, peer, tls, app, timeout, (link, stopped));
                    let mut eviction = eviction;
                    tokio::select! {
                        () = ended => {}
                        () = eviction.evicted() => log(&format!("connection from {peer} closed: its place went to a newer one")),
                    }
                });
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop.send(true);
    let grace = settings.statement_timeout;
    if tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await.is_err() {
        tasks.abort_all();
    }
    Ok(())
}

/// Serves one connection: TLS within `timeout`, then HTTP/1.1 with bounded headers read within `timeout`; each
/// request steps the connection's place and carries its [`Link`].
async fn connection(
    socket: WriteDeadline<TcpStream>,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    app: Router,
    timeout: Duration,
    (link, stopped): (Link, tokio::sync::watch::Receiver<bool>),
) {
    let (on_request, handshake) = (link.clone(), link);
    let app = app.map_request(move |mut r: axum::extract::Request| {
        on_request.step();
        r.extensions_mut().insert(Peer(peer));
        r.extensions_mut().insert(on_request.clone());
        r
    });
    match tls {
        Some(tls) => match tokio::time::timeout(timeout, tls.accept(socket)).await {
            Ok(Ok(stream)) => {
                handshake.step();
                http(TokioIo::new(stream), app, timeout, stopped).await
            }
            Ok(Err(e)) => log(&format!("TLS handshake with {peer} failed: {e}")),
            Err(_) => log(&format!("TLS handshake with {peer} not completed within {timeout:?}: closed")),
        },
        None => http(TokioIo::new(socket), app, timeout, stopped).await,
    }
}

/// HTTP/1.1 on one connection until it closes, or until the console stops (then after the request under way).
async fn http<I, S>(io: I, app: S, timeout: Duration, mut stopped: tokio::sync::watch::Receiver<bool>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: tower::Service<axum::extract::Request, Response = axum::response::Response, Error = std::convert::Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(
        app.map_request(|r: hyper::Request<hyper::body::Incoming>| r.map(axum::body::Body::new)),
    );
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(timeout).max_buf_size(MAX_HEADER_BYTES).keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let stopping = tokio::select! {
        _ = conn.as_mut() => false,
        r = stopped.wait_for(|s| *s) => r.is_ok(),
    };
    if stopping {
        conn.as_mut().graceful_shutdown();
        let _ = conn.await;
    }
}
