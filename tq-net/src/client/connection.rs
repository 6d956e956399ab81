//! One multiplexed connection: requests matched to answers by id, written by their callers or
//! the connection's writer task, read by its reader task, which fails every pending request at
//! once when the connection breaks.

use crate::error::WireError;
use crate::frame::{read_body, read_head, BodyBuffer, Encoded, Limits, Message, MessageKind};
use crate::stream::{BoxRead, Outgoing, Writer};
use crate::Endpoint;
use bytes::BytesMut;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tq_core::{Error, ErrorKind, Retry};
use tracing::{debug, warn};

/// Buffers that the frames of one answer are read into directly, instead of into the
/// connection's receive buffer (see [`crate::Pool::call_into`]). Index `i` is for frame `i`.
///
/// The reader of the connection that receives the answer takes them for the time it reads and
/// hands them back with the answer (or back here if the read fails, so a retry can use them).
#[derive(Debug, Default)]
pub(super) struct FrameSinks {
    pub(super) buffers: Mutex<Option<Vec<Option<BytesMut>>>>,
}

impl FrameSinks {
    pub(super) fn take(&self) -> Option<Vec<Option<BytesMut>>> {
        self.buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    pub(super) fn put_back(&self, buffers: Vec<Option<BytesMut>>) {
        *self.buffers.lock().unwrap_or_else(|p| p.into_inner()) = Some(buffers);
    }
}

/// An answer read partly into caller buffers ([`crate::Pool::call_into`]).
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
pub(super) enum Reply {
    Answer(Message, Option<Vec<Option<BytesMut>>>),
    Remote(Error),
    Lost(String),
}

/// Pending requests of one connection, and whether it is still usable. One lock covers both so
/// that a request is either registered before the connection fails (and then failed by it) or
/// refused registration: no request can slip in unnoticed after the failure.
#[derive(Default)]
pub(super) struct Pending {
    pub(super) waiting: HashMap<u64, Waiter>,
    pub(super) closed: Option<String>,
}

/// A caller waiting for an answer, and where the answer's frames should go.
pub(super) struct Waiter {
    pub(super) answer: oneshot::Sender<Reply>,
    pub(super) sinks: Option<Arc<FrameSinks>>,
}

#[derive(Default)]
pub(super) struct ConnState {
    pub(super) pending: Mutex<Pending>,
    pub(super) in_flight: AtomicUsize,
}

impl ConnState {
    pub(super) fn lock(&self) -> MutexGuard<'_, Pending> {
        // A panic while holding this lock leaves the map consistent (single inserts/removes).
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the connection dead and fails every pending request with `reason`.
    pub(super) fn fail(&self, reason: String) {
        let mut pending = self.lock();
        if pending.closed.is_none() {
            pending.closed = Some(reason.clone());
        }
        for (_, waiter) in pending.waiting.drain() {
            let _ = waiter.answer.send(Reply::Lost(reason.clone()));
        }
    }

    pub(super) fn is_closed(&self) -> bool {
        self.lock().closed.is_some()
    }
}

/// Kind and text of a transport failure, and whether the request had been sent.
pub(super) fn summary(
    peer: &Endpoint,
    failure: &Failure,
    timeout: Duration,
) -> (ErrorKind, String, bool) {
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
pub(super) fn retry_failed(
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
pub(super) struct Connection {
    /// Pool-wide number, for logs.
    pub(super) number: u64,
    pub(super) peer: Endpoint,
    pub(super) state: Arc<ConnState>,
    pub(super) writer: Arc<Writer>,
    pub(super) next_request: AtomicU64,
    pub(super) reader: JoinHandle<()>,
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
pub(super) struct PendingGuard {
    pub(super) state: Arc<ConnState>,
    pub(super) id: u64,
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
pub(super) fn note_failure(peer: &Endpoint, failure: &Failure) {
    let name = match failure {
        Failure::ConnectTimeout | Failure::NoAnswer => "tq_net_timeouts_total",
        Failure::Final(_) | Failure::Remote(_) => return,
        _ => "tq_net_connection_failures_total",
    };
    metrics::counter!(name, "peer" => peer.to_string()).increment(1);
}

/// Why one attempt failed; decides between retrying and reporting.
pub(super) enum Failure {
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
    pub(super) fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::Relaxed)
    }

    /// Registers and sends (or queues) a request. `SendError::Dead` when the connection is already dead:
    /// nothing was sent, so the caller may use another connection.
    pub(super) fn send(
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

pub(super) enum SendError {
    Invalid(Error),
    Dead(String),
}

/// Reads answers and hands each to the caller waiting for its id; on any failure, fails every
/// pending request of the connection at once.
pub(super) async fn reader_loop(
    mut reader: BoxRead,
    state: Arc<ConnState>,
    limits: Limits,
    peer: Endpoint,
) {
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
        // Answers are read into pooled memory: callers copy small cells out and drop them.
        let read = read_body(
            &mut reader,
            &head,
            placed.as_deref_mut().unwrap_or(&mut []),
            BodyBuffer::Pooled,
        )
        .await;
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
