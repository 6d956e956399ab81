//! Builds the storage backend a configuration names. Built-in backends are cargo features;
//! custom ones are registered by name ([`crate::ClientBuilder::backend`]).

use crate::config::{Backend, Config};
use std::collections::BTreeMap;
use std::sync::Arc;
use tq_core::{Error, MergeRegistry, Result, StorageManager};

/// Makes a custom storage backend from the client's configuration and the merge functions
/// registered with the builder (a backend that supports `update` should honour them).
pub type BackendFactory =
    Arc<dyn Fn(&Config, &MergeRegistry) -> Result<Arc<dyn StorageManager>> + Send + Sync>;

/// Custom backends by the name `storage.backend` uses.
pub(crate) type BackendRegistry = BTreeMap<String, BackendFactory>;

/// The storage `config` names, for a controller in epoch `epoch` (KV keys carry it).
pub(crate) fn build(
    config: &Config,
    merges: MergeRegistry,
    custom: &BackendRegistry,
    epoch: u64,
) -> Result<Arc<dyn StorageManager>> {
    match &config.storage.backend {
        Backend::Simple => simple(config, merges),
        Backend::Kv => kv(config, merges, epoch),
        Backend::Custom(name) => match custom.get(name) {
            Some(factory) => factory(config, &merges),
            None => Err(Error::invalid(format!(
                "storage.backend `{name}` is not a built-in backend (simple, kv) and none is registered \
                 under that name (ClientBuilder::backend); registered: [{}]",
                custom.keys().cloned().collect::<Vec<_>>().join(", ")
            ))),
        },
    }
}

#[cfg(feature = "simple")]
fn simple(config: &Config, merges: MergeRegistry) -> Result<Arc<dyn StorageManager>> {
    let s = &config.storage;
    #[cfg(feature = "ssd")]
    if s.ssd.enabled {
        let units = (0..s.num_units)
            .map(|i| {
                let unit = tq_backend_ssd::SsdUnit::new(
                    format!("unit-{i}"),
                    tq_unit::UnitConfig {
                        capacity: s.capacity_per_unit,
                        compaction_threshold: s.compaction_threshold,
                        merge_registry: merges.clone(),
                    },
                    s.ssd.clone(),
                )?;
                Ok(tq_unit::MeteredUnit::wrap(tq_unit::GatedUnit::wrap(
                    Arc::new(unit),
                )))
            })
            .collect::<Result<Vec<_>>>()?;
        return Ok(Arc::new(tq_backend_simple::SimpleStorage::new(units)?));
    }
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

#[cfg(not(feature = "simple"))]
fn simple(_: &Config, _: MergeRegistry) -> Result<Arc<dyn StorageManager>> {
    Err(crate::config::feature_off(
        "storage.backend = \"simple\"",
        "simple",
    ))
}

#[cfg(feature = "kv")]
fn kv(config: &Config, merges: MergeRegistry, epoch: u64) -> Result<Arc<dyn StorageManager>> {
    Ok(Arc::new(
        config
            .storage
            .kv
            .build_in_epoch(epoch)?
            .with_merge_registry(merges),
    ))
}

#[cfg(not(feature = "kv"))]
fn kv(_: &Config, _: MergeRegistry, _: u64) -> Result<Arc<dyn StorageManager>> {
    Err(crate::config::feature_off("storage.backend = \"kv\"", "kv"))
}
