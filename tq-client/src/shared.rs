//! kv_update (merge where the data lives) and kv_link (shared payloads in the public partition).

use crate::{Client, KvBatchMeta};
use tq_controller::{LinkRequest, ProductionNotice, PUBLIC_PARTITION};
use tq_core::{Batch, Error, FieldFilter, FieldName, MergeOp, Result, Tags};

/// Options of [`crate::Partition::kv_link`].
#[derive(Debug, Clone)]
pub struct LinkOptions {
    /// The public partition holding the payloads: `__public__` (default) or
    /// `__public__/<namespace>`, e.g. one per job so jobs cannot sweep each other.
    pub public_partition: String,
    /// Clear (through storage) a payload a destination field holds privately before linking
    /// it, instead of refusing the link.
    pub replace_private: bool,
}

impl Default for LinkOptions {
    fn default() -> Self {
        LinkOptions {
            public_partition: PUBLIC_PARTITION.to_string(),
            replace_private: false,
        }
    }
}

fn keys_of<K: AsRef<str>>(keys: &[K]) -> Vec<String> {
    keys.iter().map(|k| k.as_ref().to_string()).collect()
}

impl Client {
    /// Merges the one-row `fields` into the stored cells of `key` with `merge`; see
    /// [`Client::kv_batch_update`].
    pub(crate) async fn kv_update(
        &self,
        partition: &str,
        key: &str,
        fields: &Batch,
        merge: &MergeOp,
    ) -> Result<KvBatchMeta> {
        if fields.len() != 1 {
            return Err(Error::invalid(format!(
                "partition `{partition}`: kv_update of key `{key}` needs a one-row batch, got {} rows",
                fields.len()
            )));
        }
        self.kv_batch_update(partition, &[key], fields, merge).await
    }

    /// Merges row `i` of `fields` into the stored cells of `keys[i]`, on the storage units that
    /// hold them (the stored payload never travels to the client).
    ///
    /// Every key must exist and every field be produced for every key (else `Invalid`, nothing
    /// written); linked fields and linked public samples are refused. Each unit computes and
    /// checks every result, then commits once (all-or-nothing per unit; not across units).
    /// Consumption and tags do not change. Never retried: if this returns an error after the
    /// storage step, storage may already hold the merged values, and the message says so.
    pub(crate) async fn kv_batch_update<K: AsRef<str>>(
        &self,
        partition: &str,
        keys: &[K],
        fields: &Batch,
        merge: &MergeOp,
    ) -> Result<KvBatchMeta> {
        let keys = crate::client::owned_keys(partition, keys)?;
        if fields.columns().is_empty() {
            return Err(Error::invalid(format!(
                "partition `{partition}`: kv_update needs at least one field"
            )));
        }
        if fields.len() != keys.len() {
            return Err(Error::invalid(format!(
                "partition `{partition}`: batch has {} rows for {} keys",
                fields.len(),
                keys.len()
            )));
        }
        if !self.storage().capabilities().update {
            return Err(Error::unsupported("kv_update", self.storage().name()));
        }
        let names: Vec<FieldName> = fields.field_names().map(str::to_string).collect();
        let kv = self
            .control()
            .kv_retrieve_meta(partition, &keys, false)
            .await?;
        if !kv.missing.is_empty() {
            return Err(Error::invalid(format!(
                "partition `{partition}`: kv_update of keys that do not exist: {:?}",
                kv.missing
            )));
        }
        if let Some(f) = names
            .iter()
            .find(|f| !kv.meta.fields().contains_key(f.as_str()))
        {
            return Err(Error::invalid(format!(
                "partition `{partition}`: kv_update of field `{f}`, which is not produced for every key"
            )));
        }
        let meta = kv.meta.select_fields(&names)?;
        let types = meta
            .fields()
            .iter()
            .map(|(f, s)| (f.clone(), s.clone()))
            .collect();
        let current = self
            .control()
            .prepare_write(partition, meta.samples(), &types)
            .await?;
        // Storage sees the backend meta of every field the samples hold, so a backend with a
        // TTL re-arms the deadline of the whole sample, not only of the updated cells.
        let meta = meta.with_backend_meta(current.backend_meta().to_vec())?;
        let receipt = self.storage().update(&meta, fields, merge).await?;
        let placed = receipt.backend_meta.clone();
        let notified = self
            .control()
            .notify_production(ProductionNotice {
                partition: partition.to_string(),
                samples: meta.samples().to_vec(),
                schemas: receipt.schemas,
                tags: None,
                backend_meta: receipt.backend_meta,
            })
            .await;
        // Merged cells are written beside the old ones (on backends that version cells):
        // once published the old ones go; if certainly refused, the merged ones do.
        match &notified {
            Ok(replaced) => self.retire_replaced(&meta, replaced.clone()).await,
            Err(e) if e.retry() != tq_core::Retry::OutcomeUnknown => {
                if let Some(placed) = placed.filter(|p| p.len() == meta.len()) {
                    let beside = crate::client::written_beside(meta.backend_meta(), &placed);
                    self.retire_replaced(&meta, beside).await;
                }
            }
            Err(_) => {}
        }
        notified.map_err(|e| {
            e.context(
                "kv_update: storage may already hold the merged values but the controller \
                 refused them; do not retry blindly",
            )
        })?;
        // An update changes neither tags nor which fields the keys hold: the lookup made for
        // the preconditions already has both, no second round trip needed.
        Ok(KvBatchMeta {
            partition: partition.to_string(),
            keys,
            tags: kv.meta.tags().to_vec(),
            fields: kv.meta.field_names().map(str::to_string).collect(),
        })
    }

    /// Makes `fields` of `keys[i]` read the payload of `public_keys[i]` in the public partition,
    /// without copying it (GRPO: one prompt payload, `n` responses linking to it). Missing keys
    /// are created. All-or-nothing: every key, public key, field and type is checked first.
    pub(crate) async fn kv_link<K: AsRef<str>, P: AsRef<str>>(
        &self,
        partition: &str,
        keys: &[K],
        public_keys: &[P],
        fields: &[&str],
        options: &LinkOptions,
    ) -> Result<KvBatchMeta> {
        let keys = crate::client::owned_keys(partition, keys)?;
        let fields = crate::client::owned_fields(partition, fields)?;
        if options.replace_private {
            let kv = self
                .control()
                .kv_retrieve_meta(partition, &keys, false)
                .await?;
            if !kv.meta.is_empty() {
                // Private cells of those fields go through the data plane first.
                self.kv_clear(
                    partition,
                    &kv.keys,
                    Some(&fields.iter().map(String::as_str).collect::<Vec<_>>()),
                )
                .await?;
            }
        }
        let kv = self
            .control()
            .kv_link(LinkRequest {
                partition: partition.to_string(),
                keys: keys.clone(),
                public_partition: options.public_partition.clone(),
                public_keys: keys_of(public_keys),
                fields,
            })
            .await?;
        Ok(KvBatchMeta {
            partition: partition.to_string(),
            keys,
            tags: kv.meta.tags().to_vec(),
            fields: kv.meta.field_names().map(str::to_string).collect(),
        })
    }

    /// Drops the links of `fields` of `keys`: those fields read as never written until written
    /// again (a write to a linked field is refused until it is unlinked). Returns how many links.
    pub(crate) async fn kv_unlink<K: AsRef<str>>(
        &self,
        partition: &str,
        keys: &[K],
        fields: &[&str],
    ) -> Result<usize> {
        let keys = crate::client::owned_keys(partition, keys)?;
        let fields = crate::client::owned_fields(partition, fields)?;
        self.control().kv_unlink(partition, &keys, &fields).await
    }

    /// Clears the public keys (of `public_partition`, starting with `prefix`) that were linked
    /// at least once and are linked no more; returns the cleared keys. Keys never linked yet
    /// are left alone, so a producer between its `kv_put` and its `kv_link` loses nothing.
    pub(crate) async fn kv_clear_unlinked_public(
        &self,
        public_partition: &str,
        prefix: &str,
    ) -> Result<Vec<String>> {
        let kv = self
            .control()
            .mark_unlinked_public(public_partition, prefix)
            .await?;
        if kv.meta.is_empty() {
            return Ok(Vec::new());
        }
        self.storage()
            .clear(&kv.meta, &FieldFilter::All)
            .await
            .map_err(|e| {
                e.context(format!(
                    "partition `{public_partition}`: storage clear failed; repeat the sweep"
                ))
            })?;
        self.control()
            .release(public_partition, kv.meta.samples())
            .await?;
        Ok(kv.keys)
    }

    /// Tags of `keys` (convenience for tests and tools).
    pub(crate) async fn kv_meta<K: AsRef<str>>(
        &self,
        partition: &str,
        keys: &[K],
    ) -> Result<tq_core::BatchMeta> {
        let keys = crate::client::owned_keys(partition, keys)?;
        let kv = self
            .control()
            .kv_retrieve_meta(partition, &keys, false)
            .await?;
        if !kv.missing.is_empty() {
            return Err(crate::kv::keys_not_found(partition, &kv.missing));
        }
        Ok(kv.meta)
    }

    pub(crate) async fn kv_tags<K: AsRef<str>>(
        &self,
        partition: &str,
        keys: &[K],
    ) -> Result<Vec<Tags>> {
        let keys = crate::client::owned_keys(partition, keys)?;
        let kv = self
            .control()
            .kv_retrieve_meta(partition, &keys, false)
            .await?;
        // Tags answer key by key: a key that is not there is an error, never a shorter list
        // that would pair the other keys with the wrong tags.
        if !kv.missing.is_empty() {
            return Err(crate::kv::keys_not_found(partition, &kv.missing));
        }
        Ok(kv.meta.tags().to_vec())
    }
}
