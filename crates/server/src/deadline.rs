//! Writes that must make progress. A client that stops reading what the server sends (its receive window full, the
//! socket still open) would otherwise hold its connection, and the slot that connection occupies, for as long as it
//! likes: the server's write waits, and neither the idle timeout (which waits for the *client's* next message) nor
//! the statement timeout (which ends a statement, not the writing of its answer) ever fires. [`WriteDeadline`]
//! fails a write, flush or shutdown that has made no progress for its limit (`[server] idle_timeout_secs`, for
//! the wire server and for the web console), and the connection is closed. A slow reader that keeps taking bytes
//! is never cut: the limit counts from the moment the writes stopped moving, and any progress restarts it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream whose writes fail once they have been stalled for `limit` (see the module docs). Reads pass through.
pub struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    /// Since the writes stopped moving: the moment they fail.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    /// `inner`, its writes failing after `limit` without progress.
    pub fn new(inner: S, limit: Duration) -> Self {
        WriteDeadline { inner, limit, stalled: None }
    }

    /// The stream it wraps.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// What a write (or flush, or shutdown) of the inner stream gave: progress clears the stall; no progress starts
    /// the stall's clock, or fails once it has run for the limit.
    fn watch<T>(&mut self, polled: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let limit = self.limit;
        let clock = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match clock.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing of the response for {limit:?}: closed"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let polled = Pin::new(&mut me.inner).poll_write(cx, buf);
        me.watch(polled, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let polled = Pin::new(&mut me.inner).poll_write_vectored(cx, bufs);
        me.watch(polled, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let polled = Pin::new(&mut me.inner).poll_flush(cx);
        me.watch(polled, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let polled = Pin::new(&mut me.inner).poll_shutdown(cx);
        me.watch(polled, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Over a pipe of 64 bytes: a peer that never reads fails the write once it has been stalled for the limit
    /// (not before); a peer that keeps reading, 8 bytes every twentieth of the limit, is never cut. (Real time: the
    /// workspace's tokio has no paused clock outside its test utilities, which would change its features.)
    #[tokio::test]
    async fn a_stalled_write_fails_after_the_limit_and_a_slow_reader_is_never_cut() {
        let limit = Duration::from_secs(2);
        let (ours, _theirs) = tokio::io::duplex(64);
        let mut w = WriteDeadline::new(ours, limit);
        let start = std::time::Instant::now();
        let e = w.write_all(&[7u8; 1000]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let took = start.elapsed();
        assert!(took >= limit && took < limit * 3, "cut after {took:?}");

        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut w = WriteDeadline::new(ours, limit);
        let reader = tokio::spawn(async move {
            let (mut got, mut bytes) = (0usize, [0u8; 8]);
            while got < 200 {
                tokio::time::sleep(limit / 20).await;
                got += theirs.read(&mut bytes).await.unwrap();
            }
            got
        });
        w.write_all(&[7u8; 200]).await.expect("a reader that keeps reading is not cut");
        w.flush().await.unwrap();
        drop(w);
        assert_eq!(reader.await.unwrap(), 200, "the slow reader took every byte");
    }
}
