//! Which KV stores a checkpoint's payloads stay in, and whether a deployment has them.

use tq_core::{Error, Result};

/// The store names of a KV storage name (`kv(a,b=redis)` → `a`, `b`); `None` for other storage.
fn kv_store_names(storage: &str) -> Option<Vec<&str>> {
    let inner = storage.strip_prefix("kv(")?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|s| s.split_once('=').map_or(s, |(name, _)| name))
            .collect(),
    )
}

/// A checkpoint whose payloads stayed in their KV stores is loaded into a deployment that has
/// each of those stores under the same name (cells name their store by it): otherwise every
/// read would fail after a load that reported success. Refused before anything changes.
pub(super) fn check_same_stores(saved: &str, ours: &str, manifest: &str) -> Result<()> {
    let (Some(theirs), Some(mine)) = (kv_store_names(saved), kv_store_names(ours)) else {
        return Ok(());
    };
    if let Some(missing) = theirs.iter().find(|n| !mine.contains(n)) {
        return Err(Error::invalid(format!(
            "checkpoint: `{manifest}` was saved from storage `{saved}`, whose cells stay in store \
             `{missing}`, and this deployment's storage is `{ours}`, which has no store of that \
             name: no cell would be found. Load it into a deployment with the same stores, or \
             give the store that holds them `name = \"{missing}\"` in [[storage.kv.stores]]"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod store_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_checkpoint_loads_only_where_its_stores_are() {
        assert_eq!(kv_store_names("kv(a,b=redis)").unwrap(), ["a", "b"]);
        assert_eq!(kv_store_names("simple"), None);
        // The same stores, more stores, or storage units: fine.
        check_same_stores("kv(redis)", "kv(redis)", "m").unwrap();
        check_same_stores("kv(redis)", "kv(redis,big=file)", "m").unwrap();
        check_same_stores("simple", "kv(redis)", "m").unwrap();
        // A Redis checkpoint into a Redis Cluster deployment: refused, naming the fix.
        let e =
            check_same_stores("kv(redis)", "kv(redis+cluster)", "dir/MANIFEST.toml").unwrap_err();
        assert_eq!(e.kind(), &tq_core::ErrorKind::Invalid);
        assert!(e.message().contains("name = \"redis\""), "{e}");
        assert!(e.message().contains("dir/MANIFEST.toml"), "{e}");
    }
}
