//! Builds the storage backend a configuration names. Backends are cargo features.

use crate::config::{Backend, Config};
use std::sync::Arc;
use tq_core::{Result, StorageManager};

pub(crate) fn build(
    config: &Config,
    merges: tq_core::MergeRegistry,
) -> Result<Arc<dyn StorageManager>> {
    match config.storage.backend {
        #[cfg(feature = "simple")]
        Backend::Simple if config.storage.ssd.enabled => {
            let s = &config.storage;
            let units = (0..s.num_units)
                .map(|i| {
                    let unit = tq_backend_ssd::SsdUnit::new(
                        format!("unit-{i}"),
                        tq_backend_simple::UnitConfig {
                            capacity: s.capacity_per_unit,
                            compaction_threshold: s.compaction_threshold,
                            merge_registry: merges.clone(),
                        },
                        s.ssd.clone(),
                    )?;
                    Ok(Arc::new(unit) as Arc<dyn tq_backend_simple::StorageUnit>)
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Arc::new(tq_backend_simple::SimpleStorage::new(units)?))
        }
        Backend::Simple => {
            let s = &config.storage;
            let storage = tq_backend_simple::SimpleStorage::in_memory(
                s.num_units as usize,
                tq_backend_simple::SimpleConfig {
                    capacity_per_unit: s.capacity_per_unit,
                    compaction_threshold: s.compaction_threshold,
                    merge_registry: merges,
                },
            )?;
            Ok(Arc::new(storage))
        }
        Backend::Kv => Ok(Arc::new(config.storage.kv.build()?)),
        #[cfg(not(feature = "simple"))]
        Backend::Simple => {
            let _ = merges;
            Err(tq_core::Error::unsupported(
                "embedded storage",
                "simple (build tq-client with the `simple` feature)",
            ))
        }
    }
}
