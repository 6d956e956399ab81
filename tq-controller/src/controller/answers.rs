//! Answers remembered for requests that must not be applied twice.
//!
//! An insert allocates samples and an at-most-once fetch consumes them; a production notice
//! whose samples are consumed and cleared before it is repeated would be refused as stale: if
//! the answer is lost
//! (a connection cut, a controller killed and restarted on its state dir), running the request
//! again would leak the first allocation or lose the first batch. So a remote client tags such
//! a request with a [`RequestId`]; the controller records the answer in the same critical
//! section as the change it answers (and so in the same state-dir record), and a request that
//! comes again with the same id gets that answer instead of a second change.
//!
//! The table stays small: each request also says below which sequence number its client has
//! nothing in flight (`done_below`), and the answers below it are dropped; a client keeps at
//! most [`MAX_ANSWERS_PER_CLIENT`], and a client not heard from for [`ANSWER_MEMORY`] is
//! forgotten. Both bounds are far beyond a client's retry window (10 s by default).

use super::*;
use std::collections::BTreeMap;
use tq_core::BackendMeta;

/// How long the answers of a client that sends nothing more are kept.
pub const ANSWER_MEMORY: Duration = Duration::from_secs(600);

/// The most answers kept per client: a client with more requests in flight than this loses
/// the protection for its oldest ones (a retry of one is refused as of unknown outcome).
pub const MAX_ANSWERS_PER_CLIENT: usize = 1024;

/// How often clients not heard from for [`ANSWER_MEMORY`] are looked for.
const SWEEP_EVERY_MS: u64 = 60_000;

/// What the controller keeps for one client.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ClientAnswers {
    /// Requests of this client below this sequence number are finished; their answers are
    /// gone, and one coming again is refused instead of being applied a second time.
    done_below: u64,
    /// When this client was last heard from (milliseconds since the Unix epoch).
    last_seen_ms: u64,
    answers: BTreeMap<u64, Answer>,
}

/// A remembered answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Answer {
    /// Of a `get_meta` (an insert, an at-most-once fetch). Kept in the layout snapshots and
    /// state dirs have always held, whatever the wire's (protocol 10 sends it sparser).
    Meta(#[serde(with = "tq_core::meta_snapshot_layout")] BatchMeta),
    /// Of a production notice: the backend meta it replaced.
    Replaced(Vec<BackendMeta>),
}

/// The answers of every client, by client id; see the module documentation.
#[derive(Default)]
pub(crate) struct Answers {
    clients: HashMap<u64, ClientAnswers>,
    /// Clients whose entry changed since the last state-dir record.
    changed: HashSet<u64>,
    next_sweep_ms: u64,
}

/// What a change record carries for the answers: each changed client's entry, or `None` for a
/// client forgotten.
pub(crate) type AnswerChanges = Vec<(u64, Option<ClientAnswers>)>;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Answers {
    /// The answer already given to `id`, if any. A request below what its client said is
    /// finished is refused: its answer is gone, so whether it was applied is unknown. What the
    /// request says about its client (`done_below`) is taken in first.
    pub(crate) fn lookup(&mut self, id: &RequestId) -> Result<Option<Answer>> {
        let Some(client) = self.note(id) else {
            return Ok(None);
        };
        if id.seq < client.done_below {
            return Err(Error::unavailable(format!(
                "request {} of client {:016x} came again after its client finished with it; \
                 its answer is no longer kept, so whether it was applied is unknown",
                id.seq, id.client
            ))
            .with_retry(tq_core::Retry::OutcomeUnknown));
        }
        Ok(client.answers.get(&id.seq).cloned())
    }

    /// Records `answer` for `id` (under the same lock as the change it answers).
    pub(crate) fn remember(&mut self, id: &RequestId, answer: Answer) {
        self.clients.entry(id.client).or_default();
        let Some(client) = self.note(id) else {
            return;
        };
        client.answers.insert(id.seq, answer);
        while client.answers.len() > MAX_ANSWERS_PER_CLIENT {
            if let Some((oldest, _)) = client.answers.pop_first() {
                client.done_below = client.done_below.max(oldest + 1);
            }
        }
        let now = client.last_seen_ms;
        if now >= self.next_sweep_ms {
            self.sweep(now);
        }
    }

    /// Takes in what `id` says about its client, if the client is known: when it was last
    /// heard from, and below which number its requests are finished (their answers dropped).
    fn note(&mut self, id: &RequestId) -> Option<&mut ClientAnswers> {
        let client = self.clients.get_mut(&id.client)?;
        client.last_seen_ms = now_ms();
        if id.done_below > client.done_below {
            client.done_below = id.done_below;
            client.answers = client.answers.split_off(&id.done_below);
        }
        self.changed.insert(id.client);
        Some(client)
    }

    /// Forgets clients not heard from for [`ANSWER_MEMORY`].
    fn sweep(&mut self, now: u64) {
        self.next_sweep_ms = now + SWEEP_EVERY_MS;
        let memory = ANSWER_MEMORY.as_millis() as u64;
        let stale: Vec<u64> = self
            .clients
            .iter()
            .filter(|(_, c)| c.last_seen_ms.saturating_add(memory) < now)
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            self.clients.remove(&id);
            self.changed.insert(id);
        }
    }

    /// The entries changed since the last call (for a state-dir record).
    pub(crate) fn take_changed(&mut self) -> AnswerChanges {
        let mut changed: Vec<u64> = self.changed.drain().collect();
        changed.sort_unstable();
        changed
            .into_iter()
            .map(|id| (id, self.clients.get(&id).cloned()))
            .collect()
    }

    /// Applies a record's changes (recovery): sets what they carry.
    pub(crate) fn apply(&mut self, changes: AnswerChanges) {
        for (id, entry) in changes {
            match entry {
                Some(entry) => self.clients.insert(id, entry),
                None => self.clients.remove(&id),
            };
        }
    }

    /// Every client's entry, in client order (for a snapshot).
    pub(crate) fn all(&self) -> Vec<(u64, &ClientAnswers)> {
        let mut all: Vec<(u64, &ClientAnswers)> =
            self.clients.iter().map(|(id, c)| (*id, c)).collect();
        all.sort_unstable_by_key(|(id, _)| *id);
        all
    }

    /// Replaces the whole table (a restore); every entry counts as changed, so that a state
    /// dir's next record carries it.
    pub(crate) fn replace(&mut self, all: Vec<(u64, ClientAnswers)>) {
        self.clients = all.into_iter().collect();
        self.changed = self.clients.keys().copied().collect();
    }

    /// How many answers are kept, over all clients.
    pub(crate) fn len(&self) -> usize {
        self.clients.values().map(|c| c.answers.len()).sum()
    }
}

/// The request ids being answered now, each with the lock its attempts take in turn.
pub(crate) type InFlight = Mutex<HashMap<(u64, u64), Arc<tokio::sync::Mutex<()>>>>;

/// One attempt's turn at a request id: a second attempt of the same request (a retry that
/// overtook a first attempt still running) waits for the first to finish, then finds its
/// answer instead of applying the request again.
pub(crate) struct RequestTurn<'a> {
    in_flight: &'a InFlight,
    key: (u64, u64),
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Controller {
    /// Waits for the turn of `id` (see [`RequestTurn`]).
    pub(crate) async fn request_turn(&self, id: &RequestId) -> RequestTurn<'_> {
        let key = (id.client, id.seq);
        let lock = {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            in_flight.entry(key).or_default().clone()
        };
        RequestTurn {
            in_flight: &self.in_flight,
            key,
            guard: Some(lock.lock_owned().await),
        }
    }
}

impl Drop for RequestTurn<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(guard) = self.guard.take() {
            // The map's reference and the guard's: nobody else waits for this id.
            let alone = Arc::strong_count(tokio::sync::OwnedMutexGuard::mutex(&guard)) == 2;
            drop(guard);
            if alone {
                in_flight.remove(&self.key);
            }
        }
    }
}
