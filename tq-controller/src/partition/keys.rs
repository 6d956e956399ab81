//! The KV API's keys: resolving them to slots, creating them, listing them.

use super::*;

impl Partition {
    /// Resolves keys to visible slots. Missing keys are returned separately; keys whose sample
    /// is being cleared count as missing, unless `create` is set, which refuses them.
    pub fn resolve_keys(
        &self,
        keys: &[String],
        create: bool,
    ) -> Result<(Vec<Option<u32>>, Vec<String>)> {
        let mut slots = Vec::with_capacity(keys.len());
        let mut missing = Vec::new();
        for k in keys {
            match self.keys.get(k) {
                Some(s) if self.slots.visible(s) => slots.push(Some(s)),
                Some(_) if create => {
                    return Err(Error::conflict(format!(
                        "partition `{}`: key `{k}` is being cleared",
                        self.name
                    )))
                }
                _ => {
                    slots.push(None);
                    missing.push(k.clone());
                }
            }
        }
        Ok((slots, missing))
    }

    /// [`Partition::resolve_keys`] without `create` for a caller's key list, checked as
    /// `check_keys` checks one (not empty, no empty key, no key twice) in the same pass.
    ///
    /// Why not `check_keys` first: it hashes every key into a set of its own before the key
    /// table hashes them again. A key names one slot and a slot one key, so a key asked twice
    /// finds its slot twice: a bit per slot catches that, and only keys the table does not
    /// hold need a set. The first offending key in order is reported, as `check_keys` does.
    pub fn lookup_keys(&self, keys: &[String]) -> Result<(Vec<Option<u32>>, Vec<String>)> {
        if keys.is_empty() {
            return Err(Error::invalid(format!(
                "partition `{}`: empty key list",
                self.name
            )));
        }
        let mut seen_slots = vec![0u64; self.slots.capacity().div_ceil(64)];
        let mut seen_missing: HashSet<&str> = HashSet::new();
        let mut slots = Vec::with_capacity(keys.len());
        let mut missing = Vec::new();
        for k in keys {
            let slot = self.keys.get(k);
            let first = match slot {
                Some(s) => {
                    let (word, bit) = (s as usize / 64, 1u64 << (s % 64));
                    let first = seen_slots[word] & bit == 0;
                    seen_slots[word] |= bit;
                    first
                }
                None if k.is_empty() => {
                    return Err(Error::invalid(format!(
                        "partition `{}`: empty key",
                        self.name
                    )))
                }
                None => seen_missing.insert(k.as_str()),
            };
            if !first {
                return Err(Error::invalid(format!(
                    "partition `{}`: key `{k}` appears twice",
                    self.name
                )));
            }
            match slot {
                Some(s) if self.slots.visible(s) => slots.push(Some(s)),
                _ => {
                    slots.push(None);
                    missing.push(k.clone());
                }
            }
        }
        Ok((slots, missing))
    }

    /// Resolves `keys`, creating the missing ones (refusing keys being cleared). Returns the
    /// slots in key order and the keys that were created.
    pub fn resolve_or_create(
        &mut self,
        alloc: &mut IndexAllocator,
        keys: &[String],
    ) -> Result<(Vec<u32>, Vec<String>)> {
        let (mut slots, missing) = self.resolve_keys(keys, true)?;
        if !missing.is_empty() {
            if missing.len() as u64 > alloc.available() {
                return Err(Error::capacity_exceeded(format!(
                    "partition `{}`: {} new keys, but only {} sample indexes are left (clear \
                     keys to reuse theirs)",
                    self.name,
                    missing.len(),
                    alloc.available()
                )));
            }
            // `allocate` hands out exactly one slot per missing key, so every key gets one.
            let mut fresh = self.allocate(alloc, missing.len()).into_iter();
            for (k, s) in keys.iter().zip(slots.iter_mut()) {
                if s.is_none() {
                    if let Some(slot) = fresh.next() {
                        self.bind_key(k, slot);
                        *s = Some(slot);
                    }
                }
            }
        }
        Ok((slots.into_iter().flatten().collect(), missing))
    }

    /// The sample behind `key`: `Ok(Some(id))` when visible, `Ok(None)` when missing,
    /// `Conflict` when it is being cleared.
    pub fn key_sample(&self, key: &str) -> Result<Option<SampleId>> {
        match self.keys.get(key) {
            None => Ok(None),
            Some(s) if self.slots.visible(s) => Ok(Some(self.slots.id(s))),
            Some(s) => Err(Error::conflict(format!(
                "partition `{}`: key `{key}` (sample {}) is being cleared",
                self.name,
                self.slots.id(s)
            ))),
        }
    }

    pub fn bind_key(&mut self, key: &str, slot: u32) {
        self.keys.bind(key, slot);
    }

    /// Visible keys with their tags, in allocation order.
    pub fn key_listing(&self) -> Vec<(String, Tags)> {
        let mut entries: Vec<(u64, String, Tags)> = self
            .keys
            .iter()
            .filter(|&(_, s)| self.slots.visible(s))
            .map(|(k, s)| (self.slots.seq(s), k.clone(), self.slots.tags(s).clone()))
            .collect();
        entries.sort_unstable_by_key(|e| e.0);
        entries.into_iter().map(|(_, k, t)| (k, t)).collect()
    }
}
