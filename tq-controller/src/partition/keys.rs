//! The KV API's keys: resolving them to slots, creating them, listing them.

use super::*;

/// A put's keys: see [`Partition::put_keys`].
pub struct PutKeys {
    /// The key table's slot of each key, in order (any state).
    pub bound: Vec<Option<u32>>,
    /// The keys whose sample is being cleared, in order: a put of them must wait.
    pub clearing: Vec<String>,
    /// The samples of the keys that are visible, in order: the put overwrites their fields.
    pub existing: Vec<SampleId>,
}

impl Partition {
    /// The key table's slot of each of a caller's keys (visible, being cleared, or `None`),
    /// with the key list checked as `check_keys` checks one (not empty, no empty key, no key
    /// twice) in the same pass.
    ///
    /// Why not `check_keys` first: it hashes every key into a set of its own before the key
    /// table hashes them again. A key names one slot and a slot one key, so a key asked twice
    /// finds its slot twice: a bit per slot catches that, and only keys the table does not
    /// hold need a set. The first offending key in order is reported, as `check_keys` does.
    pub fn checked_key_slots(&self, keys: &[String]) -> Result<Vec<Option<u32>>> {
        if keys.is_empty() {
            return Err(Error::invalid(format!(
                "partition `{}`: empty key list",
                self.name
            )));
        }
        let mut seen_slots = vec![0u64; self.slots.capacity().div_ceil(64)];
        let mut seen_unbound: HashSet<&str> = HashSet::new();
        let mut slots = Vec::with_capacity(keys.len());
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
                None => seen_unbound.insert(k.as_str()),
            };
            if !first {
                return Err(Error::invalid(format!(
                    "partition `{}`: key `{k}` appears twice",
                    self.name
                )));
            }
            slots.push(slot);
        }
        Ok(slots)
    }

    /// A lookup of a caller's key list (checked, see [`Partition::checked_key_slots`]): the
    /// visible slot of each key, and the keys that have none (unknown or being cleared).
    pub fn lookup_keys(&self, keys: &[String]) -> Result<(Vec<Option<u32>>, Vec<String>)> {
        let mut slots = self.checked_key_slots(keys)?;
        let mut missing = Vec::new();
        for (k, slot) in keys.iter().zip(slots.iter_mut()) {
            if !slot.is_some_and(|s| self.slots.visible(s)) {
                *slot = None;
                missing.push(k.clone());
            }
        }
        Ok((slots, missing))
    }

    /// A put's key list, checked (see [`Partition::checked_key_slots`]) and resolved in one
    /// pass: what [`Partition::create_keys`] needs, and what the put must check first.
    pub fn put_keys(&self, keys: &[String]) -> Result<PutKeys> {
        let bound = self.checked_key_slots(keys)?;
        let mut clearing = Vec::new();
        let mut existing = Vec::new();
        for (k, slot) in keys.iter().zip(&bound) {
            match *slot {
                Some(s) if self.slots.is_clearing(s) => clearing.push(k.clone()),
                Some(s) if self.slots.visible(s) => existing.push(self.slots.id(s)),
                _ => {}
            }
        }
        Ok(PutKeys {
            bound,
            clearing,
            existing,
        })
    }

    /// Resolves `keys`, creating the missing ones (refusing keys being cleared). Returns the
    /// slots in key order and the keys that were created. The caller has checked the list.
    pub fn resolve_or_create(
        &mut self,
        alloc: &mut IndexAllocator,
        keys: &[String],
    ) -> Result<(Vec<u32>, Vec<String>)> {
        let bound = keys.iter().map(|k| self.keys.get(k)).collect();
        self.create_keys(alloc, keys, bound)
    }

    /// Gives every key of `keys` without a slot in `bound` (its key table slots, in order) a
    /// new one; a key bound to a slot that is not visible is being cleared and is refused
    /// before anything is created. Returns the slots in key order and the keys created.
    pub fn create_keys(
        &mut self,
        alloc: &mut IndexAllocator,
        keys: &[String],
        bound: Vec<Option<u32>>,
    ) -> Result<(Vec<u32>, Vec<String>)> {
        let mut missing = Vec::new();
        for (k, slot) in keys.iter().zip(&bound) {
            match *slot {
                Some(s) if self.slots.visible(s) => {}
                Some(_) => {
                    return Err(Error::conflict(format!(
                        "partition `{}`: key `{k}` is being cleared",
                        self.name
                    )))
                }
                None => missing.push(k.clone()),
            }
        }
        let mut slots = bound;
        if !missing.is_empty() {
            if missing.len() as u64 > alloc.available() {
                return Err(Error::capacity_exceeded(format!(
                    "partition `{}`: {} new keys, but only {} sample indexes are left{} (clear \
                     keys to reuse theirs)",
                    self.name,
                    missing.len(),
                    alloc.available(),
                    alloc.limit_note()
                )));
            }
            // `allocate` hands out exactly one slot per missing key, so every key gets one.
            let mut fresh = self.allocate(alloc, missing.len()).into_iter();
            self.keys.reserve(missing.len());
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
