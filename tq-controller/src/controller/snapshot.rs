//! Taking and restoring the whole controller state (see [`crate::checkpoint`]).

use super::*;
use crate::checkpoint::{frame, unframe_with_format, SnapshotCounts};
use answers::ClientAnswers;
use tq_core::BackendMeta;

#[derive(Serialize)]
struct BodyRef<'a> {
    epoch: u64,
    units: u32,
    state: &'a State,
    /// Sampler states by name (format 2 on).
    samplers: &'a [(String, Vec<u8>)],
    /// Remembered answers by client (format 4 on; see `answers`).
    answers: Vec<(u64, &'a ClientAnswers)>,
}

#[derive(Deserialize)]
struct Body {
    epoch: u64,
    units: u32,
    state: State,
    samplers: Vec<(String, Vec<u8>)>,
    /// Format 4 on: after the fields above, so it is decoded from what they leave.
    #[serde(skip)]
    answers: Vec<(u64, ClientAnswers)>,
}

/// Format 1: no sampler states.
#[derive(Deserialize)]
struct BodyV1 {
    epoch: u64,
    units: u32,
    state: State,
}

fn counts(state: &State) -> SnapshotCounts {
    let mut c = SnapshotCounts {
        partitions: state.partitions.len() as u64,
        ..SnapshotCounts::default()
    };
    for (_, p) in state.partitions.iter() {
        let (keys, leases) = p.key_and_lease_counts();
        c.samples += p.len() as u64;
        c.keys += keys as u64;
        c.leases += leases as u64;
    }
    c
}

/// Checks and decodes a snapshot (any format this build reads).
fn decode(snapshot: &[u8]) -> Result<Body> {
    let (format, body) = unframe_with_format(snapshot)?;
    let decoded = match format {
        1 => postcard::from_bytes::<BodyV1>(body).map(|b| Body {
            epoch: b.epoch,
            units: b.units,
            state: b.state,
            samplers: Vec::new(),
            answers: Vec::new(),
        }),
        2 | 3 => postcard::from_bytes::<Body>(body),
        _ => postcard::take_from_bytes::<Body>(body).and_then(|(mut b, rest)| {
            b.answers = postcard::from_bytes(rest)?;
            Ok(b)
        }),
    };
    let body = decoded.map_err(|e| {
        Error::corrupted(format!(
            "controller snapshot: the state does not decode: {e}"
        ))
    })?;
    body.state.alloc().check_restored(body.units)?;
    for (_, p) in body.state.partitions.iter() {
        p.check_restored(body.units)?;
    }
    Ok(body)
}

/// A partition's samples that store cells, each with the backend meta naming them.
pub type StoredCells = Vec<(SampleId, BackendMeta)>;

/// The cells a snapshot says storage holds, per partition in creation order: every visible
/// sample that stores cells, with the backend meta naming each of them (see
/// `Partition::stored_cells`). What a checkpoint that copies KV payloads reads from the store.
pub fn snapshot_cells(snapshot: &[u8]) -> Result<Vec<(String, StoredCells)>> {
    let body = decode(snapshot)?;
    Ok(body
        .state
        .order
        .iter()
        .filter_map(|name| {
            let p = body.state.partitions.get(name)?;
            Some((name.clone(), p.stored_cells()))
        })
        .collect())
}

/// The epoch a snapshot restores (checked and decoded as [`Controller::restore`] would).
pub fn snapshot_epoch(snapshot: &[u8]) -> Result<u64> {
    decode(snapshot).map(|b| b.epoch)
}

/// `snapshot` with its epoch replaced by `epoch` (re-encoded in the current format, checked
/// as [`Controller::restore`] would check it). A checkpoint whose KV payloads were copied is
/// loaded in a fresh epoch: its cells are written back under keys no store holds yet, so a
/// store that went on writing in the checkpoint's epoch cannot be in the way.
pub fn snapshot_in_epoch(snapshot: &[u8], epoch: u64) -> Result<Vec<u8>> {
    if epoch == 0 {
        return Err(Error::invalid(
            "controller snapshot: epoch 0 is not an epoch",
        ));
    }
    let body = decode(snapshot)?;
    let encoded = postcard::to_allocvec(&BodyRef {
        epoch,
        units: body.units,
        state: &body.state,
        samplers: &body.samplers,
        answers: body.answers.iter().map(|(id, a)| (*id, a)).collect(),
    })
    .map_err(|e| Error::internal(format!("cannot encode the controller state: {e}")))?;
    Ok(frame(&encoded))
}

impl Controller {
    /// The whole state as one consistent snapshot (taken under the state lock, so no write
    /// is half in it), with its counts. It includes every sampler's saved state
    /// ([`Sampler::save_state`]), so that a restored controller answers the ranks of a group
    /// as the saved one would have.
    pub fn snapshot(&self) -> Result<(Vec<u8>, SnapshotCounts)> {
        let st = self.exclusive();
        let samplers = self.sampler_states()?;
        self.encode_snapshot(&st, &samplers)
    }

    /// [`Controller::snapshot`] of a state the caller holds locked, with the samplers' states
    /// taken under that lock.
    pub(super) fn encode_snapshot(
        &self,
        st: &State,
        samplers: &[(String, Vec<u8>)],
    ) -> Result<(Vec<u8>, SnapshotCounts)> {
        let answers = st.answers();
        let units = st.alloc().units();
        let body = postcard::to_allocvec(&BodyRef {
            epoch: self.epoch(),
            units,
            state: st,
            samplers,
            answers: answers.all(),
        })
        .map_err(|e| Error::internal(format!("cannot encode the controller state: {e}")))?;
        Ok((frame(&body), counts(st)))
    }

    /// Replaces this controller's state with `snapshot`'s, epoch included, so that clients
    /// and KV keys of the snapshot's epoch work again (clients of this controller's current
    /// epoch are refused from then on). Everything is checked before anything changes: the
    /// format, the checksum, the decoding, the unit count, and that this controller holds
    /// no partition yet (a snapshot replaces a state, it does not merge into one).
    pub fn restore(&self, snapshot: &[u8]) -> Result<SnapshotCounts> {
        let Body {
            epoch,
            units,
            state,
            samplers,
            answers,
        } = decode(snapshot)?;
        let counts = counts(&state);
        let names: Vec<String> = {
            let mut st = self.exclusive();
            if st.alloc_mut().units() != units {
                return Err(Error::invalid(format!(
                    "controller snapshot: taken with {units} storage units, this controller \
                     has {}",
                    st.alloc_mut().units()
                )));
            }
            if !st.partitions.is_empty() {
                return Err(Error::conflict(format!(
                    "controller snapshot: this controller already holds {} partition(s); load \
                     a checkpoint into a controller that holds none",
                    st.partitions.len()
                )));
            }
            if epoch == 0 {
                return Err(Error::corrupted("controller snapshot: epoch 0"));
            }
            // Last of the checks: undone if it fails.
            self.load_sampler_states(&samplers, &state.order)
                .map_err(|e| e.context("controller snapshot"))?;
            *st = state;
            // The limit is this controller's setting, not the saved state's.
            st.alloc_mut().set_limit(self.max_samples);
            st.answers_mut().replace(answers);
            // A state dir's next record must carry the whole restored state.
            st.partitions.mark_all_changed();
            self.epoch
                .store(epoch, std::sync::atomic::Ordering::Relaxed);
            st.order.clone()
        };
        tracing::info!(
            epoch = %format_args!("{epoch:016x}"),
            partitions = counts.partitions,
            samples = counts.samples,
            "controller state restored from a snapshot"
        );
        for name in names {
            self.wake(&name);
        }
        Ok(counts)
    }
}
