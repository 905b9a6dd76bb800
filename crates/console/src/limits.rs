//! The console's connections, bounded as the wire server's are: the server, not the client, decides what one may
//! cost.
//!
//! * At most `max_connections + max_pending_logins` connections at once; one beyond is closed at once.
//! * TLS (when configured) within `login_timeout_secs`, and each request's headers (the first byte of the next
//!   request on a kept-alive connection included) within it too (hyper's header read timeout), at most
//!   [`MAX_HEADER_BYTES`] of them; a slower client is disconnected.
//! * A body longer than [`body_limit`] is refused (413) from its announced length before it is read, or as soon
//!   as it grows past it; a body must arrive within `login_timeout_secs` (408).
//! * Every response says `Cache-Control: no-store` and forbids framing, and pages run only the console's own
//!   script (a Content-Security-Policy).

use crate::State;
use crate::log;
use axum::Router;
use axum::http::{HeaderValue, header};
use dpfusion::config::ServerSettings;
use dpfusion::error::Result;
use dpfusion_server::TlsAcceptor;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
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
    let cap = settings.max_connections.saturating_add(settings.max_pending_logins);
    let connections = Arc::new(Semaphore::new(cap));
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
                let Ok(permit) = connections.clone().try_acquire_owned() else {
                    log(&format!("connection from {peer} closed: all {cap} connections are taken"));
                    continue;
                };
                let _ = socket.set_nodelay(true);
                let (tls, app, stopped) = (tls.clone(), app.clone(), stopped.clone());
                let timeout = settings.login_timeout;
                tasks.spawn(async move {
                    connection(socket, peer, tls, app, timeout, stopped).await;
                    drop(permit);
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

/// Serves one connection: TLS within `timeout`, then HTTP/1.1 with bounded headers read within `timeout`.
async fn connection(
    socket: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    app: Router,
    timeout: Duration,
    stopped: tokio::sync::watch::Receiver<bool>,
) {
    let app = app.map_request(move |mut r: axum::extract::Request| {
        r.extensions_mut().insert(Peer(peer));
        r
    });
    match tls {
        Some(tls) => match tokio::time::timeout(timeout, tls.accept(socket)).await {
            Ok(Ok(stream)) => http(TokioIo::new(stream), app, timeout, stopped).await,
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
