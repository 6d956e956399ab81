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

use crate::frame::Message;
use crate::handshake::{self, ClientFailure};
use crate::stream::{Stream, Writer};
use crate::Endpoint;
use bytes::BytesMut;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::net::{TcpStream, UnixStream};
use tokio::time::Instant;
use tq_core::{Error, ErrorKind, Result, Retry};
use tracing::debug;

mod connection;
mod options;
pub use connection::PlacedAnswer;
use connection::*;
pub use options::{CallOptions, ClientConfig, RetryConfig};

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
