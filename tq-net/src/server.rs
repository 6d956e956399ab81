//! The server loop: accept connections, run the handshake, read requests, call the [`Handler`]
//! concurrently, write the answers.
//!
//! Isolation is the point of most of this file. Each connection is served by its own task, so a
//! peer that sends garbage, stalls mid-message, claims a huge body or never finishes its handshake
//! affects only its own connection: it is closed (and logged with the peer address), and every
//! other connection keeps being served. Within a connection, requests are handled concurrently
//! (up to `max_in_flight_per_connection`) and answered in completion order; a [`Writer`] per
//! connection serializes the answers.
//!
//! Latency of small requests is the other concern: most of the time of a small round trip goes to
//! hand-offs between tasks, not to bytes. A small request is therefore first polled right in the
//! connection task, and if it completes without waiting (the usual case for metadata operations
//! and small puts and gets) its answer is written from there at once. Only a request that has to
//! wait, or a large one, gets its own task.

use crate::error::WireError;
use crate::frame::{read_traced, Encoded, FrameError, Limits, Message, MessageKind};
use crate::handshake::{self, Refusal};
use crate::stream::{Outgoing, Stream, Writer};
use crate::Endpoint;
use async_trait::async_trait;
use std::future::Future;
use std::os::unix::fs::FileTypeExt;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tq_core::{Error, Result};
use tracing::{debug, info, warn, Instrument};

/// Answers requests. Implemented by the controller and storage-unit servers.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Answers one request. Called concurrently for requests of one connection (answers may go
    /// out in any order).
    ///
    /// An `Err` is sent to the caller as an error response and arrives there as the same
    /// `ErrorKind` and message. A request the handler does not understand (undecodable header,
    /// unknown operation) should be answered with `Corrupted`/`Invalid`; the connection stays
    /// open either way.
    async fn handle(&self, request: Message) -> Result<Message>;
}

/// How a [`Server`] behaves.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// What a client may send in one message.
    pub limits: Limits,
    /// When set, clients must present this token in the handshake (required off loopback).
    pub token: Option<String>,
    /// Name for logs and the handshake greeting (`"controller"`, `"storage-unit-3"`).
    pub name: String,
    /// A connection that has not completed its handshake within this time is closed, so idle or
    /// garbage connections cannot hold a task forever. Default 5 s.
    pub handshake_timeout: Duration,
    /// Requests of one connection handled at once; the connection is not read further until one
    /// finishes and its answer is written (back-pressure). Default 256.
    pub max_in_flight_per_connection: usize,
    /// How long [`Server::shutdown`] waits for in-flight handlers and their answers. Default 5 s.
    pub shutdown_timeout: Duration,
    /// After each request, a connection stays awake this long for the next one before it
    /// sleeps (a thread woken from sleep costs 40–120 µs on a VM; see decision 0046).
    /// `Duration::ZERO` sleeps at once. Default 200 µs.
    pub stay_awake: Duration,
}

/// The default of [`ServerConfig::stay_awake`].
pub const DEFAULT_STAY_AWAKE: Duration = Duration::from_micros(200);

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            limits: Limits::default(),
            token: None,
            name: "tq".to_owned(),
            handshake_timeout: Duration::from_secs(5),
            max_in_flight_per_connection: 256,
            shutdown_timeout: Duration::from_secs(5),
            stay_awake: DEFAULT_STAY_AWAKE,
        }
    }
}

/// Counters, for tests and monitoring.
#[derive(Debug, Default)]
struct Stats {
    accepted: AtomicU64,
    open: AtomicUsize,
}

/// The open connections of a [`Server`], readable after the server is gone (then 0).
#[derive(Debug, Clone)]
pub struct ConnectionCount(Arc<Stats>);

impl ConnectionCount {
    /// Connections currently open.
    pub fn open(&self) -> usize {
        self.0.open.load(Ordering::Relaxed)
    }
}

/// Everything a connection task needs.
struct Shared {
    config: ServerConfig,
    handler: Arc<dyn Handler>,
    endpoint: Endpoint,
    stats: Arc<Stats>,
}

/// A running server. Dropping it stops accepting and closes connections without waiting;
/// [`Server::shutdown`] does the same but waits for in-flight requests to be answered.
pub struct Server {
    endpoint: Endpoint,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    accept_task: Option<JoinHandle<()>>,
    unix_path: Option<PathBuf>,
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    /// Accepts one connection; returns the stream and a description of the peer for logs.
    async fn accept(&self) -> std::io::Result<(Stream, String)> {
        match self {
            Listener::Tcp(l) => {
                let (s, addr) = l.accept().await?;
                Ok((Stream::tcp(s)?, format!("tcp://{addr}")))
            }
            Listener::Unix(l) => {
                let (s, _addr) = l.accept().await?;
                // Unix peers are usually unnamed; the credentials say who it is.
                let who = match s.peer_cred() {
                    Ok(c) => format!(
                        "unix peer (pid {}, uid {})",
                        c.pid().map_or("?".to_owned(), |p| p.to_string()),
                        c.uid()
                    ),
                    Err(_) => "unix peer".to_owned(),
                };
                Ok((Stream::Unix(s), who))
            }
        }
    }
}

impl Server {
    /// Binds (port 0 allowed) and starts serving in background tasks.
    ///
    /// A Unix socket path left behind by a dead server is removed first; a path that a live
    /// server still answers on, or that is not a socket, is an error.
    pub async fn bind(
        endpoint: &Endpoint,
        config: ServerConfig,
        handler: Arc<dyn Handler>,
    ) -> Result<Server> {
        let cannot = |e: std::io::Error| {
            Error::unavailable(format!(
                "server `{}`: cannot listen on {endpoint}: {e}",
                config.name
            ))
            .with_source(e)
        };
        let (listener, local, unix_path) = match endpoint {
            Endpoint::Tcp(addr) => {
                let l = TcpListener::bind(addr.as_str()).await.map_err(cannot)?;
                let local = l.local_addr().map_err(cannot)?;
                (Listener::Tcp(l), Endpoint::Tcp(local.to_string()), None)
            }
            Endpoint::Unix(path) => {
                remove_stale_socket(endpoint, path).await?;
                let l = UnixListener::bind(path).map_err(cannot)?;
                (Listener::Unix(l), endpoint.clone(), Some(path.clone()))
            }
        };
        let (stop, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            config,
            handler,
            endpoint: local.clone(),
            stats: Arc::default(),
        });
        info!(server = %shared.config.name, endpoint = %local, "listening");
        let accept_task = tokio::spawn(accept_loop(listener, shared.clone(), stop_rx));
        Ok(Server {
            endpoint: local,
            shared,
            stop,
            accept_task: Some(accept_task),
            unix_path,
        })
    }

    /// The endpoint clients should use (with the real port when bound to port 0).
    pub fn local_endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Connections accepted since the server started (including refused ones).
    pub fn connections_accepted(&self) -> u64 {
        self.shared.stats.accepted.load(Ordering::Relaxed)
    }

    /// Connections currently open (handshaking or serving).
    pub fn open_connections(&self) -> usize {
        self.shared.stats.open.load(Ordering::Relaxed)
    }

    /// A handle on the open-connection count that a handler may keep (a status request
    /// reports it) without holding the server.
    pub fn connection_count(&self) -> ConnectionCount {
        ConnectionCount(self.shared.stats.clone())
    }

    /// Stops accepting, closes connections, waits for in-flight handlers (bounded by
    /// `shutdown_timeout`), removes a unix socket file.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.accept_task.take() {
            if let Err(e) = task.await {
                warn!(server = %self.shared.config.name, "accept task failed: {e}");
            }
        }
        self.remove_socket_file();
        info!(server = %self.shared.config.name, endpoint = %self.endpoint, "stopped");
    }

    fn remove_socket_file(&mut self) {
        if let Some(path) = self.unix_path.take() {
            if let Err(e) = std::fs::remove_file(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    warn!(endpoint = %self.endpoint, "cannot remove socket file: {e}");
                }
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The connection tasks watch this signal (and also see it when the sender is dropped).
        let _ = self.stop.send(true);
        self.remove_socket_file();
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.shared.config.name)
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

/// Removes a socket file left by a server that is gone; refuses to touch a live one or a
/// non-socket file.
async fn remove_stale_socket(endpoint: &Endpoint, path: &std::path::Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(_) => return Ok(()),
    };
    if !meta.file_type().is_socket() {
        return Err(Error::invalid(format!(
            "cannot listen on {endpoint}: the path exists and is not a socket"
        )));
    }
    if UnixStream::connect(path).await.is_ok() {
        return Err(Error::unavailable(format!(
            "cannot listen on {endpoint}: another server is listening there"
        )));
    }
    debug!(%endpoint, "removing stale socket file");
    std::fs::remove_file(path).map_err(|e| {
        Error::unavailable(format!(
            "cannot listen on {endpoint}: cannot remove the stale socket file: {e}"
        ))
    })
}

/// Resolves when the server is told to stop, or when the `Server` is dropped.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn accept_loop(listener: Listener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    shared.stats.accepted.fetch_add(1, Ordering::Relaxed);
                    connections.spawn(serve_connection(stream, peer, shared.clone(), stop.clone()));
                }
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    warn!(server = %shared.config.name, endpoint = %shared.endpoint, "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    drop(listener);
    // Every connection saw the same signal and is finishing its in-flight requests within
    // shutdown_timeout; give them that plus a margin, then cut the rest off.
    let grace = shared.config.shutdown_timeout + Duration::from_secs(1);
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, drain).await.is_err() {
        warn!(server = %shared.config.name, "connections still busy after {grace:?}; aborting them");
        connections.shutdown().await;
    }
}

/// Decrements the open-connection count however the connection task ends.
struct OpenGuard<'a>(&'a Stats);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn serve_connection(
    mut stream: Stream,
    peer: String,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    shared.stats.open.fetch_add(1, Ordering::Relaxed);
    let _open = OpenGuard(&shared.stats);
    let config = &shared.config;
    let name = &config.name;

    let token = config.token.as_deref().map(str::as_bytes);
    let handshake = tokio::time::timeout(
        config.handshake_timeout,
        handshake::server(&mut stream, token, name),
    );
    let outcome = tokio::select! {
        _ = stopped(&mut stop) => return,
        outcome = handshake => outcome,
    };
    match outcome {
        Ok(Ok(())) => debug!(server = %name, %peer, "connection accepted"),
        Ok(Err(refusal @ (Refusal::VersionMismatch(_) | Refusal::Unauthorized(_)))) => {
            warn!(server = %name, %peer, "refused connection: {refusal}");
            return;
        }
        Ok(Err(Refusal::Silent)) => {
            debug!(server = %name, %peer, "closed by the peer before the handshake");
            return;
        }
        Ok(Err(refusal @ Refusal::Garbage(_))) => {
            warn!(server = %name, %peer, "closing connection: {refusal}");
            return;
        }
        Err(_) => {
            warn!(server = %name, %peer, "closing connection: no handshake within {:?}", config.handshake_timeout);
            return;
        }
    }

    let (mut reader, writer) = stream.into_split();
    let writer = Writer::new(writer);
    let mut writer_task = tokio::spawn(writer.clone().run());
    let mut writer_done = false;
    let max_in_flight = config
        .max_in_flight_per_connection
        .clamp(1, Semaphore::MAX_PERMITS);
    let in_flight = Arc::new(Semaphore::new(max_in_flight));
    let mut handlers = JoinSet::new();
    // Whether the last request came within the stay-awake window of the wait before it: only a
    // connection whose requests follow each other that closely stays awake for the next one
    // (a conversation of small calls); one fed by bulk transfers or idle between calls sleeps
    // at once and leaves the cores to the work (decision 0046).
    let mut quick_peer = false;

    loop {
        // Back-pressure: do not read another request while the connection is at its limit.
        let permit = tokio::select! {
            _ = stopped(&mut stop) => break,
            Some(_) = handlers.join_next(), if !handlers.is_empty() => continue,
            permit = in_flight.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let window = if quick_peer {
            config.stay_awake
        } else {
            Duration::ZERO
        };
        let waiting_since = std::time::Instant::now();
        let read = tokio::select! {
            _ = stopped(&mut stop) => break,
            written = &mut writer_task, if !writer_done => {
                writer_done = true;
                match written {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => debug!(server = %name, %peer, "write failed, closing: {e}"),
                    Err(e) => warn!(server = %name, %peer, "writer task failed: {e}"),
                }
                break;
            }
            read = crate::awake::awake_for(read_traced(&mut reader, &config.limits), window) => read,
        };
        quick_peer = waiting_since.elapsed() <= config.stay_awake;
        let (id, kind, trace, request) = match read {
            Ok(Some(m)) => m,
            Ok(None) => {
                debug!(server = %name, %peer, "connection closed by peer");
                break;
            }
            Err(FrameError::Io(e)) => {
                debug!(server = %name, %peer, "connection failed: {e}");
                break;
            }
            Err(e) => {
                warn!(server = %name, %peer, "closing connection: {e}");
                break;
            }
        };
        if kind != MessageKind::Request {
            // Well framed but not something a server answers: say so, keep the connection.
            let error = Error::invalid(format!(
                "server `{name}` expects requests (kind 0), got a message of kind {}",
                kind as u8
            ));
            let _ = writer.send(Outgoing {
                encoded: error_response(id, &error),
                permit: Some(permit),
            });
            continue;
        }
        let mut answer = Answer {
            writer: writer.clone(),
            id,
            permit: Some(permit),
        };
        let small = request.header.len() as u64 + request.body_len() <= INLINE_REQUEST_BYTES;
        let handler = shared.handler.clone();
        // The handler runs under the request's trace id (its own outgoing requests carry it
        // on) and inside a span naming it, so every log line it writes can be correlated with
        // the client operation that caused it.
        let trace = if trace == 0 {
            tq_core::telemetry::new_trace_id()
        } else {
            trace
        };
        let span =
            tracing::info_span!("request", server = %name, trace = %format_args!("{trace:08x}"));
        let mut work: Pin<Box<dyn Future<Output = Result<Message>> + Send>> = Box::pin(
            tq_core::telemetry::with_trace_id(trace, async move { handler.handle(request).await })
                .instrument(span),
        );
        if small {
            match poll_once(work.as_mut()).await {
                Ok(Poll::Ready(result)) => {
                    answer.send(result);
                    continue;
                }
                Ok(Poll::Pending) => {}
                Err(_panic) => {
                    answer.send(Err(Error::internal("the request handler panicked")));
                    continue;
                }
            }
        }
        // The handler has to wait (or the request is large): give it its own task, so the
        // connection keeps reading and other requests are not held up. The future is boxed, so
        // moving it after the first poll is fine.
        handlers.spawn(async move {
            let result = work.await;
            answer.send(result);
        });
    }

    // Stop reading; let in-flight handlers finish and their answers go out, within the grace
    // period, then close.
    drop(reader);
    if !writer_done {
        let finish = async {
            while handlers.join_next().await.is_some() {}
            writer.close();
            let _ = (&mut writer_task).await;
        };
        if tokio::time::timeout(config.shutdown_timeout, finish)
            .await
            .is_err()
        {
            debug!(server = %name, %peer, "in-flight requests unanswered after {:?}; closing", config.shutdown_timeout);
            writer_task.abort();
        }
    }
    handlers.shutdown().await;
}

/// Requests up to this size (header and frames) are polled once in the connection task before
/// being given a task of their own (see the module documentation). Larger ones usually mean real
/// work (copying megabytes), which should not delay reading the connection's next request.
const INLINE_REQUEST_BYTES: u64 = 64 << 10;

/// Polls `work` once with the connection task's context. A panic in the handler is caught (and
/// answered as one) instead of unwinding through the connection task and dropping every other
/// request of the connection.
///
/// If `work` is pending it may have registered this task's waker; the task it is then moved to
/// polls it again at once and registers its own, so at worst this task is woken once for nothing.
async fn poll_once<F: Future + ?Sized>(
    mut work: Pin<&mut F>,
) -> std::thread::Result<Poll<F::Output>> {
    std::future::poll_fn(|cx| {
        Poll::Ready(std::panic::catch_unwind(AssertUnwindSafe(|| {
            work.as_mut().poll(cx)
        })))
    })
    .await
}

/// Longest error message sent back; longer ones are cut (on a char boundary). Keeps error
/// responses small and their encoding infallible.
const MAX_ERROR_MESSAGE: usize = 64 << 10;

/// Encodes an error response carrying `error`.
fn error_response(id: u64, error: &Error) -> Encoded {
    let mut wire = WireError::from_error(error);
    if wire.message.len() > MAX_ERROR_MESSAGE {
        let mut end = MAX_ERROR_MESSAGE;
        while !wire.message.is_char_boundary(end) {
            end -= 1;
        }
        wire.message.truncate(end);
        wire.message.push_str(" [...]");
    }
    // Serializing a struct of strings into a Vec cannot fail.
    let header = postcard::to_allocvec(&wire).unwrap_or_default();
    Encoded::small(id, MessageKind::Error, header.into())
}

/// The answer of one request, owed by its handler task. If the task ends without answering
/// (the handler panicked, or shutdown aborted it), dropping this sends an `Internal` error, so a
/// caller is never left waiting for its deadline because of a server bug.
struct Answer {
    writer: Arc<Writer>,
    id: u64,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Answer {
    fn send(&mut self, result: Result<Message>) {
        let encoded = match result {
            Ok(message) => match Encoded::new(self.id, MessageKind::Response, message, None) {
                Ok(e) => e,
                Err(e) => error_response(
                    self.id,
                    &Error::internal(format!(
                        "the handler's answer cannot be sent: {}",
                        e.message()
                    )),
                ),
            },
            Err(e) => error_response(self.id, &e),
        };
        let _ = self.writer.send(Outgoing {
            encoded,
            permit: self.permit.take(),
        });
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if self.permit.is_some() {
            let why = if std::thread::panicking() {
                "the request handler panicked"
            } else {
                "the request handler was cancelled (server shutting down)"
            };
            self.send(Err(Error::internal(why)));
        }
    }
}
