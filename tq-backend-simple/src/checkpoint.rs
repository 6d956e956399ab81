//! [`PayloadCheckpoint`] for [`SimpleStorage`]: a checkpoint copies the cells of every unit
//! (in-process, SSD or remote), each unit holding its writes through its [`tq_unit::GatedUnit`].

use crate::SimpleStorage;
use async_trait::async_trait;
use futures::future::join_all;
use std::collections::BTreeMap;
use std::time::Duration;
use tq_core::cells::{CaptureInfo, CellPage, FieldCells, PayloadCheckpoint};
use tq_core::{Error, Result};
use tq_unit::{StorageUnit, UnitPut, UnitRows};

/// The first error of per-unit results, naming its unit; or every unit's answer.
fn all_ok<T>(units: &[std::sync::Arc<dyn StorageUnit>], results: Vec<Result<T>>) -> Result<Vec<T>> {
    results
        .into_iter()
        .zip(units)
        .map(|(r, u)| r.map_err(|e| e.context(format!("storage unit `{}`", u.id()))))
        .collect()
}

impl SimpleStorage {
    fn part(&self, part: usize) -> Result<&std::sync::Arc<dyn StorageUnit>> {
        self.units().get(part).ok_or_else(|| {
            Error::invalid(format!(
                "storage unit {part} does not exist (this deployment has {})",
                self.units().len()
            ))
        })
    }
}

#[async_trait]
impl PayloadCheckpoint for SimpleStorage {
    fn parts(&self) -> usize {
        self.units().len()
    }

    async fn hold(&self, ttl: Duration) -> Result<()> {
        let units = self.units();
        let results = join_all(units.iter().map(|u| u.hold_writes(ttl))).await;
        let taken: Vec<bool> = results.iter().map(Result::is_ok).collect();
        if let Err(e) = all_ok(units, results) {
            // Lift the holds this call took (writers should not wait out the ttl), and only
            // those: a unit that refused is held by another checkpoint.
            let lifts = units
                .iter()
                .zip(taken)
                .filter(|(_, taken)| *taken)
                .map(|(u, _)| u.release_capture(None));
            join_all(lifts).await;
            return Err(e);
        }
        Ok(())
    }

    async fn capture(&self) -> Result<Vec<CaptureInfo>> {
        let units = self.units();
        let results = join_all(units.iter().map(|u| u.capture_cells())).await;
        let captured: Vec<Option<u64>> = results
            .iter()
            .map(|r| r.as_ref().ok().map(|c| c.id))
            .collect();
        match all_ok(units, results) {
            Ok(infos) => Ok(infos),
            Err(e) => {
                // Forget the captures taken; a unit whose capture failed lifted its hold anyway.
                let drops = units
                    .iter()
                    .zip(captured)
                    .filter_map(|(u, id)| id.map(|id| u.release_capture(Some(id))));
                join_all(drops).await;
                Err(e)
            }
        }
    }

    async fn page(
        &self,
        part: usize,
        capture: u64,
        offset: u64,
        max_bytes: u64,
    ) -> Result<CellPage> {
        let unit = self.part(part)?;
        unit.capture_page(capture, offset, max_bytes)
            .await
            .map_err(|e| e.context(format!("storage unit `{}`", unit.id())))
    }

    async fn release(&self, captures: &[CaptureInfo]) {
        let units = self.units();
        let calls = units.iter().enumerate().map(|(i, u)| async move {
            // A unit that captured lifted its hold then; lifting again could lift the hold of
            // a checkpoint that started since. Only a unit without a capture still holds ours.
            let released = match captures.get(i) {
                Some(c) => u.release_capture(Some(c.id)).await,
                None => u.release_capture(None).await,
            };
            if let Err(e) = released {
                tracing::warn!(unit = %u.id(), error = %e, "could not release a checkpoint capture; it is dropped when idle");
            }
        });
        join_all(calls).await;
    }

    async fn stored_cells(&self) -> Result<Vec<u64>> {
        Ok(self.stats().await?.iter().map(|s| s.cells as u64).collect())
    }

    async fn enter_epoch(&self, epoch: u64) -> Result<()> {
        let units = self.units();
        let results = join_all(units.iter().map(|u| u.enter_epoch(epoch))).await;
        all_ok(units, results).map(|_| ())
    }

    /// Each cell goes to the unit that holds its sample now ([`SimpleStorage::unit_for`]),
    /// whichever part saved it: a checkpoint written before routing by runs saved index `i`
    /// in part `i % units`.
    async fn load(&self, part: usize, cells: Vec<FieldCells>) -> Result<()> {
        self.part(part)?;
        for fc in cells {
            if fc.samples.len() != fc.values.len() {
                return Err(Error::corrupted(format!(
                    "checkpoint cells of storage unit {part}: field `{}` has {} samples and {} \
                     values",
                    fc.field,
                    fc.samples.len(),
                    fc.values.len()
                )));
            }
            let routes = self.route(&fc.samples);
            for (u, positions) in routes.iter().enumerate() {
                if positions.is_empty() {
                    continue;
                }
                let unit = self.part(u)?;
                let put = UnitPut {
                    samples: positions.iter().map(|&p| fc.samples[p]).collect(),
                    fields: BTreeMap::from([(
                        fc.field.clone(),
                        UnitRows::shared(positions.iter().map(|&p| fc.values[p].clone()).collect()),
                    )]),
                };
                unit.put(put).await.map_err(|e| {
                    e.context(format!(
                        "loading field `{}` of checkpoint part {part} into storage unit `{}`",
                        fc.field,
                        unit.id()
                    ))
                })?;
            }
        }
        Ok(())
    }
}
