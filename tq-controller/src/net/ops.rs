//! Which `op_type` each controller request is metered under.

use super::*;

impl ControlRequest {
    /// The operation type this request counts as (see [`ControllerOp`]).
    pub(super) fn op(&self) -> ControllerOp {
        match self {
            ControlRequest::GetMeta(r) => match r.mode {
                GetMetaMode::Force => ControllerOp::GetPartitionMeta,
                _ => ControllerOp::GetMeta,
            },
            ControlRequest::Notify(_) => ControllerOp::NotifyDataUpdate,
            ControlRequest::SetTags { .. } => ControllerOp::SetCustomMeta,
            ControlRequest::MarkClearing { .. } => ControllerOp::MarkClearing,
            ControlRequest::Release { .. } => ControllerOp::ClearMeta,
            ControlRequest::BeginClearFields { .. } => ControllerOp::MarkClearingFields,
            ControlRequest::FinishClearFields { .. } => ControllerOp::ClearFields,
            ControlRequest::KvRetrieveMeta { .. } => ControllerOp::KvRetrieveMeta,
            ControlRequest::KvList { .. } => ControllerOp::KvList,
            ControlRequest::ProductionStatus { .. } => ControllerOp::GetProduction,
            ControlRequest::ConsumptionStatus { .. } => ControllerOp::GetConsumption,
            ControlRequest::ResetConsumption { .. } => ControllerOp::ResetConsumption,
            ControlRequest::ListPartitions => ControllerOp::GetListPartitions,
            ControlRequest::Ack { .. } => ControllerOp::Ack,
            ControlRequest::MarkComplete { .. } => ControllerOp::MarkComplete,
            ControlRequest::DropPartition { .. } => ControllerOp::ClearPartition,
            ControlRequest::KvLink(_) => ControllerOp::KvLink,
            ControlRequest::KvUnlink { .. } => ControllerOp::KvUnlink,
            ControlRequest::MarkUnlinkedPublic { .. } => ControllerOp::MarkUnlinkedPublic,
            ControlRequest::PrepareWrite { .. } => ControllerOp::PrepareWrite,
            ControlRequest::KvPreparePut { .. } => ControllerOp::KvPreparePut,
            ControlRequest::KvMarkClearing { .. } => ControllerOp::KvMarkClearing,
            ControlRequest::StillHold { .. } => ControllerOp::StillHold,
            ControlRequest::RegisterUnit(_) => ControllerOp::RegisterUnit,
            ControlRequest::Topology => ControllerOp::GetTopology,
            ControlRequest::Status => ControllerOp::Status,
            ControlRequest::Snapshot | ControlRequest::Restore => ControllerOp::Checkpoint,
        }
    }
}
