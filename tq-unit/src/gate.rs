//! [`GatedUnit`]: the wrapper that lets a checkpoint hold a unit's writes and capture its cells
//! (the steps are described in [`tq_core::cells`]).
//!
//! The gate sits where the unit is owned (around the in-process units of an embedded
//! deployment, and inside a storage-unit server), so that it holds the writes of every
//! client, not only of the one taking the checkpoint. Which operations a hold stops is the
//! operation table's `held` (`ops.rs`).

use crate::api::StorageUnit;
use crate::layer::{CheckpointSteps, Layered, UnitCall, UnitLayer};
use crate::ops::UnitOp;
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tq_core::cells::{page_of, CaptureInfo, CellPage, FieldCells};
use tq_core::{Error, Result};

/// A capture nobody asked a page of for this long is dropped (its taker died).
const CAPTURE_IDLE: Duration = Duration::from_secs(600);

struct Capture {
    cells: Arc<Vec<FieldCells>>,
    last_used: Instant,
}

#[derive(Default)]
struct GateState {
    /// Puts and clears wait while this is in the future.
    held_until: Option<Instant>,
    captures: HashMap<u64, Capture>,
    next_id: u64,
}

/// A unit whose puts and clears a checkpoint can hold for a moment; see the module docs.
pub type GatedUnit = Layered<CheckpointGate>;

impl GatedUnit {
    pub fn new(inner: Arc<dyn StorageUnit>) -> Self {
        Layered::with_layer(inner, CheckpointGate::default())
    }

    /// `unit` behind a gate, as a trait object.
    pub fn wrap(unit: Arc<dyn StorageUnit>) -> Arc<dyn StorageUnit> {
        Arc::new(GatedUnit::new(unit))
    }
}

/// The gate's layer: the hold, and the captures taken under it.
#[derive(Default)]
pub struct CheckpointGate {
    state: Mutex<GateState>,
    opened: Notify,
}

impl CheckpointGate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lift(&self) {
        self.lock().held_until = None;
        self.opened.notify_waiters();
    }

    /// Returns once no hold is in place (or the hold's time is up).
    async fn wait_open(&self, unit: &str) {
        // No hold (every write outside a checkpoint): no waiter to register.
        if self.lock().held_until.is_none() {
            return;
        }
        loop {
            let opened = self.opened.notified();
            tokio::pin!(opened);
            // Registered before the check, so a lift between the check and the wait is seen.
            opened.as_mut().enable();
            let until = {
                let mut st = self.lock();
                match st.held_until {
                    Some(t) if t > Instant::now() => t,
                    Some(_) => {
                        st.held_until = None;
                        return;
                    }
                    None => return,
                }
            };
            tracing::debug!(unit = %unit, "write waits for a checkpoint capture");
            let _ = tokio::time::timeout_at(until, opened).await;
        }
    }
}

impl UnitLayer for CheckpointGate {
    async fn around<'a, T: Send + 'a>(
        &'a self,
        unit: &'a str,
        op: UnitOp,
        _rows: u64,
        call: UnitCall<'a, T>,
    ) -> Result<T> {
        if op.spec().held {
            self.wait_open(unit).await;
        }
        call.await
    }

    fn checkpoint_steps(&self) -> Option<&dyn CheckpointSteps> {
        Some(self)
    }
}

#[async_trait]
impl CheckpointSteps for CheckpointGate {
    async fn hold_writes(&self, unit: &dyn StorageUnit, ttl: Duration) -> Result<()> {
        let now = Instant::now();
        let mut st = self.lock();
        if st.held_until.is_some_and(|t| t > now) {
            return Err(Error::unavailable(format!(
                "storage unit `{}`: another checkpoint holds its writes; try again when it is done",
                unit.id()
            )));
        }
        st.held_until = Some(now + ttl);
        tracing::debug!(unit = %unit.id(), ttl_ms = ttl.as_millis() as u64, "writes held for a checkpoint");
        Ok(())
    }

    async fn capture_cells(&self, unit: &dyn StorageUnit) -> Result<CaptureInfo> {
        let still_held = self.lock().held_until.is_some_and(|t| t > Instant::now());
        if !still_held {
            return Err(Error::unavailable(format!(
                "storage unit `{}`: the checkpoint's hold expired before its capture (writes may \
                 have deleted cells the controller state still lists); take the checkpoint again",
                unit.id()
            )));
        }
        let captured = unit.all_cells().await;
        self.lift();
        let cells = captured?;
        let now = Instant::now();
        let mut st = self.lock();
        st.captures
            .retain(|_, c| now.duration_since(c.last_used) < CAPTURE_IDLE);
        st.next_id += 1;
        let info = CaptureInfo {
            id: st.next_id,
            cells: cells.iter().map(|f| f.values.len() as u64).sum(),
            bytes: cells.iter().map(FieldCells::nbytes).sum(),
        };
        st.captures.insert(
            info.id,
            Capture {
                cells: Arc::new(cells),
                last_used: now,
            },
        );
        Ok(info)
    }

    async fn capture_page(
        &self,
        unit: &dyn StorageUnit,
        capture: u64,
        offset: u64,
        max_bytes: u64,
    ) -> Result<CellPage> {
        let cells = {
            let mut st = self.lock();
            let Some(c) = st.captures.get_mut(&capture) else {
                return Err(Error::not_found(format!(
                    "storage unit `{}` has no checkpoint capture {capture} (released, or idle \
                     for over {} s)",
                    unit.id(),
                    CAPTURE_IDLE.as_secs()
                )));
            };
            c.last_used = Instant::now();
            c.cells.clone()
        };
        Ok(page_of(&cells, offset, max_bytes))
    }

    async fn release_capture(&self, _unit: &dyn StorageUnit, capture: Option<u64>) -> Result<()> {
        match capture {
            Some(id) => {
                self.lock().captures.remove(&id);
            }
            None => self.lift(),
        }
        Ok(())
    }
}
