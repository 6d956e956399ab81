//! The operation table: every controller operation, declared once.
//!
//! Each entry of `data` is one data-path operation:
//!
//! ```text
//! /// Docs (they become the trait method's docs).
//! fn method(arg: &str => String, other: Vec<Tags>) -> Reply {
//!     wire: Variant,                    // its request variant (appended at the end of `data`)
//!     metric: Label = "OP_TYPE",        // its ControllerOp and `op_type` label
//!     metric_of: expr,                  // optional: the label chosen per request (get_meta)
//!     rows: expr,                       // samples it counts: no_rows, rows(n), counted, ...
//!     failed: expr,                     // optional: which errors count as failed requests
//!     resend: expr,                     // a Resend: may a lost answer be sent again, and how
//!     wait: expr,                       // optional: how long it may wait on top of the timeout
//!     changes: expr,                    // may it change the state (--state-dir syncs first)
//!     check: expr,                      // optional: a check of a remote answer
//! }
//! ```
//!
//! An argument written `name: &T => Owned` is borrowed by the trait method and carried owned
//! in its request; one without `=>` is passed by value. The expressions see the arguments
//! (`metric_of` and `changes` by reference, on the request).
//!
//! From it [`generate`] makes the [`crate::ControlPlane`] trait, the [`crate::ControllerOp`]
//! label, the metering of [`crate::MeteredPlane`], and with feature `net` the request
//! variant, the `--state-dir` rule, the remote stub and the server's dispatch. The logic is
//! the `impl ControlPlane for Controller` in `controller/plane.rs`.
//!
//! **Adding an operation**: an entry at the end of `data` and its logic in
//! `controller/plane.rs` — in the library, nothing else. A new request is a new protocol
//! version (an older peer cannot serve it, and the server-level requests after `data` move by
//! one): bump `tq_net::PROTOCOL_VERSION`, add the request's example to `net/wire_pin.rs` (its
//! test refuses an operation without one) and write the new version's committed bytes with
//! `TQ_BLESS_WIRE=1 cargo test -p tq-controller --features net --lib wire_pin`. A reply of a
//! type no operation answered before also needs its `ControlResponse` variant (at the end) and
//! a line in `net.rs`'s reply map. docs/operations.md lists the new `op_type`
//! (`tests/operations_doc.rs` fails until it does). `renew_lease` was added this way.
//!
//! `admin` declares the [`crate::ControlAdmin`] trait (checkpoints and status: they carry the
//! snapshot as a body frame, so their stub and serving are written out in `net/remote.rs` and
//! `net.rs`); `server` the requests the server answers itself; `labels` the `op_type`s that
//! are not one data-path operation.

use crate::api::*;
use crate::checkpoint::SnapshotCounts;
use generate::{counted, no_rows, rows};
use std::collections::BTreeMap;
use std::time::Duration;
use tq_core::{BackendMeta, BatchMeta, FieldMeta, FieldName, LeaseId, SampleId, Tags};

#[macro_use]
pub(crate) mod generate;
pub use generate::Resend;

control_ops! {
    data {
        /// Metadata for a batch: fetch, insert (allocate) or force mode.
        fn get_meta(req: GetMetaRequest) -> BatchMeta {
            wire: GetMeta,
            metric: GetMeta = "GET_META",
            metric_of: req.op_type(),
            rows: meta_rows,
            failed: unless_closed,
            resend: req.resend(),
            wait: req.longest_wait(),
            changes: req.changes_state(),
        }

        /// Marks cells produced. Rejected (`Conflict`, nothing changed) for samples that are
        /// being cleared or not owned by the partition any more.
        ///
        /// Returns the backend meta the notice replaced: per sample, the previous value of each
        /// entry it changed (empty when nothing was replaced, the common case). A backend that
        /// writes overwrites beside the old cells reclaims those
        /// ([`tq_core::StorageManager::retire_replaced`]); only the controller knows them for
        /// sure when writers race.
        ///
        /// Tagged: a notice whose answer was lost may find its samples consumed and cleared by
        /// the time it comes again (and be refused as stale); with an id it gets its first
        /// answer.
        fn notify_production(notice: ProductionNotice) -> Vec<BackendMeta> {
            wire: Notify,
            metric: NotifyDataUpdate = "NOTIFY_DATA_UPDATE",
            rows: rows(notice.samples.len()),
            resend: Resend::Tagged,
            changes: true,
        }

        /// Merges tags into samples without writing data.
        fn set_tags(partition: &str => String, samples: &[SampleId] => Vec<SampleId>, tags: Vec<Tags>) -> () {
            wire: SetTags,
            metric: SetCustomMeta = "SET_CUSTOM_META",
            rows: no_rows,
            resend: Resend::Freely,
            changes: true,
        }

        /// Step 1 of a clear: hides the samples at once and returns their metadata (every
        /// produced field, backend meta) for the storage clear. `None` selects the whole
        /// partition. Samples not owned are ignored, so a retried clear is harmless.
        fn mark_clearing(partition: &str => String, samples: Option<&[SampleId]> => Option<Vec<SampleId>>) -> BatchMeta {
            wire: MarkClearing,
            metric: MarkClearing = "MARK_CLEARING",
            rows: no_rows,
            resend: Resend::Freely,
            changes: true,
        }

        /// Step 3 of a clear, after storage is clear: releases the samples' indexes for reuse.
        /// An empty partition is removed.
        fn release(partition: &str => String, samples: &[SampleId] => Vec<SampleId>) -> () {
            wire: Release,
            metric: ClearMeta = "CLEAR_META",
            rows: rows(samples.len()),
            resend: Resend::Freely,
            changes: true,
        }

        /// Step 1 of a field-level clear: the cells read as never written from now on and
        /// cannot be written again until [`ControlPlane::finish_clear_fields`]. Returns the
        /// metadata of the samples that held any of the fields.
        fn begin_clear_fields(partition: &str => String, samples: &[SampleId] => Vec<SampleId>, fields: &[FieldName] => Vec<FieldName>) -> BatchMeta {
            wire: BeginClearFields,
            metric: MarkClearingFields = "MARK_CLEARING_FIELDS",
            rows: no_rows,
            resend: Resend::Freely,
            changes: true,
        }

        /// Step 3 of a field-level clear: the cells may be written again.
        fn finish_clear_fields(partition: &str => String, samples: &[SampleId] => Vec<SampleId>, fields: &[FieldName] => Vec<FieldName>) -> () {
            wire: FinishClearFields,
            metric: ClearFields = "CLEAR_FIELDS",
            rows: rows(samples.len()),
            resend: Resend::Freely,
            changes: true,
        }

        /// Resolves keys to samples; with `create`, unknown keys get new samples (and the
        /// partition is created). Duplicate or empty keys are `Invalid`. Retrying resolves the
        /// same keys to the same samples (created ones included).
        fn kv_retrieve_meta(partition: &str => String, keys: &[String] => Vec<String>, create: bool) -> KvMeta {
            wire: KvRetrieveMeta,
            metric: KvRetrieveMeta = "KV_RETRIEVE_META",
            rows: no_rows,
            resend: Resend::Freely,
            changes: *create,
        }

        /// Keys and tags of one partition, or of every partition.
        fn kv_list(partition: Option<&str> => Option<String>) -> Vec<KeyListing> {
            wire: KvList,
            metric: KvList = "KV_LIST",
            rows: no_rows,
            resend: Resend::Freely,
            changes: false,
        }

        /// Per-sample production of `fields`.
        fn production_status(partition: &str => String, fields: &[FieldName] => Vec<FieldName>) -> ProductionStatus {
            wire: ProductionStatus,
            metric: GetProduction = "GET_PRODUCTION",
            rows: no_rows,
            resend: Resend::Freely,
            changes: false,
        }

        /// Per-sample consumption by `task`.
        fn consumption_status(partition: &str => String, task: &str => String) -> ConsumptionStatus {
            wire: ConsumptionStatus,
            metric: GetConsumption = "GET_CONSUMPTION",
            rows: no_rows,
            resend: Resend::Freely,
            changes: false,
        }

        /// Forgets what `task` (or every task) consumed, so samples can be fetched again.
        fn reset_consumption(partition: &str => String, task: Option<&str> => Option<String>) -> () {
            wire: ResetConsumption,
            metric: ResetConsumption = "RESET_CONSUMPTION",
            rows: no_rows,
            resend: Resend::Freely,
            changes: true,
        }

        /// Partition names in creation order.
        fn list_partitions() -> Vec<String> {
            wire: ListPartitions,
            metric: GetListPartitions = "GET_LIST_PARTITIONS",
            rows: no_rows,
            resend: Resend::Freely,
            changes: false,
        }

        /// Consumes samples handed out under `lease` (acknowledged mode); returns how many are
        /// consumed under that lease. Idempotent: samples this lease acknowledged before count
        /// again, so a retry whose first answer was lost (a controller restart) gets the same
        /// answer. Samples whose lease expired meanwhile are not consumed (they may be with
        /// another consumer) and do not count.
        fn ack(partition: &str => String, task: &str => String, lease: LeaseId, samples: &[SampleId] => Vec<SampleId>) -> usize {
            wire: Ack,
            metric: Ack = "ACK",
            rows: counted,
            resend: Resend::Freely,
            changes: true,
        }

        /// Declares that no more samples will be added to `partition` (created if missing): a
        /// fetch of a task that consumed every sample then ends with `Closed` instead of
        /// waiting.
        fn mark_complete(partition: &str => String) -> () {
            wire: MarkComplete,
            metric: MarkComplete = "MARK_COMPLETE",
            rows: no_rows,
            resend: Resend::Freely,
            changes: true,
        }

        /// Gives back samples a fetch of `task` handed out but its caller never received (a
        /// stream dropped while its fetch was completing): with `lease` (acknowledged mode) the
        /// samples still held under that lease are released at once instead of at its expiry;
        /// without (at-most-once) their consumption is undone, so they are not lost. Returns
        /// how many came back; samples no longer held that way are left alone.
        ///
        /// Never resent: undoing an at-most-once consumption twice could hand samples out
        /// again that another consumer took in between.
        fn return_fetched(partition: &str => String, task: &str => String, lease: Option<LeaseId>, samples: &[SampleId] => Vec<SampleId>) -> usize {
            wire: ReturnFetched,
            metric: ReturnFetched = "RETURN_FETCHED",
            rows: counted,
            resend: Resend::Never,
            changes: true,
        }

        /// Removes an empty partition (with its completion mark and sampler state). A partition
        /// that still holds samples is `Conflict`; a missing one is fine.
        fn drop_partition(partition: &str => String) -> () {
            wire: DropPartition,
            metric: ClearPartition = "CLEAR_PARTITION",
            rows: no_rows,
            resend: Resend::Freely,
            changes: true,
        }

        /// Makes `fields` of `keys` (created if missing) read the payloads of `public_keys` in
        /// the public partition, without copying. All-or-nothing: everything is validated
        /// first. `Unsupported` when the storage backend cannot resolve links. Idempotent:
        /// linking the same cells to the same sources again changes nothing.
        fn kv_link(req: LinkRequest) -> KvMeta {
            wire: KvLink,
            metric: KvLink = "KV_LINK",
            rows: rows(req.keys.len()),
            resend: Resend::Freely,
            changes: true,
        }

        /// Drops the links of `fields` of `keys` (the cells read as never written); returns how
        /// many.
        fn kv_unlink(partition: &str => String, keys: &[String] => Vec<String>, fields: &[FieldName] => Vec<FieldName>) -> usize {
            wire: KvUnlink,
            metric: KvUnlink = "KV_UNLINK",
            rows: counted,
            resend: Resend::Freely,
            changes: true,
        }

        /// Step 1 of `kv_clear_unlinked_public`: marks clearing, in one step, every key of the
        /// public partition starting with `prefix` that was linked at least once and is linked
        /// no more. Public keys never linked yet are protected (a producer may be between put
        /// and link).
        fn mark_unlinked_public(public_partition: &str => String, prefix: &str => String) -> KvMeta {
            wire: MarkUnlinkedPublic,
            metric: MarkUnlinkedPublic = "MARK_UNLINKED_PUBLIC",
            rows: no_rows,
            resend: Resend::Freely,
            changes: true,
        }

        /// Before a storage write of `fields` (their dtype and kind; shapes are ignored) to
        /// `samples`: refuses it unless its production notice would be accepted as things
        /// stand (samples owned and not being cleared, no public sample still linked, no
        /// written cell linked or under a field-level clear, dtype and kind compatible), so a
        /// refused write never overwrites a live value. Returns the samples' metadata for the
        /// storage call: the fields every sample holds, tags, and the backend meta of every
        /// field each sample holds.
        fn prepare_write(partition: &str => String, samples: &[SampleId] => Vec<SampleId>, fields: &BTreeMap<FieldName, FieldMeta> => BTreeMap<FieldName, FieldMeta>) -> BatchMeta {
            wire: PrepareWrite,
            metric: PrepareWrite = "PREPARE_WRITE",
            rows: no_rows,
            resend: Resend::Freely,
            changes: false,
        }

        /// `kv_retrieve_meta` with `create` for a write of `fields`, checked like
        /// [`ControlPlane::prepare_write`] before any key is created. Keys whose sample is
        /// being cleared (a clear whose storage step has not finished) are returned in
        /// [`KvMeta::clearing`] and then nothing is created: the caller finishes those clears
        /// ([`ControlPlane::kv_mark_clearing`]) and asks again. Retrying resolves the same keys
        /// to the same samples (created ones included).
        fn kv_prepare_put(partition: &str => String, keys: &[String] => Vec<String>, fields: &BTreeMap<FieldName, FieldMeta> => BTreeMap<FieldName, FieldMeta>) -> KvMeta {
            wire: KvPreparePut,
            metric: KvPreparePut = "KV_PREPARE_PUT",
            rows: no_rows,
            resend: Resend::Freely,
            changes: true,
        }

        /// Step 1 of a whole-key clear: like [`ControlPlane::mark_clearing`] for the samples of
        /// `keys`, including keys already being cleared (so a clear whose storage step failed
        /// is finished by the next clear). Unknown keys are skipped.
        fn kv_mark_clearing(partition: &str => String, keys: &[String] => Vec<String>) -> BatchMeta {
            wire: KvMarkClearing,
            metric: KvMarkClearing = "KV_MARK_CLEARING",
            rows: no_rows,
            resend: Resend::Freely,
            changes: true,
        }

        /// Per sample: still owned by `partition` at that generation, not being cleared, and
        /// holding every one of `fields`. Tells a read that found cells missing whether the
        /// data was lost (`true`) or cleared meanwhile (`false`), and a refused write which of
        /// its samples are gone (their storage cells are garbage).
        fn still_hold(partition: &str => String, samples: &[SampleId] => Vec<SampleId>, fields: &[FieldName] => Vec<FieldName>) -> Vec<bool> {
            wire: StillHold,
            metric: StillHold = "STILL_HOLD",
            rows: no_rows,
            resend: Resend::Freely,
            changes: false,
            check: |held: &Vec<bool>| held.len() == samples.len(),
        }
        /// Extends a lease (acknowledged mode): the samples `task` still holds under `lease`
        /// stay its own until `extend` from now instead of going back at the lease's deadline,
        /// for a consumer whose step takes longer than the lease it fetched with. Returns how
        /// many it still held; samples whose lease already ran out (they may be another
        /// consumer's now) or that were acknowledged are left alone. A resent request sets the
        /// deadline again from its own arrival, so it may be resent.
        fn renew_lease(partition: &str => String, task: &str => String, lease: LeaseId, samples: &[SampleId] => Vec<SampleId>, extend: Duration) -> usize {
            wire: RenewLease,
            metric: RenewLease = "RENEW_LEASE",
            rows: counted,
            resend: Resend::Freely,
            changes: true,
        }
    }

    admin {
        /// The whole state as a snapshot (see `Controller::snapshot`).
        fn snapshot() -> (Vec<u8>, SnapshotCounts);

        /// The whole state, and from the same instant a hold on every step that removes stored
        /// cells (clears wait to be marked, overwrites to be published) until
        /// [`ControlAdmin::release_removals`] or `ttl`: a checkpoint copying payloads out of a
        /// shared store reads the cells the snapshot names while nothing can remove them.
        /// Returns the hold's token. One hold at a time: `Unavailable` while another is in
        /// place.
        fn snapshot_holding_removals(ttl: Duration) -> (Vec<u8>, SnapshotCounts, u64);

        /// Lifts the hold `hold` of [`ControlAdmin::snapshot_holding_removals`] (an expired or
        /// unknown hold is fine).
        fn release_removals(hold: u64) -> ();

        /// Replaces the state with a snapshot's (see `Controller::restore`).
        fn restore(snapshot: Vec<u8>) -> SnapshotCounts;

        /// What the controller holds (partitions, progress, leases, index allocation), for
        /// `tq stats` and the state gauges. Cheap (counts, no per-sample lists).
        fn status() -> ControllerStatus;
    }

    server {
        /// A storage unit registering (it sends no epoch: it learns it from the answer).
        RegisterUnit(crate::UnitInfo) => metric: RegisterUnit, changes: false;
        /// The storage units in routing order.
        Topology => metric: GetTopology, changes: false;
        /// What the controller holds, for `tq stats` (protocol 5).
        Status => metric: Status, changes: false;
        /// The whole state; answered with the snapshot as the body frame.
        Snapshot => metric: Checkpoint, changes: false;
        /// Replace the state with the snapshot in the body frame.
        Restore => metric: Checkpoint, changes: true;
        /// A snapshot (body frame) with a hold on removals for at most `ttl_ms` (capped at
        /// `MAX_REMOVAL_HOLD`); answered with `ControlResponse::HeldSnapshot`.
        SnapshotHoldingRemovals { ttl_ms: u64 } => metric: Checkpoint, changes: false;
        /// Lift a hold on removals.
        ReleaseRemovals { hold: u64 } => metric: Checkpoint, changes: false;
    }

    labels {
        /// `GET_PARTITION_META`: a forced `get_meta` (metadata of every sample of a partition).
        GetPartitionMeta = "GET_PARTITION_META",
        /// `REGISTER_UNIT`: a unit registering.
        RegisterUnit = "REGISTER_UNIT",
        /// `GET_TOPOLOGY`: a client asking for the topology.
        GetTopology = "GET_TOPOLOGY",
        /// `CHECKPOINT`: snapshots, restores and holds; counted only when refused.
        Checkpoint = "CHECKPOINT",
        /// `STATUS`: counted only when refused.
        Status = "STATUS",
        /// `UNDECODABLE`: a request that could not be decoded.
        Undecodable = "UNDECODABLE",
    }
}

/// Metering: the samples of the answer.
pub(crate) fn meta_rows(meta: &BatchMeta) -> u64 {
    meta.len() as u64
}

/// Metering: `Closed` is the normal end of a stream (the partition is complete and the task
/// has consumed it), not a failed request.
pub(crate) fn unless_closed(e: &tq_core::Error) -> bool {
    e.kind() != &tq_core::ErrorKind::Closed
}

/// The rules of `get_meta` that depend on its mode.
impl GetMetaRequest {
    /// A forced fetch counts as `GET_PARTITION_META`, the rest as `GET_META`.
    pub fn op_type(&self) -> ControllerOp {
        match self.mode {
            GetMetaMode::Force => ControllerOp::GetPartitionMeta,
            _ => ControllerOp::GetMeta,
        }
    }

    /// An at-most-once fetch marks samples consumed and an insert allocates: replaying either
    /// after a lost answer would lose or leak samples, so they are tagged, and the controller
    /// answers a replay with the first answer. A fetch in acknowledged mode may be replayed as
    /// it is: what a lost answer leased comes back when its lease expires, so nothing is lost
    /// or consumed twice (the replay hands out other samples).
    pub fn resend(&self) -> Resend {
        match &self.mode {
            GetMetaMode::Fetch { lease: Some(_), .. } | GetMetaMode::Force => Resend::Freely,
            GetMetaMode::Fetch { lease: None, .. } | GetMetaMode::Insert { .. } => Resend::Tagged,
        }
    }

    /// How long the request may wait for samples (a fetch with [`Wait::For`]).
    pub fn longest_wait(&self) -> Duration {
        match &self.mode {
            GetMetaMode::Fetch {
                wait: Wait::For(d), ..
            } => *d,
            _ => Duration::ZERO,
        }
    }

    /// A forced fetch only reads.
    pub fn changes_state(&self) -> bool {
        !matches!(self.mode, GetMetaMode::Force)
    }
}
