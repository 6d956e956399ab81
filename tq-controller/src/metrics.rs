//! The controller's request metrics (`tq_controller_request_*{op_type}`): [`MeteredPlane`]
//! wraps any [`ControlPlane`] and records every operation under the original system's
//! `op_type` names, so the embedded controller and a controller server are measured the same
//! way. Its `ControlPlane` implementation is generated from the operation table (`ops.rs`,
//! which says what each operation counts); this file holds the wrapper and the two tagged
//! entry points a server calls. Snapshots, restores and status requests are not metered (as
//! in the original, where checkpoint requests are not).

use crate::api::*;
use crate::{ControlPlane, ControllerOp};
use std::sync::Arc;
use tq_core::telemetry::RequestMeter;
use tq_core::{BatchMeta, Result};

/// A [`ControlPlane`] that records `tq_controller_request_*` for every call it forwards.
pub struct MeteredPlane<P: ?Sized> {
    inner: Arc<P>,
    meter: RequestMeter,
}

impl<P: ControlPlane + ?Sized> MeteredPlane<P> {
    /// Meters `inner` with handles of the recorder installed now.
    pub fn new(inner: Arc<P>) -> Self {
        MeteredPlane {
            inner,
            meter: ControllerOp::meter(),
        }
    }

    /// The plane being metered.
    pub fn inner(&self) -> &Arc<P> {
        &self.inner
    }

    /// The meter, for requests refused before they reach the plane.
    pub fn meter(&self) -> &RequestMeter {
        &self.meter
    }
}

impl MeteredPlane<crate::Controller> {
    /// [`crate::Controller::get_meta_once`], metered as a `get_meta`.
    pub async fn get_meta_once(
        &self,
        req: GetMetaRequest,
        id: crate::RequestId,
    ) -> Result<BatchMeta> {
        let op = req.op_type();
        let work = self.inner.get_meta_once(req, id);
        measure_get_meta(&self.meter, op, work).await
    }
}

impl MeteredPlane<crate::Controller> {
    /// [`crate::Controller::notify_once`], metered as a production notice.
    pub async fn notify_once(
        &self,
        notice: ProductionNotice,
        id: crate::RequestId,
    ) -> Result<Vec<tq_core::BackendMeta>> {
        let rows = crate::ops::generate::rows(notice.samples.len());
        let op = ControllerOp::NotifyDataUpdate.index();
        let work = self.inner.notify_once(notice, id);
        self.meter.measure(op, rows, work).await
    }
}

async fn measure_get_meta(
    meter: &RequestMeter,
    op: ControllerOp,
    work: impl std::future::Future<Output = Result<BatchMeta>>,
) -> Result<BatchMeta> {
    use crate::ops::{meta_rows, unless_closed};
    meter
        .measure_with(op.index(), meta_rows, unless_closed, work)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_type_has_its_own_index_and_name() {
        let mut names = std::collections::HashSet::new();
        for (i, op) in ControllerOp::ALL.iter().enumerate() {
            assert_eq!(op.index(), i, "{op:?}");
            assert!(names.insert(op.name()), "{op:?}");
        }
    }
}
