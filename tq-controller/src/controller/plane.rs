//! The logic of every operation of the table (`ops.rs`) for the in-process [`Controller`]:
//! each one locks the state, checks everything, then changes it (or nothing). Requests tagged
//! with an id are `controller/once.rs`.

use super::*;
use tq_core::BackendMeta;

#[async_trait]
impl ControlPlane for Controller {
    fn epoch(&self) -> u64 {
        Controller::epoch(self)
    }

    async fn get_meta(&self, req: GetMetaRequest) -> Result<BatchMeta> {
        self.get_meta_with(req, None).await
    }

    async fn notify_production(&self, notice: ProductionNotice) -> Result<Vec<BackendMeta>> {
        self.notify_with(notice, None).await
    }

    async fn set_tags(&self, partition: &str, samples: &[SampleId], tags: Vec<Tags>) -> Result<()> {
        {
            let st = self.shared();
            st.partition_locked(partition)?.set_tags(samples, &tags)?;
        }
        self.wake(partition);
        Ok(())
    }

    async fn mark_clearing(
        &self,
        partition: &str,
        samples: Option<&[SampleId]>,
    ) -> Result<BatchMeta> {
        if let Some(s) = samples {
            check_unique_ids(partition, s)?;
        }
        self.unless_held_shared(|st, held| {
            (!held).then(|| st.mark_clearing_where(partition, |p| p.select(samples)))
        })
        .await
    }

    async fn release(&self, partition: &str, samples: &[SampleId]) -> Result<()> {
        // Samples of a partition that holds no links, and that nothing links to (only public
        // samples can be linked to), release under the shared lock: the partition and the
        // allocator are all they touch. Emptied, the partition is dropped under the exclusive
        // lock (checked again there: an insert may have come between).
        let released_alone = {
            let st = self.shared();
            let outcome = match st.partitions.lock_mut(partition) {
                None => return Ok(()),
                Some(mut p) if !is_public(partition) && !p.holds_links() => {
                    p.release(&mut st.alloc(), samples);
                    Some(p.len() == 0 && !p.complete)
                }
                Some(_) => None,
            };
            outcome
        };
        let dropped = match released_alone {
            Some(false) => false,
            Some(true) => self.exclusive().drop_if_empty(partition),
            None => {
                let mut st = self.exclusive();
                let st = &mut *st;
                match st.partitions.get_mut(partition) {
                    Some(p) => {
                        let alloc = st.alloc.get_mut().unwrap_or_else(|e| e.into_inner());
                        let released = p.release(alloc, samples);
                        st.after_release(partition, released);
                        st.drop_if_empty(partition)
                    }
                    None => false,
                }
            }
        };
        if dropped {
            self.forget_partition(partition);
        }
        self.wake(partition);
        Ok(())
    }

    async fn begin_clear_fields(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &[FieldName],
    ) -> Result<BatchMeta> {
        check_field_list(partition, fields)?;
        check_unique_ids(partition, samples)?;
        self.unless_held(|st, held| {
            if held {
                return None;
            }
            Some(match st.partitions.get_mut(partition) {
                Some(p) => {
                    let selected = p.selected_samples(Some(samples));
                    st.refuse_linked(partition, &selected, "clear fields of")
                        .and_then(|()| {
                            let p = present(&mut st.partitions, partition)?;
                            let (meta, dropped) = p.begin_clear_fields(samples, fields);
                            for (dest, field, src) in dropped {
                                st.remove_link(src, &(partition.to_string(), dest, field));
                            }
                            Ok(meta)
                        })
                }
                None => Ok(BatchMeta::empty(partition)),
            })
        })
        .await
    }

    async fn finish_clear_fields(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &[FieldName],
    ) -> Result<()> {
        let st = self.shared();
        if let Some(mut p) = st.partitions.lock_mut(partition) {
            p.finish_clear_fields(samples, fields);
        }
        Ok(())
    }

    async fn kv_retrieve_meta(
        &self,
        partition: &str,
        keys: &[String],
        create: bool,
    ) -> Result<KvMeta> {
        tokio::task::consume_budget().await;
        if create {
            return self.in_partition(
                partition,
                // A bad key list creates no partition; in one that exists it is checked while
                // resolving.
                |_| check_keys(partition, keys),
                |st, p| {
                    let bound = p.checked_key_slots(keys)?;
                    let (slots, created) = p.create_keys(&mut st.alloc(), keys, bound)?;
                    let slots: Vec<Option<u32>> = slots.into_iter().map(Some).collect();
                    Ok(found_keys_meta(p, keys, &slots, created))
                },
            );
        }
        // A lookup changes nothing that spans partitions.
        let st = self.shared();
        let Some(p) = st.partitions.get(partition) else {
            check_keys(partition, keys)?;
            return Ok(KvMeta {
                meta: BatchMeta::empty(partition),
                keys: Vec::new(),
                missing: keys.to_vec(),
                clearing: Vec::new(),
            });
        };
        let (slots, missing) = p.lookup_keys(keys)?;
        Ok(found_keys_meta(&p, keys, &slots, missing))
    }

    async fn kv_list(&self, partition: Option<&str>) -> Result<Vec<KeyListing>> {
        tokio::task::consume_budget().await;
        let st = self.shared();
        let names: Vec<&String> = match partition {
            Some(p) => st.order.iter().filter(|n| n.as_str() == p).collect(),
            None => st.order.iter().collect(),
        };
        Ok(names
            .into_iter()
            .map(|n| KeyListing {
                partition: n.clone(),
                entries: st
                    .partitions
                    .get(n)
                    .map(|p| p.key_listing())
                    .unwrap_or_default(),
            })
            .collect())
    }

    async fn production_status(
        &self,
        partition: &str,
        fields: &[FieldName],
    ) -> Result<ProductionStatus> {
        tokio::task::consume_budget().await;
        if fields.is_empty() {
            return Err(Error::invalid(format!(
                "partition `{partition}`: production status needs at least one field"
            )));
        }
        Ok(self
            .shared()
            .partition(partition)?
            .production_status(fields))
    }

    async fn consumption_status(&self, partition: &str, task: &str) -> Result<ConsumptionStatus> {
        tokio::task::consume_budget().await;
        Ok(self.shared().partition(partition)?.consumption_status(task))
    }

    async fn reset_consumption(&self, partition: &str, task: Option<&str>) -> Result<()> {
        self.shared()
            .partition_locked(partition)?
            .reset_consumption(task);
        self.wake(partition);
        Ok(())
    }

    async fn list_partitions(&self) -> Result<Vec<String>> {
        tokio::task::consume_budget().await;
        Ok(self.shared().order.clone())
    }

    async fn ack(
        &self,
        partition: &str,
        task: &str,
        lease: LeaseId,
        samples: &[SampleId],
    ) -> Result<usize> {
        let acked = {
            let st = self.shared();
            let acked = match st.partitions.lock_mut(partition) {
                Some(mut p) => p.ack(task, lease, samples),
                None => 0,
            };
            acked
        };
        // The last acknowledgement may finish a complete partition for waiting fetches.
        self.wake(partition);
        Ok(acked)
    }

    async fn renew_lease(
        &self,
        partition: &str,
        task: &str,
        lease: LeaseId,
        samples: &[SampleId],
        extend: Duration,
    ) -> Result<usize> {
        if extend.is_zero() {
            return Err(Error::invalid(format!(
                "partition `{partition}`: a lease must be extended by more than zero"
            )));
        }
        // The lease clock is the fetch's (tokio's: paused and advanced in tests).
        let now = tokio::time::Instant::now().into_std();
        let until = now.checked_add(extend).ok_or_else(|| {
            Error::invalid(format!(
                "partition `{partition}`: a lease cannot be extended by {extend:?}"
            ))
        })?;
        let st = self.shared();
        let Some(mut p) = st.partitions.lock_mut(partition) else {
            return Ok(0);
        };
        // Leases already past their deadline go back first: a lease that ran out cannot be
        // renewed, since a fetch may hand its samples to another consumer at any moment.
        let (_, expired) = p.expire_leases(now);
        if expired > 0 {
            self.telemetry
                .leases_expired
                .fetch_add(expired, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(p.renew_lease(task, lease, samples, until))
    }

    async fn return_fetched(
        &self,
        partition: &str,
        task: &str,
        lease: Option<LeaseId>,
        samples: &[SampleId],
    ) -> Result<usize> {
        let returned = {
            let st = self.shared();
            let returned = match st.partitions.lock_mut(partition) {
                Some(mut p) => p.return_fetched(task, lease, samples),
                None => 0,
            };
            returned
        };
        if returned > 0 {
            self.wake(partition);
        }
        Ok(returned)
    }

    async fn mark_complete(&self, partition: &str) -> Result<()> {
        {
            let mut st = self.exclusive();
            let (p, _) = st.partition_or_create(partition)?;
            p.complete = true;
        }
        self.wake(partition);
        Ok(())
    }

    async fn kv_link(&self, req: LinkRequest) -> Result<KvMeta> {
        if !self.links_supported {
            return Err(Error::unsupported("kv_link", self.storage_backend.clone()));
        }
        let partition = req.partition.as_str();
        check_keys(partition, &req.keys)?;
        check_field_list(partition, &req.fields)?;
        if req.public_keys.len() != req.keys.len() {
            return Err(Error::invalid(format!(
                "partition `{partition}`: {} public keys for {} keys",
                req.public_keys.len(),
                req.keys.len()
            )));
        }
        if let Some(k) = req.public_keys.iter().find(|k| k.is_empty()) {
            return Err(Error::invalid(format!("empty public key `{k}`")));
        }
        if is_public(partition) {
            return Err(Error::invalid(format!(
                "cannot link from public partition `{partition}`: links do not chain"
            )));
        }
        if !is_public(&req.public_partition) {
            return Err(Error::invalid(format!(
                "`{}` is not a public partition (use `{PUBLIC_PARTITION}` or `{PUBLIC_PARTITION}/<namespace>`)",
                req.public_partition
            )));
        }
        let mut st = self.exclusive();
        let st = &mut *st;
        // 1–3: every source exists, is not being cleared, and has every field produced.
        let public = st.partitions.get(&req.public_partition).ok_or_else(|| {
            Error::not_found(format!(
                "public partition `{}` does not exist",
                req.public_partition
            ))
        })?;
        let mut sources = Vec::with_capacity(req.keys.len());
        for pk in &req.public_keys {
            let src = public.key_sample(pk)?.ok_or_else(|| {
                Error::not_found(format!(
                    "public key `{pk}` not found in `{}`",
                    req.public_partition
                ))
            })?;
            let mut schemas = Vec::with_capacity(req.fields.len());
            for f in &req.fields {
                let schema = public.produced_schema(src, f).ok_or_else(|| {
                    Error::invalid(format!(
                        "public key `{pk}` must have produced field `{f}` before it can be linked"
                    ))
                })?;
                schemas.push(schema);
            }
            sources.push((src, schemas));
        }
        drop(public);
        // 4–6: destination types compatible, destinations not being cleared, no private payload.
        if let Some(dest) = st.partitions.get(partition) {
            for (_, schemas) in &sources {
                for (f, schema) in req.fields.iter().zip(schemas) {
                    dest.check_field(f, schema)?;
                }
            }
            for k in &req.keys {
                if let Some(id) = dest.key_sample(k)? {
                    if let Some(f) = req.fields.iter().find(|f| dest.has_private(id, f)) {
                        return Err(Error::conflict(format!(
                            "partition `{partition}`: field `{f}` of key `{k}` holds its own payload; \
                             clear it (or link with replace) before linking"
                        )));
                    }
                }
            }
        }
        // 7: everything checked; create missing keys and link.
        let (dest, alloc) = st.partition_or_create(partition)?;
        let (slots, created) = dest.resolve_or_create(alloc, &req.keys)?;
        let mut changes = Vec::new();
        for (&slot, (src, schemas)) in slots.iter().zip(&sources) {
            for (f, schema) in req.fields.iter().zip(schemas) {
                let previous = dest.link(slot, f, *src, schema);
                changes.push((dest.sample_of(slot), f.clone(), *src, previous));
            }
        }
        let fids = dest.field_ids_of(&req.fields);
        let meta = dest.build_meta(&slots, &fids, Production::Computed);
        for (dest_id, f, src, previous) in changes {
            let cell = (partition.to_string(), dest_id, f);
            if let Some(prev) = previous {
                st.remove_link(prev, &cell);
            }
            st.add_link(src, cell);
        }
        let public = present(&mut st.partitions, &req.public_partition)?;
        for (src, _) in &sources {
            public.mark_ever_linked(*src);
        }
        self.wake(partition);
        Ok(KvMeta {
            meta,
            keys: req.keys.clone(),
            missing: created,
            clearing: Vec::new(),
        })
    }

    async fn kv_unlink(
        &self,
        partition: &str,
        keys: &[String],
        fields: &[FieldName],
    ) -> Result<usize> {
        check_keys(partition, keys)?;
        check_field_list(partition, fields)?;
        let mut st = self.exclusive();
        let st = &mut *st;
        let Some(p) = st.partitions.get_mut(partition) else {
            return Ok(0);
        };
        let mut dropped = Vec::new();
        for k in keys {
            if let Ok(Some(id)) = p.key_sample(k) {
                for f in fields {
                    if let Some(src) = p.unlink_by_id(id, f) {
                        dropped.push((src, (partition.to_string(), id, f.clone())));
                    }
                }
            }
        }
        let n = dropped.len();
        for (src, cell) in dropped {
            st.remove_link(src, &cell);
        }
        Ok(n)
    }

    async fn mark_unlinked_public(&self, public_partition: &str, prefix: &str) -> Result<KvMeta> {
        if !is_public(public_partition) {
            return Err(Error::invalid(format!(
                "`{public_partition}` is not a public partition"
            )));
        }
        self.unless_held(|st, held| (!held).then(|| mark_unlinked(st, public_partition, prefix)))
            .await
    }

    async fn prepare_write(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &BTreeMap<FieldName, FieldMeta>,
    ) -> Result<BatchMeta> {
        tokio::task::consume_budget().await;
        let st = self.shared();
        st.refuse_linked(partition, samples, "write")?;
        let Some(mut p) = st.partitions.lock_mut(partition) else {
            return Err(gone_partition(partition));
        };
        let slots = p.check_write(samples, fields)?;
        p.note_fields_written(fields.keys());
        Ok(p.write_meta(&slots))
    }

    async fn kv_prepare_put(
        &self,
        partition: &str,
        keys: &[String],
        fields: &BTreeMap<FieldName, FieldMeta>,
    ) -> Result<KvMeta> {
        tokio::task::consume_budget().await;
        self.in_partition(
            partition,
            // A bad key list creates no partition; in one that exists it is checked while
            // resolving (`put_keys`).
            |_| check_keys(partition, keys),
            |st, p| {
                let put = p.put_keys(keys)?;
                if !put.clearing.is_empty() {
                    return Ok(KvMeta {
                        meta: BatchMeta::empty(partition),
                        keys: Vec::new(),
                        missing: Vec::new(),
                        clearing: put.clearing,
                    });
                }
                // Existing keys are checked before any key is created: a refused put leaves nothing.
                p.check_write(&put.existing, fields)?;
                st.refuse_linked(partition, &put.existing, "write")?;
                let (slots, created) = p.create_keys(&mut st.alloc(), keys, put.bound)?;
                p.note_fields_written(fields.keys());
                Ok(KvMeta {
                    meta: p.write_meta(&slots),
                    keys: keys.to_vec(),
                    missing: created,
                    clearing: Vec::new(),
                })
            },
        )
    }

    async fn kv_mark_clearing(&self, partition: &str, keys: &[String]) -> Result<BatchMeta> {
        check_keys(partition, keys)?;
        self.unless_held_shared(|st, held| {
            (!held).then(|| st.mark_clearing_where(partition, |p| p.key_slots_for_clear(keys)))
        })
        .await
    }

    async fn still_hold(
        &self,
        partition: &str,
        samples: &[SampleId],
        fields: &[FieldName],
    ) -> Result<Vec<bool>> {
        let st = self.shared();
        let held = match st.partitions.get(partition) {
            Some(p) => p.holds(samples, fields),
            None => vec![false; samples.len()],
        };
        Ok(held)
    }

    async fn drop_partition(&self, partition: &str) -> Result<()> {
        {
            let mut st = self.exclusive();
            let held = st.partitions.get(partition).map(|p| p.len());
            match held {
                None => return Ok(()),
                Some(n) if n > 0 => {
                    return Err(Error::conflict(format!(
                        "partition `{partition}` still holds {n} samples; clear them first"
                    )))
                }
                Some(_) => {
                    st.partitions.remove(partition);
                    st.order.retain(|n| n != partition);
                }
            }
        }
        self.forget_partition(partition);
        self.wake(partition);
        Ok(())
    }
}

#[async_trait]
impl ControlAdmin for Controller {
    async fn snapshot(&self) -> Result<(Vec<u8>, crate::SnapshotCounts)> {
        Controller::snapshot(self)
    }

    async fn snapshot_holding_removals(
        &self,
        ttl: Duration,
    ) -> Result<(Vec<u8>, crate::SnapshotCounts, u64)> {
        Controller::snapshot_holding_removals(self, ttl)
    }

    async fn release_removals(&self, hold: u64) -> Result<()> {
        Controller::release_removals(self, hold);
        Ok(())
    }

    async fn restore(&self, snapshot: Vec<u8>) -> Result<crate::SnapshotCounts> {
        Controller::restore(self, &snapshot)
    }

    async fn status(&self) -> Result<ControllerStatus> {
        Ok(Controller::status(self))
    }
}

/// The answer of a key lookup: the keys found (`slots[i]` is `keys[i]`'s slot, if any) with
/// the fields all of them have, and the keys `missing`.
fn found_keys_meta(
    p: &Partition,
    keys: &[String],
    slots: &[Option<u32>],
    missing: Vec<String>,
) -> KvMeta {
    let (found_keys, found): (Vec<String>, Vec<u32>) = keys
        .iter()
        .zip(slots)
        .filter_map(|(k, s)| s.map(|s| (k.clone(), s)))
        .unzip();
    let fids = p.common_fields(&found);
    KvMeta {
        meta: p.build_meta(&found, &fids, Production::Computed),
        keys: found_keys,
        missing,
        clearing: Vec::new(),
    }
}

/// Step 1 of `kv_clear_unlinked_public` under the state lock (see the trait).
fn mark_unlinked(st: &mut State, public_partition: &str, prefix: &str) -> Result<KvMeta> {
    let Some(p) = st.partitions.get(public_partition) else {
        return Ok(KvMeta {
            meta: BatchMeta::empty(public_partition),
            keys: Vec::new(),
            missing: Vec::new(),
            clearing: Vec::new(),
        });
    };
    let (keys, ids): (Vec<String>, Vec<SampleId>) = p
        .swept_candidates(prefix)
        .into_iter()
        .filter(|(_, id)| !st.is_linked(*id))
        .unzip();
    drop(p);
    let p = present(&mut st.partitions, public_partition)?;
    let meta = if ids.is_empty() {
        BatchMeta::empty(public_partition)
    } else {
        let slots = p.select(Some(&ids));
        p.mark_clearing(&slots)
    };
    Ok(KvMeta {
        meta,
        keys,
        missing: Vec::new(),
        clearing: Vec::new(),
    })
}
