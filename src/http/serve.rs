//! drover's own accept loop, so that no client can hold a socket for free.
//!
//! `axum::serve` has no settings for this, so connections are served here
//! with hyper directly, under three limits:
//!
//! - **a connection cap**: past `max_connections` open connections, a new
//!   one is answered `503` at once and closed;
//! - **a header read timeout**: a request head (line and headers) must
//!   arrive within `header_read_timeout` of its first byte, and a new
//!   connection must send one within that time of being accepted;
//! - **an idle timeout**: a kept-alive connection waits at most
//!   `idle_timeout` for its next request, and a connection whose request is
//!   in flight is closed when nothing was read from or written to it for
//!   `stall_timeout` (a client that stopped reading its answer).
//!
//! Each connection has a [`Clock`] fed by its socket (every read and write)
//! and by its requests (start and end of each), and a watchdog that closes
//! the connection when the clock's deadline passes. Event streams write a
//! keep-alive comment every 15 s, so an open stream whose client reads is
//! never stalled; they have a lifetime of their own.
//!
//! With TLS ([`crate::tls`]), each connection's handshake runs in its own
//! task under the header read timeout, with the configuration current at
//! that moment, and the subject of a client certificate is put in each of
//! the connection's requests ([`crate::identity::caller::ClientCertificate`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

use crate::config::ServeConfig;
use crate::error::ApiError;
use crate::identity::caller::ClientCertificate;
use crate::metrics::{CloseReason, Metrics};
use crate::tls::Tls;

/// The connection limits, from the settings.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    /// Longest silence on a connection whose request is in flight: longer
    /// than the request timeout, so that a slow handler is never cut, and
    /// than the other two, so that a request's start never brings the
    /// connection's deadline forward.
    pub stall_timeout: Duration,
    pub max_header_bytes: usize,
}

impl Limits {
    pub fn from_config(c: &ServeConfig) -> Self {
        Self {
            max_connections: c.max_connections as usize,
            header_read_timeout: c.header_read_timeout,
            idle_timeout: c.idle_timeout,
            stall_timeout: c.idle_timeout.max(c.request_timeout).max(c.header_read_timeout) + Duration::from_secs(5),
            max_header_bytes: c.max_header_bytes as usize,
        }
    }
}

/// Accepts and serves connections until `shutdown` fires, then lets the
/// open ones finish their requests (idle ones close at once) and returns
/// when all are closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    tls: Option<Arc<Tls>>,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors or a connection reset before it was
                // accepted: wait a little rather than spin.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            metrics.connection_refused();
            // A TLS client would read a plain answer as garbage: just close.
            if tls.is_none() {
                refuse(&stream);
            }
            continue;
        };
        // Small JSON answers: send them as soon as they are written.
        let _ = stream.set_nodelay(true);
        let (router, metrics, shutdown) = (router.clone(), Arc::clone(&metrics), shutdown.clone());
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        connections.spawn(async move {
            match acceptor {
                None => serve_connection(stream, None, router, limits, metrics, shutdown).await,
                Some(acceptor) => {
                    if let Some((stream, peer)) = handshake(acceptor, stream, &limits).await {
                        serve_connection(stream, peer, router, limits, metrics, shutdown).await;
                    }
                }
            }
            drop(slot);
        });
    }
    connections.close();
    connections.wait().await;
}

/// Answers a connection over the cap with a `503` problem, without reading
/// from it or waiting on it.
fn refuse(stream: &TcpStream) {
    let problem = ApiError::Unavailable("the server is at its limit of open connections; retry shortly".into());
    let body = serde_json::to_string(&problem.to_problem()).unwrap_or_default();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\nretry-after: 1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(answer.as_bytes());
}

/// The TLS handshake, within the header read timeout; `None` when it
/// fails (logged at debug level: scanners and clients that distrust the
/// certificate are common and not the server's fault). Also returns the
/// subject of the client's certificate, when it sent one.
async fn handshake(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: TcpStream,
    limits: &Limits,
) -> Option<(tokio_rustls::server::TlsStream<TcpStream>, Option<ClientCertificate>)> {
    match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => {
            let peer = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|cert| ClientCertificate(crate::tls::subject_of(cert).unwrap_or_default().into()));
            Some((stream, peer))
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!("TLS handshake timed out");
            None
        }
    }
}

async fn serve_connection<S>(
    stream: S,
    peer: Option<ClientCertificate>,
    router: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let _open = metrics.connection_opened();
    let clock = Arc::new(Clock::new());
    let io = TokioIo::new(Watched { inner: stream, clock: Arc::clone(&clock) });
    let service = {
        let clock = Arc::clone(&clock);
        hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            let (router, clock) = (router.clone(), Arc::clone(&clock));
            if let Some(peer) = &peer {
                req.extensions_mut().insert(peer.clone());
            }
            async move {
                clock.request_started();
                let res = router.oneshot(req.map(Body::new)).await.unwrap_or_else(|never| match never {});
                Ok::<_, std::convert::Infallible>(finish_with(res, clock))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.header_read_timeout(None).max_header_size(limits.max_header_bytes).keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut draining = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            reason = clock.expired(&limits) => {
                metrics.connection_closed(reason);
                tracing::debug!(reason = ?reason, "closing a connection on a limit");
                return;
            }
            _ = shutdown.cancelled(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The response, whose body tells the clock when it is done (fully sent,
/// or dropped because the connection went).
fn finish_with(res: Response, clock: Arc<Clock>) -> Response {
    let guard = RequestGuard(clock);
    res.map(|body| {
        Body::new(body.map_frame(move |frame| {
            // The closure owns the guard, so it lives as long as the body.
            let _owned = &guard;
            frame
        }))
    })
}

struct RequestGuard(Arc<Clock>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

/// Milliseconds since the clock's start; `UNSET` for "no such moment".
const UNSET: u64 = u64::MAX;

/// What a connection's deadlines are computed from.
struct Clock {
    start: Instant,
    /// Last successful read or write.
    last_io: AtomicU64,
    /// First byte of a request head that has not been handed to the
    /// router yet.
    head_started: AtomicU64,
    /// Requests handed to the router whose answers are not done.
    in_flight: AtomicUsize,
    /// Requests handed to the router so far.
    served: AtomicU64,
    /// Wakes the watchdog when a deadline may have moved earlier.
    moved: Notify,
}

impl Clock {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_io: AtomicU64::new(0),
            head_started: AtomicU64::new(UNSET),
            in_flight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            moved: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(UNSET - 1)
    }

    fn at(&self, ms: u64, after: Duration) -> Instant {
        self.start + Duration::from_millis(ms) + after
    }

    fn on_io(&self, read: bool) {
        let now = self.now();
        self.last_io.store(now, Ordering::Relaxed);
        if read
            && self.in_flight.load(Ordering::Acquire) == 0
            && self.head_started.compare_exchange(UNSET, now, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            self.moved.notify_one();
        }
    }

    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.served.fetch_add(1, Ordering::Relaxed);
        // The deadline only moves later (a stall is judged more leniently
        // than a silence): the watchdog finds out when its timer fires.
        self.head_started.store(UNSET, Ordering::Release);
    }

    fn request_finished(&self) {
        self.last_io.store(self.now(), Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.moved.notify_one();
    }

    /// When the connection must close, and why.
    fn deadline(&self, limits: &Limits) -> (Instant, CloseReason) {
        let last_io = self.last_io.load(Ordering::Relaxed);
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return (self.at(last_io, limits.stall_timeout), CloseReason::Stalled);
        }
        match self.head_started.load(Ordering::Acquire) {
            UNSET if self.served.load(Ordering::Relaxed) == 0 => {
                (self.at(0, limits.header_read_timeout), CloseReason::HeaderTimeout)
            }
            UNSET => (self.at(last_io, limits.idle_timeout), CloseReason::IdleTimeout),
            started => (self.at(started, limits.header_read_timeout), CloseReason::HeaderTimeout),
        }
    }

    /// Resolves once the deadline has passed with nothing moving it.
    ///
    /// One timer for the connection's life, moved only when the deadline
    /// moves earlier (a head starts, an answer ends); when the deadline
    /// moved later meanwhile (a request started, bytes moved), the timer
    /// fires early, finds the new deadline and waits again. A request thus
    /// costs at most one timer change instead of one per state change.
    async fn expired(&self, limits: &Limits) -> CloseReason {
        let timer = tokio::time::sleep_until(self.deadline(limits).0);
        tokio::pin!(timer);
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            let (at, _) = self.deadline(limits);
            if at < timer.deadline() {
                timer.as_mut().reset(at);
            }
            tokio::select! {
                () = timer.as_mut() => {
                    let (at, reason) = self.deadline(limits);
                    if at <= Instant::now() {
                        return reason;
                    }
                    timer.as_mut().reset(at);
                }
                () = moved => {}
            }
        }
    }
}

/// A socket that reports its reads and writes to the connection's clock.
struct Watched<S> {
    inner: S,
    clock: Arc<Clock>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.on_io(true);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.clock.on_io(false);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.clock.on_io(false);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_connections: 1,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            stall_timeout: Duration::from_secs(65),
            max_header_bytes: 8192,
        }
    }

    #[test]
    fn an_answer_is_in_flight_until_its_body_is_gone() {
        let clock = Arc::new(Clock::new());
        clock.request_started();
        let res = finish_with(Response::new(Body::from("streamed")), Arc::clone(&clock));
        assert_eq!(clock.in_flight.load(Ordering::Acquire), 1, "the body is still to be sent");
        drop(res);
        assert_eq!(clock.in_flight.load(Ordering::Acquire), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_new_connection_gets_the_header_timeout() {
        let clock = Clock::new();
        let started = Instant::now();
        assert_eq!(clock.expired(&limits()).await, CloseReason::HeaderTimeout);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_must_arrive_within_the_timeout_of_its_first_byte() {
        let clock = Arc::new(Clock::new());
        clock.request_started();
        tokio::time::advance(Duration::from_secs(1)).await;
        clock.request_finished();
        tokio::time::advance(Duration::from_secs(30)).await;
        clock.on_io(true);
        let started = Instant::now();
        // Later bytes of the same head (a slowloris) do not buy time.
        let trickle = {
            let clock = Arc::clone(&clock);
            tokio::spawn(async move {
                for _ in 0..5 {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    clock.on_io(true);
                }
            })
        };
        assert_eq!(clock.expired(&limits()).await, CloseReason::HeaderTimeout);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        trickle.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_alive_connection_closes_after_the_idle_timeout() {
        let clock = Clock::new();
        clock.request_started();
        clock.request_finished();
        let started = Instant::now();
        assert_eq!(clock.expired(&limits()).await, CloseReason::IdleTimeout);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_holds_the_connection_while_bytes_move() {
        let clock = Arc::new(Clock::new());
        clock.request_started();
        let writer = {
            let clock = Arc::clone(&clock);
            tokio::spawn(async move {
                for _ in 0..10 {
                    tokio::time::sleep(Duration::from_secs(15)).await;
                    clock.on_io(false);
                }
            })
        };
        let started = Instant::now();
        assert_eq!(clock.expired(&limits()).await, CloseReason::Stalled);
        // Ten writes 15 s apart, then 65 s of silence.
        assert_eq!(started.elapsed(), Duration::from_secs(150 + 65));
        writer.await.unwrap();
    }
}
