//! A complete storage backend in one file: [`TinyStorage`] keeps cells in a `HashMap` behind a
//! mutex and implements `StorageManager` (docs/backends-guide.md walks through it).
//!
//! Run it: `cargo run -p tq --example custom_storage --features testkit` (a put/get through a
//! client built on it). Its conformance test — the kit, in one call — runs with
//! `cargo test -p tq --example custom_storage --features testkit`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tq::storage::{async_trait, Capabilities, FieldFilter, PutReceipt, StorageManager};
use tq::{Batch, BatchMeta, Column, Error, MergeOp, Result, SampleId, Value};

/// One stored cell: the generation of the sample that wrote it, and the value.
type Cells = HashMap<(u32, String), (u32, Value)>;

/// Cells keyed by (sample index, field). The whole backend is one mutex: every operation is
/// atomic, which is what the contracts below need and nothing more.
#[derive(Default)]
pub struct TinyStorage {
    cells: Mutex<Cells>,
}

impl TinyStorage {
    fn lock(&self) -> std::sync::MutexGuard<'_, Cells> {
        self.cells.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The newest generation stored for `index`, if any cell of it is stored.
fn stored_generation(cells: &Cells, index: u32) -> Option<u32> {
    cells
        .iter()
        .filter(|((i, _), _)| *i == index)
        .map(|(_, (g, _))| *g)
        .max()
}

#[async_trait]
impl StorageManager for TinyStorage {
    fn name(&self) -> &str {
        "tiny"
    }

    fn capabilities(&self) -> Capabilities {
        // No in-place update, no deferred expiry, no shared-payload links: the client and the
        // controller check these and never ask for what is not declared.
        Capabilities::default()
    }

    async fn put(&self, meta: &BatchMeta, batch: &Batch) -> Result<PutReceipt> {
        if batch.len() != meta.len() {
            return Err(Error::invalid(format!(
                "tiny: {} rows for {} samples",
                batch.len(),
                meta.len()
            )));
        }
        let mut cells = self.lock();
        // Check everything first, so that a refused put changes nothing.
        for s in meta.samples() {
            if stored_generation(&cells, s.index).is_some_and(|g| g > s.generation) {
                return Err(Error::conflict(format!(
                    "tiny: sample {s} is stale: index {} holds a newer generation",
                    s.index
                )));
            }
        }
        for (row, s) in meta.samples().iter().enumerate() {
            // A newer generation replaces every cell of the older sample at this index.
            cells.retain(|(i, _), (g, _)| *i != s.index || *g >= s.generation);
            for (field, column) in batch.columns() {
                cells.insert((s.index, field.clone()), (s.generation, column.value(row)));
            }
        }
        Ok(PutReceipt {
            schemas: batch.schemas(),
            backend_meta: None,
        })
    }

    async fn get(&self, meta: &BatchMeta) -> Result<Batch> {
        if meta.has_links() {
            return Err(Error::unsupported("read of linked fields", self.name()));
        }
        let cells = self.lock();
        let mut out = Batch::empty(meta.len());
        for field in meta.field_names() {
            let values = meta
                .samples()
                .iter()
                .map(
                    |s: &SampleId| match cells.get(&(s.index, field.to_string())) {
                        Some((g, v)) if *g == s.generation => Ok(v.clone()),
                        _ => Err(Error::not_found(format!(
                            "tiny: field `{field}` of sample {s} is not stored"
                        ))),
                    },
                )
                .collect::<Result<Vec<_>>>()?;
            out.insert(field, Column::from_values(field, values)?)?;
        }
        Ok(out)
    }

    async fn update(&self, _: &BatchMeta, _: &Batch, _: &MergeOp) -> Result<PutReceipt> {
        Err(Error::unsupported("update", self.name()))
    }

    async fn clear(&self, meta: &BatchMeta, fields: &FieldFilter) -> Result<()> {
        let mut cells = self.lock();
        for s in meta.samples() {
            // Only this generation or older: a stale clear never removes a newer sample.
            cells.retain(|(i, f), (g, _)| {
                !(*i == s.index && *g <= s.generation && fields.includes(f))
            });
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let tq = tq::Client::builder()
        .config(tq::Config::default())
        .storage(Arc::new(TinyStorage::default()))
        .build()?;
    let batch = Batch::from_columns([(
        "x",
        Column::Dense(tq::Tensor::from_slice(vec![2, 2], &[1i64, 2, 3, 4])?),
    )])?;
    let p = tq.partition("demo");
    p.kv_batch_put(&["a", "b"], &batch, None).await?;
    let back = p.kv_batch_get(&["b", "a"], None).await?;
    println!(
        "custom_storage: read {} rows back from `{}`",
        back.len(),
        tq.storage().name()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tiny_storage_passes_the_conformance_kit() {
        tq::testkit::storage::run_all(|| async {
            Arc::new(TinyStorage::default()) as Arc<dyn StorageManager>
        })
        .await;
    }
}
