//! The client side: multiplexed connections and the per-process connection [`Pool`].
//!
//! A connection carries many requests at once. Each request gets an id unique on its connection;
//! a reader task matches answers to waiting callers by id. A caller writes its request itself
//! when the socket is free (see [`Writer`]), otherwise the connection's writer task writes it in
//! order. So callers never wait on each other: a slow request does not hold up a later one, and a
//! caller that gives up (deadline) leaves the connection intact for the others.
//!
//! When a connection breaks, its reader fails every pending request at once (nobody waits for a
//! deadline on a dead socket) and the pool forgets it; the next call connects again, which is how
//! clients recover when a server comes back.

use crate::error::WireError;
use crate::frame::{read_body, read_head, Encoded, Limits, Message, MessageKind};
use crate::handshake::{self, ClientFailure};
use crate::stream::{BoxRead, Outgoing, Stream, Writer};
use crate::Endpoint;
use bytes::BytesMut;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tq_core::{Error, ErrorKind, Result, Retry};
use tracing::{debug, warn};

/// How a [`Pool`] connects and waits.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// What a server may send back in one message (and what this client refuses to send).
    pub limits: Limits,
    /// Presented in every handshake; servers off loopback require it.
    pub token: Option<String>,
    /// Longest wait for a TCP/Unix connect plus handshake. Default 5 s.
    pub connect_timeout: Duration,
    /// Default deadline of one request attempt ([`CallOptions::timeout`] overrides). Default 30 s.
    pub request_timeout: Duration,
    /// Connections kept per peer. More than one lets large transfers to one peer proceed on
    /// several sockets; a new one is opened only while every existing one is busy. Default 2.
    pub connections_per_peer: usize,
    /// How requests are repeated after transport failures (see [`RetryConfig`]).
    pub retry: RetryConfig,
}

/// How a [`Pool`] repeats a request after a transport failure (no connection, a lost one, no
/// answer in time) — the shape of object_store's `RetryConfig`: backoff with jitter under a
/// total deadline, on by default. Only what is safe is repeated: an idempotent request, or a
/// request that was not sent at all. The first retry goes out at once on a fresh connection;
/// each later one waits a backoff that doubles from `initial_backoff` up to `max_backoff`,
/// with jitter (half to all of it). Retries stop once `max_elapsed` has passed since the first
/// attempt, and never outlast the request's own deadline, so a dead peer still fails within
/// its timeout; an idempotent request is always retried at least once. Each retry is counted
/// in `tq_net_retries_total`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryConfig {
    /// Default 10 s: rides out a controller or unit restart.
    pub max_elapsed: Duration,
    /// Default 20 ms.
    pub initial_backoff: Duration,
    /// Default 1 s.
    pub max_backoff: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_elapsed: Duration::from_secs(10),
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(1),
        }
    }
}

impl RetryConfig {
    /// No retry beyond the one an idempotent request always gets.
    pub fn once() -> Self {
        RetryConfig {
            max_elapsed: Duration::ZERO,
            ..RetryConfig::default()
        }
    }

    /// `backoff` with jitter: a uniformly drawn point between half of it and all of it.
    fn jittered(backoff: Duration) -> Duration {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(backoff.as_nanos() as u64);
        let unit = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
        backoff.mul_f64(0.5 + 0.5 * unit)
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            limits: Limits::default(),
            token: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            connections_per_peer: 2,
            retry: RetryConfig::default(),
        }
    }
}

/// Per-call choices.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// Deadline of one attempt; `None` uses [`ClientConfig::request_timeout`].
    pub timeout: Option<Duration>,
    /// True when applying the request twice has the same effect as once (get, put of the same
    /// generation, clear). Only such requests are retried after a lost connection or a passed
    /// deadline; for the others the outcome is then unknown and the caller is told so.
    pub idempotent: bool,
}

impl CallOptions {
    /// Options for an idempotent request (retried on fresh connections, see [`RetryConfig`]).
    pub fn idempotent() -> Self {
        CallOptions {
            timeout: None,
            idempotent: true,
        }
    }

    /// Options for a request that must not be repeated (never retried).
    pub fn once() -> Self {
        CallOptions::default()
    }

    /// Sets the per-attempt deadline.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// Buffers that the frames of one answer are read into directly, instead of into the
/// connection's receive buffer (see [`Pool::call_into`]). Index `i` is for frame `i`.
///
/// The reader of the connection that receives the answer takes them for the time it reads and
/// hands them back with the answer (or back here if the read fails, so a retry can use them).
#[derive(Debug, Default)]
struct FrameSinks {
    buffers: Mutex<Option<Vec<Option<BytesMut>>>>,
}

impl FrameSinks {
    fn take(&self) -> Option<Vec<Option<BytesMut>>> {
        self.buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    fn put_back(&self, buffers: Vec<Option<BytesMut>>) {
        *self.buffers.lock().unwrap_or_else(|p| p.into_inner()) = Some(buffers);
    }
}

/// An answer read partly into caller buffers ([`Pool::call_into`]).
#[derive(Debug)]
pub struct PlacedAnswer {
    /// The answer; a frame that went to a caller buffer is empty here.
    pub message: Message,
    /// The caller's buffers, index for index. `Some` means the frame's bytes are in it;
    /// `None` means the frame is in `message` (the buffer did not fit the frame, or this answer
    /// came on an attempt that could not use the buffers).
    pub placed: Vec<Option<BytesMut>>,
}

/// What a waiting caller receives from its connection's reader.
enum Reply {
    Answer(Message, Option<Vec<Option<BytesMut>>>),
    Remote(Error),
    Lost(String),
}

/// Pending requests of one connection, and whether it is still usable. One lock covers both so
/// that a request is either registered before the connection fails (and then failed by it) or
/// refused registration: no request can slip in unnoticed after the failure.
#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, Waiter>,
    closed: Option<String>,
}

/// A caller waiting for an answer, and where the answer's frames should go.
struct Waiter {
    answer: oneshot::Sender<Reply>,
    sinks: Option<Arc<FrameSinks>>,
}

#[derive(Default)]
struct ConnState {
    pending: Mutex<Pending>,
    in_flight: AtomicUsize,
}

impl ConnState {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // A panic while holding this lock leaves the map consistent (single inserts/removes).
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the connection dead and fails every pending request with `reason`.
    fn fail(&self, reason: String) {
        let mut pending = self.lock();
        if pending.closed.is_none() {
            pending.closed = Some(reason.clone());
        }
        for (_, waiter) in pending.waiting.drain() {
            let _ = waiter.answer.send(Reply::Lost(reason.clone()));
        }
    }

    fn is_closed(&self) -> bool {
        self.lock().closed.is_some()
    }
}

/// Kind and text of a transport failure, and whether the request had been sent.
fn summary(peer: &Endpoint, failure: &Failure, timeout: Duration) -> (ErrorKind, String, bool) {
    match failure {
        Failure::Final(e) | Failure::Remote(e) => (e.kind().clone(), e.message().to_owned(), true),
        Failure::Connect(e) => (e.kind().clone(), e.message().to_owned(), false),
        Failure::ConnectTimeout => (
            ErrorKind::Timeout,
            format!("peer {peer}: no connection within the request deadline of {timeout:?}"),
            false,
        ),
        Failure::Lost(reason) => (
            ErrorKind::Unavailable,
            format!("peer {peer}: connection lost ({reason})"),
            true,
        ),
        Failure::NoAnswer => (
            ErrorKind::Timeout,
            format!("peer {peer}: no answer within {timeout:?}"),
            true,
        ),
    }
}

/// The error of a request whose last attempt failed with `kind` / `text` (`sent`: it may have
/// reached the peer), after `retries` retries that followed a first failure `first`.
fn retry_failed(
    kind: ErrorKind,
    text: String,
    sent: bool,
    idempotent: bool,
    retries: u32,
    first: Option<String>,
) -> Error {
    let retried = match (retries, first) {
        (0, _) | (_, None) => String::new(),
        (1, Some(first)) => format!("; retried once on a fresh connection after: {first}"),
        (n, Some(first)) => format!("; retried {n} times on fresh connections after: {first}"),
    };
    if idempotent {
        // Repeating it later is safe whatever happened.
        return Error::new(kind, format!("{text}{retried}")).with_retry(Retry::Safe);
    }
    let (note, retry) = if sent {
        (
            "; the outcome of this request is unknown: it may or may not have been applied",
            Retry::OutcomeUnknown,
        )
    } else {
        ("; the request was not sent", Retry::Safe)
    };
    Error::new(kind, format!("{text}{retried}{note}")).with_retry(retry)
}

/// One multiplexed connection to a peer.
struct Connection {
    /// Pool-wide number, for logs.
    number: u64,
    peer: Endpoint,
    state: Arc<ConnState>,
    writer: Arc<Writer>,
    next_request: AtomicU64,
    reader: JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        // The writer task ends once what is queued is written; dropping the socket's write half
        // then shuts the write direction down.
        self.writer.close();
        self.reader.abort();
    }
}

/// Removes a request from its connection's pending map when its caller stops waiting (answered,
/// timed out, cancelled), so late answers are dropped and nothing accumulates.
struct PendingGuard {
    state: Arc<ConnState>,
    id: u64,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.state.lock().waiting.remove(&self.id);
        self.state.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a failed attempt in the per-peer transport metrics (`tq_net_timeouts_total` for a
/// connect or answer deadline, `tq_net_connection_failures_total` for a lost or refused
/// connection). Rare events, so the handle is looked up by name each time.
fn note_failure(peer: &Endpoint, failure: &Failure) {
    let name = match failure {
        Failure::ConnectTimeout | Failure::NoAnswer => "tq_net_timeouts_total",
        Failure::Final(_) | Failure::Remote(_) => return,
        _ => "tq_net_connection_failures_total",
    };
    metrics::counter!(name, "peer" => peer.to_string()).increment(1);
}

/// Why one attempt failed; decides between retrying and reporting.
enum Failure {
    /// Not a transport problem (an invalid request, a refused handshake): reported as is.
    Final(Error),
    /// The server answered with an error: reported as is, never retried.
    Remote(Error),
    /// No connection could be made; the request was not sent.
    Connect(Error),
    /// The deadline passed while connecting; the request was not sent.
    ConnectTimeout,
    /// The request went out (or may have), then the connection broke.
    Lost(String),
    /// The request went out and no answer came before the deadline.
    NoAnswer,
}

impl Connection {
    fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::Relaxed)
    }

    /// Registers and sends (or queues) a request. `SendError::Dead` when the connection is already dead:
    /// nothing was sent, so the caller may use another connection.
    fn send(
        &self,
        request: Message,
        limits: &Limits,
        sinks: Option<Arc<FrameSinks>>,
    ) -> std::result::Result<(PendingGuard, oneshot::Receiver<Reply>), SendError> {
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let encoded = Encoded::new(id, MessageKind::Request, request, Some(limits))
            .map_err(|e| SendError::Invalid(e.context(format!("request to {}", self.peer))))?
            .with_trace(tq_core::telemetry::current_or_new_trace_id());
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.state.lock();
            if let Some(reason) = &pending.closed {
                return Err(SendError::Dead(reason.clone()));
            }
            pending.waiting.insert(id, Waiter { answer: tx, sinks });
        }
        self.state.in_flight.fetch_add(1, Ordering::Relaxed);
        let guard = PendingGuard {
            state: self.state.clone(),
            id,
        };
        // Registered before writing: the answer may arrive before `send` returns.
        if self
            .writer
            .send(Outgoing {
                encoded,
                permit: None,
            })
            .is_err()
        {
            return Err(SendError::Dead(
                "the connection's writer has stopped".into(),
            ));
        }
        Ok((guard, rx))
    }
}

enum SendError {
    Invalid(Error),
    Dead(String),
}

/// Reads answers and hands each to the caller waiting for its id; on any failure, fails every
/// pending request of the connection at once.
async fn reader_loop(mut reader: BoxRead, state: Arc<ConnState>, limits: Limits, peer: Endpoint) {
    let reason = loop {
        let head = match read_head(&mut reader, &limits).await {
            Ok(Some(h)) => h,
            Ok(None) => break "closed by the peer".to_owned(),
            Err(e) => {
                debug!(%peer, "connection failed: {e}");
                break e.to_string();
            }
        };
        let id = head.request_id;
        // A successful answer may go (partly) into the caller's buffers, if it left any.
        let sinks = match head.kind {
            MessageKind::Response => state.lock().waiting.get(&id).and_then(|w| w.sinks.clone()),
            _ => None,
        };
        let mut placed = sinks.as_ref().and_then(|s| s.take());
        let read = read_body(&mut reader, &head, placed.as_deref_mut().unwrap_or(&mut [])).await;
        let message = match read {
            Ok(m) => m,
            Err(e) => {
                if let (Some(sinks), Some(buffers)) = (&sinks, placed) {
                    sinks.put_back(buffers);
                }
                debug!(%peer, "connection failed: {e}");
                break e.to_string();
            }
        };
        let reply = match head.kind {
            MessageKind::Response => Reply::Answer(message, placed),
            MessageKind::Error => match message.decode::<WireError>() {
                Ok(wire) => Reply::Remote(wire.into_error()),
                Err(e) => Reply::Remote(Error::corrupted(format!(
                    "peer {peer} sent an undecodable error response: {}",
                    e.message()
                ))),
            },
            MessageKind::Request => {
                warn!(%peer, "peer sent a request on a client connection; closing it");
                break "protocol violation: the peer sent a request to a client".to_owned();
            }
        };
        let waiter = state.lock().waiting.remove(&id);
        match waiter {
            Some(w) => {
                if let Err(Reply::Answer(_, Some(buffers))) = w.answer.send(reply) {
                    // The caller gave up between our lookup and now: its buffers go back, so
                    // a retry can still use them.
                    if let Some(sinks) = &w.sinks {
                        sinks.put_back(buffers);
                    }
                }
            }
            None => {
                if let (Reply::Answer(_, Some(buffers)), Some(sinks)) = (reply, &sinks) {
                    sinks.put_back(buffers);
                }
                debug!(%peer, "answer to request {id} arrived after its caller gave up");
            }
        }
    };
    state.fail(reason);
}

/// Connections to one peer.
#[derive(Default)]
struct PeerSlot {
    connections: Vec<Arc<Connection>>,
    /// Connects in progress beyond the first (so concurrent callers do not overshoot the limit).
    connecting: usize,
    /// Serializes the connect when a peer has no connection at all, so a burst of first calls
    /// makes one connection instead of one each.
    first_connect: Arc<tokio::sync::Mutex<()>>,
    /// Number of such first connects attempted, and how the last one failed (if it did).
    /// Callers that queued behind a failed attempt share its failure instead of each trying in
    /// turn: against an unreachable peer they all fail after one connect timeout, not N.
    first_attempts: u64,
    first_failure: Option<SharedFailure>,
}

/// A connect failure remembered for the callers that waited on it.
#[derive(Clone)]
struct SharedFailure {
    refused: bool,
    kind: ErrorKind,
    message: String,
}

impl SharedFailure {
    fn of(failure: &Failure) -> Option<SharedFailure> {
        let (refused, e) = match failure {
            Failure::Connect(e) => (false, e),
            Failure::Final(e) => (true, e),
            _ => return None,
        };
        Some(SharedFailure {
            refused,
            kind: e.kind().clone(),
            message: e.message().to_owned(),
        })
    }

    fn failure(self) -> Failure {
        // Nothing was sent: a connect failure is safe to retry; a refusal (wrong token or
        // protocol) keeps its kind's status (never).
        let e = Error::new(self.kind, self.message);
        let e = if self.refused {
            e
        } else {
            e.with_retry(Retry::Safe)
        };
        if self.refused {
            Failure::Final(e)
        } else {
            Failure::Connect(e)
        }
    }
}

struct PoolInner {
    config: ClientConfig,
    peers: Mutex<HashMap<Endpoint, PeerSlot>>,
    next_connection: AtomicU64,
}

/// Connections to every peer of a process, created on demand and reused. Cheap to clone: clones
/// share the connections.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// Undoes a `connecting += 1` however the connect ends (including cancellation).
struct ConnectingGuard<'a> {
    pool: &'a Pool,
    peer: &'a Endpoint,
}

impl Drop for ConnectingGuard<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.pool.peers().get_mut(self.peer) {
            slot.connecting = slot.connecting.saturating_sub(1);
        }
    }
}

enum Plan {
    Use(Arc<Connection>),
    Extra,
    First(Arc<tokio::sync::Mutex<()>>, u64),
}

impl Pool {
    /// A pool with no connections yet. Needs no runtime; connections are made by [`Pool::call`].
    pub fn new(config: ClientConfig) -> Pool {
        Pool {
            inner: Arc::new(PoolInner {
                config,
                peers: Mutex::new(HashMap::new()),
                next_connection: AtomicU64::new(1),
            }),
        }
    }

    /// The configuration this pool was made with.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// Live pooled connections to `peer` (for monitoring and tests).
    pub fn connection_count(&self, peer: &Endpoint) -> usize {
        self.peers().get(peer).map_or(0, |slot| {
            slot.connections
                .iter()
                .filter(|c| !c.state.is_closed())
                .count()
        })
    }

    fn peers(&self) -> MutexGuard<'_, HashMap<Endpoint, PeerSlot>> {
        self.inner.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends `request` to `peer` on a pooled connection (created on demand, reused, many
    /// requests in flight per connection, matched by request id) and waits for its answer.
    ///
    /// - An error response becomes the `tq_core::Error` it carries (same kind and message).
    /// - Connect failure, lost connection, passed deadline: an idempotent request, or one that
    ///   was not sent, is retried on fresh connections as [`RetryConfig`] says (each attempt has
    ///   the full timeout); any other is not, and its error says whether it was sent, i.e.
    ///   whether its outcome is unknown.
    /// - Failures are `Unavailable` (cannot connect, connection lost) or `Timeout`, and name the
    ///   peer.
    pub async fn call(
        &self,
        peer: &Endpoint,
        request: Message,
        options: CallOptions,
    ) -> Result<Message> {
        self.call_with(peer, request, options, None)
            .await
            .map(|(m, _)| m)
    }

    /// [`Pool::call`], reading the answer's frames straight into `buffers` where they fit:
    /// `buffers[i]`, if `Some` and exactly as long as frame `i`, receives that frame's bytes
    /// without a copy through the connection's receive buffer. This lets a caller assemble
    /// several answers into one final buffer (split it with `BytesMut::split_to`, hand out
    /// the pieces, `unsplit` them afterwards). See [`PlacedAnswer`] for what came where.
    pub async fn call_into(
        &self,
        peer: &Endpoint,
        request: Message,
        options: CallOptions,
        buffers: Vec<Option<BytesMut>>,
    ) -> Result<PlacedAnswer> {
        let sinks = Arc::new(FrameSinks::default());
        sinks.put_back(buffers);
        let (message, placed) = self.call_with(peer, request, options, Some(&sinks)).await?;
        Ok(PlacedAnswer {
            message,
            placed: placed.unwrap_or_default(),
        })
    }

    async fn call_with(
        &self,
        peer: &Endpoint,
        request: Message,
        options: CallOptions,
        sinks: Option<&Arc<FrameSinks>>,
    ) -> Result<(Message, Option<Vec<Option<BytesMut>>>)> {
        let timeout = options.timeout.unwrap_or(self.inner.config.request_timeout);
        let policy = &self.inner.config.retry;
        let started = Instant::now();
        let window = policy.max_elapsed.min(timeout);
        let mut backoff = policy.initial_backoff;
        let mut retries = 0u32;
        let mut first_text: Option<String> = None;
        loop {
            let failure = match self
                .attempt(peer, &request, timeout, retries > 0, sinks)
                .await
            {
                Ok(answer) => return Ok(answer),
                Err(Failure::Final(e) | Failure::Remote(e)) => return Err(e),
                Err(f) => f,
            };
            note_failure(peer, &failure);
            let (kind, text, sent) = summary(peer, &failure, timeout);
            // Safe to repeat: applying it twice is as once, or it never went out.
            let safe = options.idempotent || !sent;
            let pause = if retries == 0 {
                Duration::ZERO
            } else {
                RetryConfig::jittered(backoff)
            };
            let in_time =
                (retries == 0 && options.idempotent) || started.elapsed() + pause < window;
            if !safe || !in_time {
                return Err(retry_failed(
                    kind,
                    text,
                    sent,
                    options.idempotent,
                    retries,
                    first_text,
                ));
            }
            if retries > 0 {
                tokio::time::sleep(pause).await;
                backoff = (backoff * 2).min(policy.max_backoff);
            }
            debug!(%peer, retries, "repeating a request on a fresh connection after: {text}");
            metrics::counter!("tq_net_retries_total", "peer" => peer.to_string()).increment(1);
            first_text.get_or_insert(text);
            retries += 1;
        }
    }

    /// One attempt: get a connection (a new one when `fresh`), send, wait until the deadline.
    async fn attempt(
        &self,
        peer: &Endpoint,
        request: &Message,
        timeout: Duration,
        fresh: bool,
        sinks: Option<&Arc<FrameSinks>>,
    ) -> std::result::Result<(Message, Option<Vec<Option<BytesMut>>>), Failure> {
        let deadline = Instant::now() + timeout;
        let limits = &self.inner.config.limits;
        // A pooled connection may turn out dead when we try to use it: nothing was sent then,
        // so another connection may be used even for a non-idempotent request.
        let mut force_fresh = fresh;
        let mut last_dead = String::new();
        for _ in 0..3 {
            let acquire = self.acquire(peer, force_fresh);
            let connection = match tokio::time::timeout_at(deadline, acquire).await {
                Ok(Ok(c)) => c,
                Ok(Err(f)) => return Err(f),
                Err(_) => return Err(Failure::ConnectTimeout),
            };
            let (guard, answer) = match connection.send(request.clone(), limits, sinks.cloned()) {
                Ok(sent) => sent,
                Err(SendError::Invalid(e)) => return Err(Failure::Final(e)),
                Err(SendError::Dead(reason)) => {
                    self.forget(peer, &connection);
                    last_dead = reason;
                    force_fresh = true;
                    continue;
                }
            };
            let outcome = tokio::time::timeout_at(deadline, answer).await;
            drop(guard);
            return match outcome {
                Ok(Ok(Reply::Answer(m, placed))) => Ok((m, placed)),
                Ok(Ok(Reply::Remote(e))) => Err(Failure::Remote(e)),
                Ok(Ok(Reply::Lost(reason))) => {
                    self.forget(peer, &connection);
                    Err(Failure::Lost(reason))
                }
                Ok(Err(_)) => {
                    self.forget(peer, &connection);
                    Err(Failure::Lost("the connection was dropped".to_owned()))
                }
                Err(_) => {
                    // The connection may be healthy and the server merely slow, or it may be
                    // silently dead (peer machine gone). Stop giving it new requests; requests
                    // already on it keep their chance, and it closes when they are done.
                    self.forget(peer, &connection);
                    Err(Failure::NoAnswer)
                }
            };
        }
        Err(Failure::Lost(last_dead))
    }

    /// Removes `connection` from the pool (it stays alive while callers still wait on it).
    fn forget(&self, peer: &Endpoint, connection: &Arc<Connection>) {
        if let Some(slot) = self.peers().get_mut(peer) {
            slot.connections.retain(|c| !Arc::ptr_eq(c, connection));
        }
    }

    /// A connection to `peer`: the least busy pooled one, or a new one while all are busy and
    /// the pool has room (or when `fresh`).
    async fn acquire(
        &self,
        peer: &Endpoint,
        fresh: bool,
    ) -> std::result::Result<Arc<Connection>, Failure> {
        if fresh {
            let connection = self.connect(peer).await?;
            self.add(peer, &connection);
            return Ok(connection);
        }
        let limit = self.inner.config.connections_per_peer.max(1);
        loop {
            let plan = {
                let mut peers = self.peers();
                let slot = peers.entry(peer.clone()).or_default();
                slot.connections.retain(|c| !c.state.is_closed());
                match slot.connections.iter().min_by_key(|c| c.in_flight()) {
                    Some(best)
                        if best.in_flight() == 0
                            || slot.connections.len() + slot.connecting >= limit =>
                    {
                        Plan::Use(best.clone())
                    }
                    Some(_) => {
                        slot.connecting += 1;
                        Plan::Extra
                    }
                    None => Plan::First(slot.first_connect.clone(), slot.first_attempts),
                }
            };
            match plan {
                Plan::Use(connection) => return Ok(connection),
                Plan::Extra => {
                    let _connecting = ConnectingGuard { pool: self, peer };
                    match self.connect(peer).await {
                        Ok(connection) => {
                            self.add(peer, &connection);
                            return Ok(connection);
                        }
                        // Extra connections are an optimization: fall back on an existing one.
                        Err(failure) => return self.any_live(peer).ok_or(failure),
                    }
                }
                Plan::First(lock, attempts_seen) => {
                    let _only_one = lock.lock().await;
                    if self.connection_count(peer) > 0 {
                        continue; // someone else connected while we waited
                    }
                    if let Some(shared) = self.failed_since(peer, attempts_seen) {
                        return Err(shared.failure());
                    }
                    let result = self.connect(peer).await;
                    {
                        let mut peers = self.peers();
                        let slot = peers.entry(peer.clone()).or_default();
                        slot.first_attempts += 1;
                        slot.first_failure = result.as_ref().err().and_then(SharedFailure::of);
                    }
                    let connection = result?;
                    self.add(peer, &connection);
                    return Ok(connection);
                }
            }
        }
    }

    /// The failure of a first connect that completed after `attempts_seen`, if it failed.
    fn failed_since(&self, peer: &Endpoint, attempts_seen: u64) -> Option<SharedFailure> {
        let peers = self.peers();
        let slot = peers.get(peer)?;
        if slot.first_attempts > attempts_seen {
            slot.first_failure.clone()
        } else {
            None
        }
    }

    fn any_live(&self, peer: &Endpoint) -> Option<Arc<Connection>> {
        let peers = self.peers();
        let slot = peers.get(peer)?;
        slot.connections
            .iter()
            .filter(|c| !c.state.is_closed())
            .min_by_key(|c| c.in_flight())
            .cloned()
    }

    fn add(&self, peer: &Endpoint, connection: &Arc<Connection>) {
        self.peers()
            .entry(peer.clone())
            .or_default()
            .connections
            .push(connection.clone());
    }

    /// Connects, sets TCP_NODELAY, runs the handshake, starts the reader and writer tasks.
    async fn connect(&self, peer: &Endpoint) -> std::result::Result<Arc<Connection>, Failure> {
        let config = &self.inner.config;
        let refused = |e: std::io::Error| {
            Failure::Connect(
                Error::unavailable(format!("peer {peer}: cannot connect: {e}")).with_source(e),
            )
        };
        let connect = async {
            let mut stream = match peer {
                Endpoint::Tcp(addr) => {
                    let s = TcpStream::connect(addr.as_str()).await.map_err(refused)?;
                    Stream::tcp(s).map_err(refused)?
                }
                Endpoint::Unix(path) => {
                    Stream::Unix(UnixStream::connect(path).await.map_err(refused)?)
                }
            };
            let greeting = handshake::client(&mut stream, config.token.as_deref(), peer)
                .await
                .map_err(|f| match f {
                    ClientFailure::Lost(e) => Failure::Connect(e),
                    ClientFailure::Refused(e) => Failure::Final(e),
                })?;
            Ok::<_, Failure>((stream, greeting))
        };
        let (stream, greeting) = match tokio::time::timeout(config.connect_timeout, connect).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(Failure::Connect(Error::unavailable(format!(
                    "peer {peer}: cannot connect: no connection and handshake within {:?}",
                    config.connect_timeout
                ))))
            }
        };
        let number = self.inner.next_connection.fetch_add(1, Ordering::Relaxed);
        debug!(%peer, server = %greeting, connection = number, "connected");

        let (reader, writer) = stream.into_split();
        let state = Arc::new(ConnState::default());
        let writer = Writer::new(writer);
        let writer_state = state.clone();
        let writer_peer = peer.clone();
        let writer_task = writer.clone();
        tokio::spawn(async move {
            if let Err(e) = writer_task.run().await {
                debug!(peer = %writer_peer, "write failed: {e}");
                writer_state.fail(format!("write failed: {e}"));
            }
        });
        let reader = tokio::spawn(reader_loop(
            reader,
            state.clone(),
            config.limits.clone(),
            peer.clone(),
        ));
        Ok(Arc::new(Connection {
            number,
            peer: peer.clone(),
            state,
            writer,
            next_request: AtomicU64::new(1),
            reader,
        }))
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("number", &self.number)
            .field("peer", &self.peer)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}
