//! Change records for `--state-dir` (see `crate::state_dir`): what changed since the last
//! record, so that a commit costs its changes and not the whole state.
//!
//! A record carries the partitions changed since the previous one (each in full, or "gone"),
//! and the controller-wide state every time (partition order, index allocator, lease counter,
//! links), framed and checksummed like a snapshot. Applying a record *sets* what it carries, so
//! records are idempotent and replaying a log in order on the snapshot it started from gives
//! the state of its last record. Replaying it on a later snapshot whose state equals the last
//! record's also gives that state (what a crash during compaction leaves).

use super::*;
use crate::checkpoint::{frame, unframe_with_format};
use answers::AnswerChanges;

type LinkedBy = HashMap<SampleId, HashSet<(String, SampleId, FieldName)>>;

#[derive(Serialize)]
struct RecordRef<'a> {
    epoch: u64,
    order: &'a [String],
    alloc: &'a IndexAllocator,
    next_lease: LeaseId,
    linked_by: &'a LinkedBy,
    /// The record carries every partition; any other is gone.
    all: bool,
    partitions: Vec<(&'a str, Option<&'a Partition>)>,
    /// Every sampler's saved state (small: the answers cached for batches in flight).
    samplers: &'a [(String, Vec<u8>)],
    /// Remembered answers of the clients whose entry changed (format 4 on).
    answers: AnswerChanges,
}

#[derive(Deserialize)]
struct Record {
    epoch: u64,
    order: Vec<String>,
    alloc: IndexAllocator,
    next_lease: LeaseId,
    linked_by: LinkedBy,
    all: bool,
    partitions: Vec<(String, Option<Partition>)>,
    samplers: Vec<(String, Vec<u8>)>,
    /// Format 4 on: after the fields above, so it is decoded from what they leave.
    #[serde(skip)]
    answers: AnswerChanges,
}

/// The framed record of `st`'s changes since the last one; the changes are taken (the next
/// record starts empty).
fn take_record(st: &mut State, epoch: u64, samplers: &[(String, Vec<u8>)]) -> Result<Vec<u8>> {
    let changed = st.partitions.take_changed();
    let answers = st.answers_mut().take_changed();
    let alloc = st.alloc.get_mut().unwrap_or_else(|p| p.into_inner());
    let view = st.partitions.exclusive_view();
    let partitions: Vec<(&str, Option<&Partition>)> = if changed.all {
        view.into_iter().map(|(name, p)| (name, Some(p))).collect()
    } else {
        changed
            .names
            .iter()
            .map(|name| (name.as_str(), view.get(name.as_str()).copied()))
            .collect()
    };
    let body = postcard::to_allocvec(&RecordRef {
        epoch,
        order: &st.order,
        alloc,
        next_lease: st.next_lease.load(std::sync::atomic::Ordering::Relaxed),
        linked_by: &st.linked_by,
        all: changed.all,
        partitions,
        samplers,
        answers,
    })
    .map_err(|e| Error::internal(format!("cannot encode a controller change record: {e}")))?;
    Ok(frame(&body))
}

impl Controller {
    /// The changes since the last call, as one framed record for the state-dir log.
    pub(crate) fn take_changes(&self) -> Result<Vec<u8>> {
        let mut st = self.exclusive();
        let samplers = self.sampler_states()?;
        take_record(&mut st, self.epoch(), &samplers)
    }

    /// Forgets the changes since the last record: what the state dir recovered is on disk.
    pub(crate) fn forget_changes(&self) {
        let mut st = self.exclusive();
        let _taken = st.partitions.take_changed();
        let _answers = st.answers_mut().take_changed();
    }

    /// The changes since the last call and a whole snapshot, both of the same instant (one
    /// lock): the record ends the old log, the snapshot starts the new one.
    pub(crate) fn take_changes_and_snapshot(&self) -> Result<(Vec<u8>, Vec<u8>)> {
        let mut st = self.exclusive();
        let samplers = self.sampler_states()?;
        let record = take_record(&mut st, self.epoch(), &samplers)?;
        let (snapshot, _) = self.encode_snapshot(&st, &samplers)?;
        Ok((record, snapshot))
    }

    /// Applies one framed record of this controller's epoch (recovery from a state dir).
    /// Everything is decoded and checked before anything changes.
    pub(crate) fn apply_changes(&self, framed: &[u8]) -> Result<()> {
        let (format, body) = unframe_with_format(framed)?;
        let bad = |e: postcard::Error| {
            Error::corrupted(format!("controller change record does not decode: {e}"))
        };
        let (mut record, rest) = postcard::take_from_bytes::<Record>(body).map_err(bad)?;
        if format >= 4 {
            record.answers = postcard::from_bytes(rest).map_err(bad)?;
        }
        if record.epoch == 0 {
            return Err(Error::corrupted("controller change record of epoch 0"));
        }
        // A record that carries everything follows a restore, which may bring another epoch.
        if !record.all && record.epoch != self.epoch() {
            return Err(Error::corrupted(format!(
                "controller change record of epoch {:016x} after a snapshot of epoch {:016x}",
                record.epoch,
                self.epoch()
            )));
        }
        let units = self.exclusive().alloc_mut().units();
        if record.alloc.units() != units {
            return Err(Error::corrupted(format!(
                "controller change record for {} storage units, the snapshot has {units}",
                record.alloc.units()
            )));
        }
        record.alloc.check_restored(units)?;
        for p in record.partitions.iter().filter_map(|(_, p)| p.as_ref()) {
            p.check_restored(units)?;
        }
        self.load_sampler_states(&record.samplers, &record.order)?;
        let mut st = self.exclusive();
        if record.all {
            let all = record.partitions.into_iter();
            st.partitions
                .replace_recovered(all.filter_map(|(name, p)| Some((name, p?))).collect());
        } else {
            for (name, partition) in record.partitions {
                st.partitions.set_recovered(name, partition);
            }
        }
        if record.all {
            self.epoch
                .store(record.epoch, std::sync::atomic::Ordering::Relaxed);
        }
        st.order = record.order;
        record.alloc.set_limit(self.max_samples);
        *st.alloc_mut() = record.alloc;
        st.next_lease = record.next_lease.into();
        st.linked_by = record.linked_by;
        if record.all {
            let all = record.answers.into_iter();
            st.answers_mut()
                .replace(all.filter_map(|(id, a)| Some((id, a?))).collect());
        } else {
            st.answers_mut().apply(record.answers);
        }
        Ok(())
    }
}
