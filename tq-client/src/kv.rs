//! The KV API of [`Client`]: samples named by string keys (reached through
//! [`crate::Partition`]). Writes are checked by the controller as it resolves the keys, so a
//! refused write never reaches storage; small reads may overlap the key lookup with the
//! storage read (`key_cache`).

use crate::client::{check_batch, owned_fields, owned_keys};
use crate::key_cache::{tensor_bytes, SPECULATE_MAX_BYTES, SPECULATE_MAX_KEYS};
use crate::{Client, KvBatchMeta};
use std::collections::{BTreeSet, HashSet};
use tq_controller::KeyListing;
use tq_core::{Batch, BatchMeta, Error, FieldName, Result, Tags};

impl Client {
    /// Writes one key: `fields` is a one-row batch; `tags` are merged into the key's tags.
    pub(crate) async fn kv_put(
        &self,
        partition: &str,
        key: &str,
        fields: Option<&Batch>,
        tags: Option<Tags>,
    ) -> Result<KvBatchMeta> {
        if let Some(b) = fields {
            if b.len() != 1 {
                return Err(Error::invalid(format!(
                    "partition `{partition}`: kv_put of key `{key}` needs a one-row batch, got {} rows",
                    b.len()
                )));
            }
        }
        self.kv_batch_put(partition, &[key], fields, tags.map(|t| vec![t]))
            .await
    }

    /// Writes several keys at once (created on first use). Row `i` of `fields` and `tags[i]`
    /// belong to `keys[i]`. Everything is validated before anything changes; if the storage
    /// write fails, keys this call created are removed again.
    pub(crate) async fn kv_batch_put<K: AsRef<str>>(
        &self,
        partition: &str,
        keys: &[K],
        fields: Option<&Batch>,
        tags: Option<Vec<Tags>>,
    ) -> Result<KvBatchMeta> {
        let keys = owned_keys(partition, keys)?;
        if fields.is_none() && tags.is_none() {
            return Err(Error::invalid(format!(
                "partition `{partition}`: kv put needs fields, tags or both"
            )));
        }
        if let Some(b) = fields {
            check_batch(partition, b)?;
            if b.len() != keys.len() {
                return Err(Error::invalid(format!(
                    "partition `{partition}`: batch has {} rows for {} keys",
                    b.len(),
                    keys.len()
                )));
            }
        }
        if let Some(t) = &tags {
            if t.len() != keys.len() {
                return Err(Error::invalid(format!(
                    "partition `{partition}`: {} tag maps for {} keys",
                    t.len(),
                    keys.len()
                )));
            }
        }
        let types = fields.map(Batch::type_schemas).unwrap_or_default();
        let kv = self.kv_prepare_put(partition, &keys, &types).await?;
        if kv.keys != keys {
            return Err(Error::internal(format!(
                "partition `{partition}`: key resolution returned {} of {} keys",
                kv.keys.len(),
                keys.len()
            )));
        }
        let meta = kv.meta;
        let given = tags.unwrap_or_else(|| vec![Tags::new(); keys.len()]);
        let mut merged: Vec<Tags> = meta.tags().to_vec();
        for (mine, t) in merged.iter_mut().zip(&given) {
            mine.extend(t.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        let mut field_set: BTreeSet<FieldName> = meta.field_names().map(str::to_string).collect();
        match fields {
            Some(batch) => {
                // The receipt is only needed to remember what the keys now hold.
                let remember = self.key_cache.is_some() && keys.len() <= SPECULATE_MAX_KEYS;
                let receipt = match self.store_and_publish(&meta, given, batch, remember).await {
                    Ok(r) => r,
                    Err(e) => {
                        self.remove_created(partition, &meta, &kv.missing, &keys)
                            .await;
                        return Err(e);
                    }
                };
                if let (Some(receipt), Some(cache)) = (receipt, &self.key_cache) {
                    let mut now = meta.clone();
                    now.tags_mut().clone_from_slice(&merged);
                    now.add_fields(receipt.schemas, receipt.backend_meta)?;
                    // Only the fields every key holds (with their backend meta), as a lookup
                    // answers: the cached guess must equal the lookup to be used.
                    let held: Vec<String> = now.field_names().map(str::to_string).collect();
                    cache.remember(partition, &keys, &now.select_fields(&held)?);
                }
                field_set.extend(batch.field_names().map(str::to_string));
            }
            None => {
                self.control()
                    .set_tags(partition, meta.samples(), given)
                    .await?
            }
        }
        Ok(KvBatchMeta {
            partition: partition.to_string(),
            keys,
            tags: merged,
            fields: field_set.into_iter().collect(),
        })
    }

    /// Resolves (creating) the keys of a put, checked for `types`. Keys a failed clear left
    /// hidden are cleared for good first (see `clear.rs`), then resolved again.
    async fn kv_prepare_put(
        &self,
        partition: &str,
        keys: &[String],
        types: &std::collections::BTreeMap<FieldName, tq_core::FieldMeta>,
    ) -> Result<tq_controller::KvMeta> {
        let kv = self
            .control()
            .kv_prepare_put(partition, keys, types)
            .await?;
        if kv.clearing.is_empty() {
            return Ok(kv);
        }
        tracing::debug!(partition, keys = ?kv.clearing, "finishing the clear of keys before a put");
        self.clear_keys(partition, &kv.clearing).await?;
        let kv = self
            .control()
            .kv_prepare_put(partition, keys, types)
            .await?;
        if !kv.clearing.is_empty() {
            return Err(Error::conflict(format!(
                "partition `{partition}`: keys {:?} are being cleared again by another client",
                kv.clearing
            )));
        }
        Ok(kv)
    }

    /// Best-effort removal of keys a failed put created, so no empty keys are left behind.
    async fn remove_created(
        &self,
        partition: &str,
        meta: &BatchMeta,
        created: &[String],
        keys: &[String],
    ) {
        if created.is_empty() {
            return;
        }
        let created: HashSet<&str> = created.iter().map(String::as_str).collect();
        let positions: Vec<usize> = keys
            .iter()
            .enumerate()
            .filter(|(_, k)| created.contains(k.as_str()))
            .map(|(i, _)| i)
            .collect();
        let result = match meta.select_samples(&positions) {
            Ok(m) => self.clear_samples(&m).await,
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            tracing::warn!(partition, error = %e, "could not remove keys created by a failed put");
        }
    }

    /// Reads keys. Every key must exist and every requested field be produced for every key;
    /// without `fields`, the fields all keys hold are returned. Rows follow `keys`' order.
    pub(crate) async fn kv_batch_get<K: AsRef<str>>(
        &self,
        partition: &str,
        keys: &[K],
        fields: Option<&[&str]>,
    ) -> Result<Batch> {
        let keys = owned_keys(partition, keys)?;
        let wanted = fields.map(|f| owned_fields(partition, f)).transpose()?;
        let lookup = self.control().kv_retrieve_meta(partition, &keys, false);
        // With a key cache, storage is read in parallel with the lookup, using what the cache
        // says the lookup will return; the read counts only if the lookup agrees (key_cache.rs).
        let (kv, early) = match self.speculation(partition, &keys, wanted.as_deref()) {
            Some(guess) => {
                let (kv, read) = futures::join!(lookup, self.get_data(&guess));
                (kv, Some((guess, read)))
            }
            None => (lookup.await, None),
        };
        let kv = kv?;
        if !kv.missing.is_empty() {
            if let Some(cache) = &self.key_cache {
                cache.forget(partition, Some(&kv.missing));
            }
            return Err(keys_not_found(partition, &kv.missing));
        }
        if let Some(cache) = &self.key_cache {
            cache.remember(partition, &kv.keys, &kv.meta);
        }
        let meta = match wanted {
            Some(f) => {
                if let Some(bad) = f
                    .iter()
                    .find(|f| !kv.meta.fields().contains_key(f.as_str()))
                {
                    // Not ready (it may be produced later), like a read without a field
                    // list whose keys hold nothing yet: `NotFound`, not a caller's mistake.
                    return Err(Error::not_found(format!(
                        "partition `{partition}`: field `{bad}` is not produced for every requested key \
                         (not produced yet, or cleared; fields all keys hold: {:?})",
                        kv.meta.field_names().collect::<Vec<_>>()
                    )));
                }
                kv.meta.select_fields(&f)?
            }
            None if kv.meta.fields().is_empty() => {
                // The keys exist but hold no field in common yet: not ready, never an empty
                // success.
                return Err(Error::not_found(format!(
                    "partition `{partition}`: keys {:?} hold no field in common yet (not produced)",
                    kv.keys
                )));
            }
            None => kv.meta,
        };
        if let (Some((guess, read)), Some(cache)) = (early, &self.key_cache) {
            let confirmed = guess == meta && read.is_ok();
            cache.record(confirmed);
            if confirmed {
                return read;
            }
            if let Err(e) = read {
                tracing::debug!(partition, error = %e, "speculative read dropped");
            }
        }
        self.get_data(&meta).await
    }

    /// The metadata to read storage with before the key lookup answers: the key cache's guess
    /// for a small request whose every key it knows; `None` means do not speculate.
    fn speculation(
        &self,
        partition: &str,
        keys: &[String],
        wanted: Option<&[FieldName]>,
    ) -> Option<BatchMeta> {
        let guess = self.key_cache.as_ref()?.guess(partition, keys)?;
        let guess = match wanted {
            Some(f) => guess.select_fields(f).ok()?,
            None => guess,
        };
        (!guess.fields().is_empty() && tensor_bytes(&guess) <= SPECULATE_MAX_BYTES).then_some(guess)
    }

    /// Keys and tags of `partition`, or of every partition. A missing partition lists nothing.
    pub(crate) async fn kv_list(&self, partition: Option<&str>) -> Result<Vec<KeyListing>> {
        self.control().kv_list(partition).await
    }
}

/// The error of a read that names keys the partition does not hold: it names the first as
/// ``key `k` `` (so `Error::subject` finds it) and lists all of them.
pub(crate) fn keys_not_found(partition: &str, missing: &[String]) -> Error {
    let first = missing.first().map(String::as_str).unwrap_or_default();
    let message = match missing.len() {
        1 => format!("partition `{partition}`: key `{first}` not found"),
        n => format!(
            "partition `{partition}`: key `{first}` not found ({n} keys missing: {missing:?})"
        ),
    };
    Error::not_found(message)
}
