//! One connection's life, from TCP accept to close: pgwire's TLS negotiation and message dispatch, run by our own
//! loop so that the server, not the client, bounds what a connection may cost.
//!
//! * **Message sizes.** The socket is read through [`Bounded`], which follows the protocol's framing as bytes
//!   arrive and fails the read as soon as a message announces a length over the current limit, before its body is
//!   buffered: [`PRE_LOGIN_MESSAGE`] bytes until the login completes (and [`PRE_LOGIN_TOTAL`] in all), then
//!   `max_query_bytes` plus [`MESSAGE_OVERHEAD`]. (pgwire itself accepts messages of up to 1 GiB in any state.)
//! * **Login timeout.** TLS, startup and SCRAM must complete within `login_timeout_secs`, and the startup message
//!   arrive within `startup_timeout_secs`; the connection holds one of the `max_pending_logins` pre-login places
//!   until then, never a connection slot (taken after the password checked out, see [`super::auth`]). When a newer
//!   connection is given its place ([`super::pending`]: silent ones go first), it is closed with 53300.
//! * **Idle timeout** after the login: no message for `idle_timeout_secs` closes the connection (57P05); and a
//!   client that reads nothing of what the server writes for as long (at any time) is cut off
//!   ([`super::deadline`]), so that a stalled reader cannot keep its connection slot.
//! * **A client that leaves stops its statement.** pgwire reads nothing from the socket while a logged-in
//!   connection's statement runs, so a second descriptor on the same socket (`watched`) waits for the kernel's
//!   read-closed signal (the client's FIN or reset, `EPOLLRDHUP`), which comes whether or not messages it sent
//!   before are still unread; the statement under way (a catalog query, or a private plan, which after its debit
//!   stays charged) is then dropped at its next await and the connection's slot given back, instead of running on
//!   to the statement timeout. As PostgreSQL's `client_connection_check_interval`, this takes a client that shuts
//!   down its sending side for gone. (Not before the login: a cancel request comes on a connection closed at once.)
//! * **Shutdown.** A connection waiting for its next message is closed (57P01) as soon as the server stops; one
//!   running a statement is closed after it (or aborted by [`super::Server::run`] after the grace period).

use super::deadline::WriteDeadline;
use super::pending::PendingPlace;
use super::wire::{Connection, WireStatement};
use super::{Shared, log};
use dpfusion::config::ServerSettings;
use futures::{SinkExt, StreamExt};
use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::{ClientInfo, NoopHandler, PgWireConnectionState};
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::TlsAcceptor;
use pgwire::tokio::server::{MaybeTls, PgWireMessageServerCodec, negotiate_tls, process_error, process_message};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, FramedParts};

/// The longest message accepted before the login completes (pgwire's own limit for the startup message; SCRAM's
/// messages are about 100 bytes).
pub const PRE_LOGIN_MESSAGE: usize = 10_000;
/// All bytes a client may send before its login completes.
pub const PRE_LOGIN_TOTAL: usize = 64 * 1024;
/// What a message may hold besides its SQL text (statement and portal names, parameters' framing).
pub const MESSAGE_OVERHEAD: usize = 64 * 1024;

/// A message over the limit.
#[derive(Debug, Clone)]
struct TooLarge {
    /// The length the message announced (or the bytes sent before login).
    length: usize,
    limit: usize,
    logged_in: bool,
    /// Its type byte (after the login): whether it belonged to the extended protocol.
    tag: u8,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.logged_in {
            write!(f, "message too long ({} bytes; this server accepts {} per message)", self.length, self.limit)
        } else {
            let (length, limit) = (self.length, self.limit);
            write!(
                f,
                "message too long before login ({length} bytes; this server accepts {limit} until the login completes)"
            )
        }
    }
}

impl std::error::Error for TooLarge {}

/// An empty Flush message: what an oversized message is replaced with after the login (it changes nothing; the
/// connection then reports the message as too long).
const FLUSH: [u8; 5] = [b'H', 0, 0, 0, 4];

/// Where the reader is in the protocol's framing. A message's header (type byte, except for the first, untyped,
/// startup message; then its length) is held back until complete and passed on only if the length is accepted.
#[derive(Debug, Default)]
struct Framing {
    header: [u8; 5],
    have: usize,
    /// Header bytes passed on already (only those of a connection's first bytes, which pgwire read itself).
    passed: usize,
    /// Past the first message: every further one starts with a type byte.
    typed: bool,
    /// Body bytes still to pass on of the current message.
    body_left: usize,
    /// Body bytes still to drop of an oversized message.
    discard: usize,
}

impl Framing {
    /// Passes the bytes of `data` that may go on to `out`; an oversized message is refused before the login
    /// (`Err`) and, after it, dropped and replaced by [`FLUSH`] (reported in `Ok(Some)`).
    fn feed(
        &mut self,
        mut data: &[u8],
        limit: usize,
        logged_in: bool,
        out: &mut Vec<u8>,
    ) -> Result<Option<TooLarge>, TooLarge> {
        let mut skipped = None;
        while !data.is_empty() {
            if self.discard > 0 {
                let n = self.discard.min(data.len());
                self.discard -= n;
                data = &data[n..];
                continue;
            }
            if self.body_left > 0 {
                let n = self.body_left.min(data.len());
                out.extend_from_slice(&data[..n]);
                self.body_left -= n;
                data = &data[n..];
                continue;
            }
            let need = if self.typed { 5 } else { 4 };
            let n = (need - self.have).min(data.len());
            self.header[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have < need {
                continue;
            }
            let at = need - 4;
            let len =
                i32::from_be_bytes([self.header[at], self.header[at + 1], self.header[at + 2], self.header[at + 3]]);
            // Negative: refused as too long. Below 4: malformed, passed on for pgwire to refuse.
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            let tag = if self.typed { self.header[0] } else { 0 };
            let header = (self.header, std::mem::take(&mut self.have), std::mem::take(&mut self.passed));
            self.typed = true;
            if len > limit {
                let too_large = TooLarge { length: len, limit, logged_in, tag };
                if !logged_in {
                    return Err(too_large);
                }
                out.extend_from_slice(&FLUSH);
                self.discard = len.saturating_sub(4);
                skipped.get_or_insert(too_large);
                continue;
            }
            out.extend_from_slice(&header.0[header.2..header.1]);
            self.body_left = len.saturating_sub(4);
        }
        Ok(skipped)
    }
}

/// A socket that passes on no message longer than its current limit (see the module docs); it reads through
/// its own small buffer, so an oversized message's body is dropped as it arrives, never held.
pub struct Bounded<S> {
    inner: S,
    framing: Framing,
    limit: usize,
    /// Before the login: bytes the client may still send.
    budget: Option<usize>,
    /// Bytes read, not yet processed.
    scratch: Box<[u8]>,
    /// Bytes processed, to pass on from `ready_at`.
    ready: Vec<u8>,
    ready_at: usize,
    /// A refusal to report once the bytes before it have been passed on.
    error: Option<TooLarge>,
    /// An oversized message dropped since the connection last looked ([`Bounded::take_skipped`]).
    skipped: Option<TooLarge>,
}

impl<S> Bounded<S> {
    fn new(inner: S) -> Self {
        Bounded {
            inner,
            framing: Framing::default(),
            limit: PRE_LOGIN_MESSAGE,
            budget: Some(PRE_LOGIN_TOTAL),
            scratch: vec![0; 8 * 1024].into_boxed_slice(),
            ready: Vec::new(),
            ready_at: 0,
            error: None,
            skipped: None,
        }
    }

    /// Follows `data` (the first bytes, which pgwire read before this socket was put in place and has already).
    fn observe(&mut self, data: &[u8]) -> Result<(), TooLarge> {
        let mut out = Vec::new();
        self.process(data, &mut out)?;
        // Those bytes are passed on already; only a header they end inside is held, and is passed on partly.
        self.framing.passed = self.framing.have;
        Ok(())
    }

    /// Processes bytes read from the socket into `out`.
    fn process(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), TooLarge> {
        let logged_in = self.budget.is_none();
        if let Some(b) = self.budget.as_mut() {
            *b = b.checked_sub(data.len()).ok_or(TooLarge {
                length: PRE_LOGIN_TOTAL + 1,
                limit: PRE_LOGIN_TOTAL,
                logged_in,
                tag: 0,
            })?;
        }
        if let Some(t) = self.framing.feed(data, self.limit, logged_in, out)? {
            self.skipped.get_or_insert(t);
        }
        Ok(())
    }

    /// The login completed: messages up to `limit` bytes, no total budget.
    fn logged_in(&mut self, limit: usize) {
        self.limit = limit;
        self.budget = None;
    }

    /// The oversized message dropped since the last call, if any.
    fn take_skipped(&mut self) -> Option<TooLarge> {
        self.skipped.take()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Bounded<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            if me.ready_at < me.ready.len() {
                let n = buf.remaining().min(me.ready.len() - me.ready_at);
                buf.put_slice(&me.ready[me.ready_at..me.ready_at + n]);
                me.ready_at += n;
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = me.error.take() {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
            }
            let mut read = ReadBuf::new(&mut me.scratch);
            match Pin::new(&mut me.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
            let n = read.filled().len();
            if n == 0 {
                return Poll::Ready(Ok(())); // the end of the stream
            }
            me.ready.clear();
            me.ready_at = 0;
            let mut out = std::mem::take(&mut me.ready);
            let chunk = me.scratch[..n].to_vec();
            if let Err(e) = me.process(&chunk, &mut out) {
                me.error = Some(e);
            }
            me.ready = out;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Bounded<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

type Socket = Framed<Bounded<WriteDeadline<MaybeTls>>, PgWireMessageServerCodec<WireStatement>>;

/// A FATAL error for the wire.
fn fatal(code: &str, message: String, hint: Option<&str>) -> PgWireBackendMessage {
    let mut e = ErrorInfo::new("FATAL".to_owned(), code.to_owned(), message);
    e.hint = hint.map(str::to_owned);
    PgWireBackendMessage::ErrorResponse(e.into())
}

/// Sends a FATAL error (giving up after a second: the client may not be reading) and closes.
async fn close_with(socket: &mut Socket, message: PgWireBackendMessage) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = socket.send(message).await;
        let _ = socket.close().await;
    })
    .await;
}

/// Writes `message` on a socket nothing has been written to yet, without waiting (its send buffer is empty, so a
/// short message fits; should it not, it is given up). Written through a descriptor of its own: the runtime's
/// `try_write` gives up on a socket it has not yet seen writable, as a freshly accepted one often is not.
fn write_now(socket: &TcpStream, message: PgWireBackendMessage) {
    use std::io::Write;
    let mut bytes = Default::default();
    if message.encode(&mut bytes).is_ok()
        && let Some(mut socket) = super::pending::duplicate(socket)
    {
        let _ = socket.write(&bytes);
    }
}

/// Refuses a connection that got no pre-login place: a FATAL error written without waiting, then closed.
pub(crate) fn refuse_now(socket: TcpStream, why: String) {
    write_now(&socket, fatal("53300", why, None));
}

/// Why a connection is closed before its login completed.
#[derive(Clone, Copy)]
enum Cut {
    /// Its pre-login place was given to a newer connection ([`PendingPlace::evicted`]).
    Evicted,
    StartupTimeout,
    LoginTimeout,
}

impl Cut {
    fn message(self, settings: &ServerSettings) -> PgWireBackendMessage {
        match self {
            Cut::Evicted => fatal(
                "53300",
                "too many connections are logging in: this one had not completed its login and was closed to make \
                 room for a newer one"
                    .into(),
                Some("reconnect and log in; when every place is taken, connections that have sent nothing go first"),
            ),
            Cut::StartupTimeout => {
                fatal("08006", format!("startup message not received within {:?}", settings.startup_timeout), None)
            }
            Cut::LoginTimeout => {
                fatal("08006", format!("login not completed within {:?}", settings.login_timeout), None)
            }
        }
    }
}

/// Sends a FATAL error to a client that may be writing (a login under way), shuts our end, and reads and drops
/// what the client still sends (at most the bytes it may send before login) until it closes too, all within a
/// second: closing with a message of its unread would reset the connection, and a client writing then would
/// see the reset, not the error.
async fn close_draining(socket: &mut Socket, message: PgWireBackendMessage) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = socket.send(message).await;
        let _ = socket.close().await;
        while let Some(Ok(_)) = socket.next().await {}
    })
    .await;
}

/// What a connection waits for.
enum Event {
    Message(Option<Result<PgWireFrontendMessage, PgWireError>>),
    Cut(Cut),
    Idle,
    Stop,
}

/// Has the login completed? (The connection slot is taken only then; see [`super::auth`].)
fn logged_in(socket: &Socket) -> bool {
    socket.session_extensions().get::<super::auth::Slot>().is_some()
}

/// The socket, and a second handle on it (a duplicated descriptor, registered with the reactor on its own) that
/// only [`client_left`] uses: it never reads, so the connection's bytes all go to pgwire.
fn watched(tcp: TcpStream) -> io::Result<(TcpStream, TcpStream)> {
    let tcp = tcp.into_std()?;
    let watch = tcp.try_clone()?;
    Ok((TcpStream::from_std(tcp)?, TcpStream::from_std(watch)?))
}

/// Completes once the client has closed its end of the connection (or the socket failed): the read-closed
/// readiness, which the kernel reports whether or not bytes the client sent before are still unread.
async fn client_left(watch: &TcpStream) {
    loop {
        match watch.ready(Interest::READABLE).await {
            Ok(ready) if !ready.is_read_closed() => {
                // Only more bytes (pipelined messages, read later by pgwire): forget this readiness and wait for the
                // socket's next event. Read-closed is never forgotten, so a close in between is not missed.
                let _ = watch.try_io(Interest::READABLE, || Err::<(), _>(io::ErrorKind::WouldBlock.into()));
            }
            _ => return,
        }
    }
}

/// Brings an accepted socket to its startup message: its first byte, TLS if it asks for it, then the bounded
/// socket; `None` if it was closed meanwhile (cut off by the startup timeout or by losing its place: told so
/// while nothing else was written on the socket, or after TLS was refused; or gone, or over a size limit).
async fn negotiate(
    tcp: TcpStream,
    watch: &TcpStream,
    tls: Option<TlsAcceptor>,
    place: &mut PendingPlace,
    startup_deadline: Pin<&mut tokio::time::Sleep>,
    settings: &ServerSettings,
) -> io::Result<Option<Socket>> {
    let mut startup_deadline = startup_deadline;
    // Silent until its first byte (peeked, left for pgwire to read): nothing was written either, so a refusal can
    // go on the bare socket whatever the client meant to negotiate. Here too what has arrived goes first (see
    // `serve`).
    let mut byte = [0u8; 1];
    let first = tokio::select! {
        biased;
        r = tcp.peek(&mut byte) => Ok(r),
        _ = &mut startup_deadline => Err(Cut::StartupTimeout),
        () = place.evicted() => Err(Cut::Evicted),
    };
    match first {
        Err(cut) => {
            write_now(watch, cut.message(settings));
            return Ok(None);
        }
        Ok(Ok(0) | Err(_)) => return Ok(None),
        Ok(Ok(_)) => place.step(),
    }
    let plain = tls.is_none();
    let negotiated = tokio::select! {
        biased;
        s = negotiate_tls::<WireStatement>(tcp, tls) => Ok(s?),
        _ = &mut startup_deadline => Err(Cut::StartupTimeout),
        () = place.evicted() => Err(Cut::Evicted),
    };
    let negotiated = match negotiated {
        Ok(Some(n)) => n,
        Ok(None) => return Ok(None),
        Err(cut) => {
            // Without TLS configured, pgwire wrote at most its refusal of an SSL or GSS request: a message may
            // follow. With it, a TLS handshake may be under way, and bare bytes would only garble it.
            if plain {
                write_now(watch, cut.message(settings));
            }
            return Ok(None);
        }
    };
    let old = negotiated.into_parts();
    // A client that stops reading its answers is cut off after the idle timeout ([`WriteDeadline`]).
    let mut io = Bounded::new(WriteDeadline::new(old.io, settings.idle_timeout));
    let early = io.observe(&old.read_buf);
    let mut parts = FramedParts::new(io, old.codec);
    parts.read_buf = old.read_buf;
    parts.write_buf = old.write_buf;
    let mut socket: Socket = Framed::from_parts(parts);
    if let Err(e) = early {
        log(&format!("connection from {} closed: {e}", socket.socket_addr()));
        close_with(&mut socket, fatal("54000", e.to_string(), None)).await;
        return Ok(None);
    }
    Ok(Some(socket))
}

/// Serves one accepted socket until it closes. `place` is its pre-login place, given up at login; until then the
/// connection is closed when the place is given to a newer one, or when its startup message or its login takes
/// too long.
pub(crate) async fn serve(
    tcp: TcpStream,
    tls: Option<TlsAcceptor>,
    handler: Arc<Connection>,
    shared: Arc<Shared>,
    mut place: PendingPlace,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> io::Result<()> {
    let settings = &shared.settings;
    let startup_deadline = tokio::time::sleep(settings.startup_timeout);
    let login_deadline = tokio::time::sleep(settings.login_timeout);
    tokio::pin!(startup_deadline, login_deadline);
    let (tcp, watch) = watched(tcp)?;
    let Some(mut socket) = negotiate(tcp, &watch, tls, &mut place, startup_deadline.as_mut(), settings).await? else {
        return Ok(());
    };
    let mut pending = Some(place);
    let copy = Arc::new(NoopHandler);
    let cancel = Arc::new(DefaultCancelHandler::new(shared.cancels.clone()));
    let idle = settings.idle_timeout;
    loop {
        if pending.is_some() && logged_in(&socket) {
            pending = None;
            socket.get_mut().logged_in(settings.max_query_bytes.saturating_add(MESSAGE_OVERHEAD));
        }
        // Before the login, a message that has arrived goes first (`biased`): on a busy server a task may be polled
        // late, when its client's message and a deadline are both due, and the client must not be cut off for the
        // server's delay (what it may send before login is bounded, so it cannot hold a deadline off for long).
        let next = match pending.as_mut() {
            Some(place) => {
                let awaiting_startup = matches!(socket.state(), PgWireConnectionState::AwaitingStartup);
                tokio::select! {
                    biased;
                    m = socket.next() => Event::Message(m),
                    () = place.evicted() => Event::Cut(Cut::Evicted),
                    _ = &mut startup_deadline, if awaiting_startup => Event::Cut(Cut::StartupTimeout),
                    _ = &mut login_deadline => Event::Cut(Cut::LoginTimeout),
                    r = stop.wait_for(|s| *s) => {
                        drop(r);
                        Event::Stop
                    }
                }
            }
            None => tokio::select! {
                m = socket.next() => Event::Message(m),
                _ = tokio::time::sleep(idle) => Event::Idle,
                r = stop.wait_for(|s| *s) => {
                    drop(r);
                    Event::Stop
                }
            },
        };
        let next = match next {
            Event::Message(m) => m,
            Event::Cut(cut) => {
                // Its client may be sending its next login message: wait for it to read the error, if the server
                // can afford to (held until the end of this block).
                let lingering = pending.as_ref().filter(|_| matches!(cut, Cut::Evicted)).and_then(PendingPlace::linger);
                if lingering.is_some() {
                    close_draining(&mut socket, cut.message(settings)).await;
                } else {
                    close_with(&mut socket, cut.message(settings)).await;
                }
                break;
            }
            Event::Idle => {
                log(&format!(
                    "closing an idle connection from {} (nothing received for {idle:?})",
                    socket.socket_addr()
                ));
                let m = format!("terminating connection due to idle-session timeout ({idle:?} without a message)");
                let hint = "reconnect; the server closes connections idle for longer than [server] idle_timeout_secs";
                close_with(&mut socket, fatal("57P05", m, Some(hint))).await;
                break;
            }
            Event::Stop => {
                let m = "terminating connection: the server is shutting down".to_string();
                close_with(&mut socket, fatal("57P01", m, None)).await;
                break;
            }
        };
        let message = match next {
            Some(Ok(PgWireFrontendMessage::Terminate(_))) | None => break,
            Some(Ok(m)) => m,
            Some(Err(PgWireError::IoError(e))) => {
                if let Some(t) = e.get_ref().and_then(|i| i.downcast_ref::<TooLarge>()) {
                    log(&format!("connection from {} closed: {t}", socket.socket_addr()));
                    close_with(&mut socket, fatal("54000", t.to_string(), None)).await;
                }
                break;
            }
            Some(Err(e)) => {
                // A message pgwire cannot decode: it says why, and the connection ends.
                let _ = process_error(&mut socket, e, false).await;
                break;
            }
        };
        // A login step keeps the place from going before those of connections that did less. At most three: one
        // startup message, two SCRAM messages (the second ends the login either way); others are ignored here.
        if let Some(p) = &pending
            && matches!(message, PgWireFrontendMessage::Startup(_) | PgWireFrontendMessage::PasswordMessageFamily(_))
        {
            p.step();
        }
        let extended_query = match socket.state() {
            PgWireConnectionState::CopyInProgress(e) => e,
            _ => message.is_extended_query(),
        };
        let processed = process_message(
            message,
            &mut socket,
            handler.clone(),
            handler.clone(),
            handler.clone(),
            copy.clone(),
            cancel.clone(),
        );
        // Only a logged-in connection's statements are stopped when the client leaves: before the login, a client
        // sends a cancel request (or its last login message) and closes at once, and that must still be handled.
        let result = if pending.is_some() {
            processed.await
        } else {
            tokio::select! {
                r = processed => r,
                () = client_left(&watch) => {
                    log(&format!("connection from {}: the client left during a statement; stopped it", handler.peer));
                    break;
                }
            }
        };
        if let Err(e) = result {
            let is_fatal = matches!(&e, PgWireError::UserError(info) if info.is_fatal());
            process_error(&mut socket, e, extended_query).await?;
            if is_fatal {
                break;
            }
        }
        if let Some(t) = socket.get_mut().take_skipped() {
            report_skipped(&mut socket, t).await?;
        }
    }
    Ok(())
}

/// Answers an oversized message (dropped by [`Bounded`]) as PostgreSQL answers a refused one: an error, then
/// ReadyForQuery for a simple Query, or skipping to the next Sync for the extended protocol. While already
/// skipping to a Sync, it is dropped silently, as any message is.
async fn report_skipped(socket: &mut Socket, t: TooLarge) -> io::Result<()> {
    log(&format!("connection from {}: {t}; dropped unread", socket.socket_addr()));
    if matches!(socket.state(), PgWireConnectionState::AwaitingSync) {
        return Ok(());
    }
    let mut e = ErrorInfo::new("ERROR".to_owned(), "54000".to_owned(), t.to_string());
    e.hint = Some("send a shorter statement ([server] max_query_bytes)".to_owned());
    let extended = matches!(t.tag, b'P' | b'B' | b'D' | b'E' | b'C' | b'H' | b'S');
    process_error(socket, PgWireError::UserError(Box::new(e)), extended).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(tag: u8, body: usize) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&((body + 4) as i32).to_be_bytes());
        m.extend(std::iter::repeat_n(b'x', body));
        m
    }

    fn startup() -> Vec<u8> {
        let mut m = 12i32.to_be_bytes().to_vec();
        m.extend_from_slice(&[0, 3, 0, 0, 0, 0, 0, 0]);
        m
    }

    /// Feeds `stream` in chunks of `chunk` bytes (the login completed after the startup message when `logged_in`).
    fn run(stream: &[u8], chunk: usize, logged_in: bool) -> (Vec<u8>, Result<(), TooLarge>, Option<TooLarge>) {
        let mut b = Bounded::new(());
        if logged_in {
            b.observe(&startup()).unwrap();
            b.logged_in(1000);
        }
        let mut out = Vec::new();
        for piece in stream.chunks(chunk) {
            if let Err(e) = b.process(piece, &mut out) {
                return (out, Err(e), None);
            }
        }
        (out, Ok(()), b.take_skipped())
    }

    #[test]
    fn before_login_a_long_message_is_refused_at_its_header() {
        let stream = [startup(), message(b'p', 100), message(b'Q', 20_000)].concat();
        for chunk in [1, 3, 7, 4096] {
            let (out, result, _) = run(&stream, chunk, false);
            let e = result.expect_err("refused");
            assert_eq!((e.length, e.logged_in), (20_004, false), "chunks of {chunk}");
            assert_eq!(out, [startup(), message(b'p', 100)].concat(), "nothing of the long message is passed on");
        }
        let mut f = Framing::default();
        assert!(f.feed(&(-5i32).to_be_bytes(), 1000, false, &mut Vec::new()).is_err(), "a negative length");
    }

    #[test]
    fn after_login_a_long_message_becomes_a_flush_and_the_next_ones_pass() {
        let stream = [message(b'Q', 900), message(b'Q', 5000), message(b'S', 0), message(b'Q', 10)].concat();
        for chunk in [1, 3, 7, 4096] {
            let (out, result, skipped) = run(&stream, chunk, true);
            assert!(result.is_ok());
            assert_eq!(out, [message(b'Q', 900), FLUSH.to_vec(), message(b'S', 0), message(b'Q', 10)].concat());
            let t = skipped.expect("reported");
            assert_eq!((t.length, t.tag, t.logged_in), (5004, b'Q', true));
        }
    }

    #[test]
    fn the_pre_login_budget_counts_every_byte() {
        let mut b = Bounded::new(());
        let mut out = Vec::new();
        b.observe(&startup()).unwrap();
        let accepted = (0..100).take_while(|_| b.process(&message(b'Q', 995), &mut out).is_ok()).count();
        assert_eq!(accepted, (PRE_LOGIN_TOTAL - startup().len()) / 1000, "every byte before login counts");
        let mut b = Bounded::new(());
        b.observe(&startup()).unwrap();
        b.logged_in(1 << 20);
        for _ in 0..200 {
            b.process(&message(b'Q', 995), &mut out).unwrap();
        }
    }

    #[test]
    fn a_header_split_by_pgwires_first_read_is_passed_on_once() {
        // pgwire read the startup message and the first two bytes of the next header itself.
        let first = [startup(), message(b'p', 50)[..2].to_vec()].concat();
        let mut b = Bounded::new(());
        b.observe(&first).unwrap();
        let mut out = Vec::new();
        b.process(&message(b'p', 50)[2..], &mut out).unwrap();
        assert_eq!(out, message(b'p', 50)[2..]);
    }
}
