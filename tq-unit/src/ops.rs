//! The storage-unit plane's operation table: every operation a [`crate::StorageUnit`] answers,
//! declared once with its `op_type` label, how a lost answer may be resent, whether the
//! storage role's request metrics count it, and whether a checkpoint's hold makes it wait.
//!
//! Everything that treats operations differently reads it from here: [`crate::MeteredUnit`]
//! (which operations it meters, under which label), [`crate::GatedUnit`] (which operations a
//! hold stops), the remote stub (whether the transport may resend a request) and the unit
//! server (the label of its log line and of a refused request's metrics). The forwarding to
//! the wrapped unit is written once, in [`crate::Layered`].
//!
//! Adding an operation: a variant here and its row in [`UnitOp::spec`], the trait method in
//! `api.rs` (with a default if existing units need not answer it), its forwarding in
//! `layer.rs`, and, if it crosses the network, its request and reply in `net/wire.rs` with
//! the stub's call and the server's arm.

use tq_core::Resend;

/// One operation of the storage-unit plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnitOp {
    /// Writes the cells of some samples (`StorageUnit::put`).
    Put,
    /// Reads cells (`get`, `get_into`).
    Get,
    /// Merges values into stored cells (`update`).
    Update,
    /// Deletes cells (`clear`).
    Clear,
    /// The unit's counters (`stats`).
    Stats,
    /// Every cell at once, for a checkpoint capture (`all_cells`; in process only).
    AllCells,
    /// Holds puts and clears for a checkpoint (`hold_writes`).
    Hold,
    /// Captures the cells under a hold and lifts it (`capture_cells`).
    Capture,
    /// A page of a capture (`capture_page`).
    Page,
    /// Drops a capture or lifts a hold (`release_capture`).
    Release,
    /// Adopts a controller epoch (`enter_epoch`).
    EnterEpoch,
    /// Where a unit server's shared-memory channel listens: answered by the server itself
    /// (`net/shm`), not by the unit.
    SharedMemory,
}

/// What the table says about one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitOpSpec {
    /// The `op_type` label (the original's `PUT_DATA`, `GET_DATA`, `CLEAR_DATA`, plus tq's).
    pub label: &'static str,
    /// Whether a request whose answer was lost may be sent again.
    pub resend: Resend,
    /// Whether `tq_storage_request_*{op_type}` counts it (the data path; administrative
    /// requests are not metered).
    pub metered: bool,
    /// Whether a checkpoint's hold makes it wait: the operations that remove or replace a cell
    /// a capture must still find. An update merges into a cell but never removes one.
    pub held: bool,
}

impl UnitOp {
    /// Every operation, in the table's order.
    pub const ALL: &'static [UnitOp] = &[
        UnitOp::Put,
        UnitOp::Get,
        UnitOp::Update,
        UnitOp::Clear,
        UnitOp::Stats,
        UnitOp::AllCells,
        UnitOp::Hold,
        UnitOp::Capture,
        UnitOp::Page,
        UnitOp::Release,
        UnitOp::EnterEpoch,
        UnitOp::SharedMemory,
    ];

    /// The table: one row per operation.
    pub const fn spec(self) -> UnitOpSpec {
        use Resend::{Freely, Never};
        let (label, resend, metered, held) = match self {
            // A put writes the same cells under the same generation again: harmless.
            UnitOp::Put => ("PUT_DATA", Freely, true, true),
            UnitOp::Get => ("GET_DATA", Freely, true, false),
            // A merge applied twice adds twice.
            UnitOp::Update => ("UPDATE_DATA", Never, true, false),
            // Clears only remove cells at or below a generation: idempotent.
            UnitOp::Clear => ("CLEAR_DATA", Freely, true, true),
            UnitOp::Stats => ("STATS", Freely, false, false),
            UnitOp::AllCells => ("ALL_CELLS", Freely, false, false),
            // A second hold would be refused as "another checkpoint holds its writes".
            UnitOp::Hold => ("CHECKPOINT_HOLD", Never, false, false),
            // A second capture would find the hold lifted by the first.
            UnitOp::Capture => ("CHECKPOINT_CAPTURE", Never, false, false),
            UnitOp::Page => ("CHECKPOINT_PAGE", Freely, false, false),
            UnitOp::Release => ("CHECKPOINT_RELEASE", Freely, false, false),
            UnitOp::EnterEpoch => ("ENTER_EPOCH", Freely, false, false),
            UnitOp::SharedMemory => ("SHARED_MEMORY", Freely, false, false),
        };
        UnitOpSpec {
            label,
            resend,
            metered,
            held,
        }
    }

    /// The `op_type` label.
    pub const fn label(self) -> &'static str {
        self.spec().label
    }

    /// The labels of the metered operations, in table order (the meter's slots).
    pub(crate) fn metered_labels() -> Vec<&'static str> {
        Self::ALL
            .iter()
            .filter(|op| op.spec().metered)
            .map(|op| op.label())
            .collect()
    }

    /// This operation's slot among [`UnitOp::metered_labels`], if it is metered.
    pub(crate) fn meter_slot(self) -> Option<usize> {
        self.spec().metered.then(|| {
            Self::ALL
                .iter()
                .filter(|op| op.spec().metered)
                .take_while(|op| **op != self)
                .count()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_unique_and_the_original_data_labels_are_kept() {
        let mut labels: Vec<_> = UnitOp::ALL.iter().map(|op| op.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), UnitOp::ALL.len());
        assert_eq!(
            UnitOp::metered_labels(),
            ["PUT_DATA", "GET_DATA", "UPDATE_DATA", "CLEAR_DATA"]
        );
        for (slot, op) in [UnitOp::Put, UnitOp::Get, UnitOp::Update, UnitOp::Clear]
            .into_iter()
            .enumerate()
        {
            assert_eq!(op.meter_slot(), Some(slot));
        }
        assert_eq!(UnitOp::Stats.meter_slot(), None);
    }

    #[test]
    fn only_removals_wait_for_a_hold_and_only_merges_and_checkpoint_steps_are_never_resent() {
        let held: Vec<_> = UnitOp::ALL.iter().filter(|op| op.spec().held).collect();
        assert_eq!(held, [&UnitOp::Put, &UnitOp::Clear]);
        let never: Vec<_> = UnitOp::ALL
            .iter()
            .filter(|op| op.spec().resend == Resend::Never)
            .collect();
        assert_eq!(never, [&UnitOp::Update, &UnitOp::Hold, &UnitOp::Capture]);
    }
}
