//! [`MemoryKvStore`]: an in-process [`KvStore`] with real TTL semantics.
//!
//! A key with a deadline is invisible from the moment the deadline passes (reads check it), and
//! its memory is reclaimed by a sweeper task that walks an expiry index ordered by deadline. Time
//! is tokio's, so tests run it under `tokio::time::pause()`.

use crate::store::{KvCapabilities, KvStore, KvValue};
use async_trait::async_trait;
use bytes::Bytes;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::time::Instant;
use tq_core::Result;

/// How often the sweeper reclaims expired keys by default.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_millis(100);

struct Entry {
    value: Bytes,
    deadline: Option<Instant>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Entry>,
    /// (deadline, key) of every key that has a deadline.
    expiries: BTreeSet<(Instant, String)>,
}

impl Inner {
    /// The value of `key` unless it is absent or past its deadline.
    fn live(&self, key: &str, now: Instant) -> Option<&Bytes> {
        self.map
            .get(key)
            .filter(|e| e.deadline.is_none_or(|d| d > now))
            .map(|e| &e.value)
    }

    /// Stores `value` under `key` with `deadline` (`None`: none), replacing value and deadline.
    fn store(&mut self, key: String, value: Bytes, deadline: Option<Instant>) {
        match self.map.get_mut(&key) {
            Some(e) => e.value = value,
            None => {
                self.map.insert(
                    key.clone(),
                    Entry {
                        value,
                        deadline: None,
                    },
                );
            }
        }
        self.set_deadline(&key, deadline);
    }

    fn set_deadline(&mut self, key: &str, deadline: Option<Instant>) {
        let Some(e) = self.map.get_mut(key) else {
            return;
        };
        if let Some(old) = e.deadline.take() {
            self.expiries.remove(&(old, key.to_string()));
        }
        if let Some(d) = deadline {
            e.deadline = Some(d);
            self.expiries.insert((d, key.to_string()));
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some(e) = self.map.remove(key) {
            if let Some(d) = e.deadline {
                self.expiries.remove(&(d, key.to_string()));
            }
        }
    }

    /// Removes every key whose deadline is at or before `now`; returns how many.
    fn sweep(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while let Some((d, _)) = self.expiries.first() {
            if *d > now {
                break;
            }
            let Some((_, key)) = self.expiries.pop_first() else {
                break;
            };
            self.map.remove(&key);
            n += 1;
        }
        n
    }
}

/// An in-memory [`KvStore`] with TTL and expire, for embedded use and tests.
pub struct MemoryKvStore {
    inner: Arc<Mutex<Inner>>,
    sweeper: Option<tokio::task::JoinHandle<()>>,
}

impl MemoryKvStore {
    /// A store with a sweeper every [`DEFAULT_SWEEP_INTERVAL`] when called inside a tokio
    /// runtime (outside one, expired keys are still invisible and are reclaimed on writes).
    pub fn new() -> Self {
        Self::with_sweep_interval(DEFAULT_SWEEP_INTERVAL)
    }

    pub fn with_sweep_interval(interval: Duration) -> Self {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let sweeper = tokio::runtime::Handle::try_current()
            .ok()
            .map(|h| h.spawn(sweep_loop(Arc::downgrade(&inner), interval)));
        MemoryKvStore { inner, sweeper }
    }

    /// Number of keys held in memory (including expired keys not yet swept).
    pub fn resident_keys(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map
            .len()
    }

    /// The keys a read would find now (not past their deadline), sorted: what a test or a
    /// leak hunt lists.
    pub fn live_keys(&self) -> Vec<String> {
        let now = Instant::now();
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut keys: Vec<String> = inner
            .map
            .iter()
            .filter(|(_, e)| e.deadline.is_none_or(|d| d > now))
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort_unstable();
        keys
    }

    /// Reclaims expired keys now; returns how many.
    pub fn sweep(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sweep(Instant::now())
    }
}

impl Default for MemoryKvStore {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for MemoryKvStore {
    fn drop(&mut self) {
        if let Some(h) = self.sweeper.take() {
            h.abort();
        }
    }
}

async fn sweep_loop(inner: Weak<Mutex<Inner>>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let now = Instant::now();
        inner.lock().unwrap_or_else(|p| p.into_inner()).sweep(now);
    }
}

#[async_trait]
impl KvStore for MemoryKvStore {
    fn name(&self) -> &str {
        "memory"
    }

    fn capabilities(&self) -> KvCapabilities {
        KvCapabilities {
            native_ttl: true,
            native_expire: true,
            max_keys_per_call: 4096,
            max_concurrent_calls: 4,
            atomic_generations: true,
        }
    }

    async fn mset(&self, items: Vec<(String, KvValue)>, ttl: Option<Duration>) -> Result<()> {
        let now = Instant::now();
        let deadline = ttl.map(|t| now + t);
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if self.sweeper.is_none() {
            g.sweep(now);
        }
        for (key, value) in items {
            g.store(key, value.to_bytes(), deadline);
        }
        Ok(())
    }

    async fn mget(&self, keys: &[String]) -> Result<Vec<Option<Bytes>>> {
        let now = Instant::now();
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        Ok(keys.iter().map(|k| g.live(k, now).cloned()).collect())
    }

    /// Atomic per key: the whole batch runs under the store's lock.
    async fn raise_generations(
        &self,
        items: Vec<(String, u32)>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u32>> {
        let now = Instant::now();
        let deadline = ttl.map(|t| now + t);
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::with_capacity(items.len());
        for (key, want) in items {
            let have = g
                .live(&key, now)
                .map(|v| crate::codec::decode_generation(&key, v))
                .transpose()?;
            if let Some(h) = have.filter(|h| *h > want) {
                out.push(h);
                continue;
            }
            g.store(key, crate::codec::encode_generation(want), deadline);
            out.push(want);
        }
        Ok(out)
    }

    async fn clear_generations(&self, items: Vec<(String, u32)>) -> Result<()> {
        let now = Instant::now();
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for (key, at_most) in items {
            let have = g
                .live(&key, now)
                .map(|v| crate::codec::decode_generation(&key, v))
                .transpose()?;
            if have.is_some_and(|h| h <= at_most) {
                g.remove(&key);
            }
        }
        Ok(())
    }

    async fn delete(&self, keys: &[String]) -> Result<()> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for k in keys {
            g.remove(k);
        }
        Ok(())
    }

    async fn expire(&self, keys: &[String], after: Duration) -> Result<()> {
        let now = Instant::now();
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for k in keys {
            let live = g
                .map
                .get(k)
                .is_some_and(|e| e.deadline.is_none_or(|d| d > now));
            if live {
                g.set_deadline(k, Some(now + after));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(keys: &[&str], v: &'static [u8]) -> Vec<(String, KvValue)> {
        keys.iter()
            .map(|k| (k.to_string(), Bytes::from_static(v).into()))
            .collect()
    }

    fn keys(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn ttl_expire_and_rearm_under_paused_time() {
        let s = MemoryKvStore::new();
        s.mset(items(&["a", "b"], b"1"), Some(Duration::from_secs(10)))
            .await
            .unwrap();
        s.mset(items(&["c"], b"1"), None).await.unwrap();
        tokio::time::advance(Duration::from_secs(5)).await;
        // Expire `a` shortly; rewrite it at once with the TTL stated again: the rewrite wins.
        s.expire(&keys(&["a", "b"]), Duration::from_secs(1))
            .await
            .unwrap();
        s.mset(items(&["a"], b"2"), Some(Duration::from_secs(10)))
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        let got = s.mget(&keys(&["a", "b", "c"])).await.unwrap();
        assert_eq!(got[0].as_deref(), Some(&b"2"[..]));
        assert_eq!(got[1], None, "expired key is invisible");
        assert!(got[2].is_some(), "no TTL: lives on");
        // The sweeper reclaimed `b`.
        tokio::time::advance(Duration::from_millis(200)).await;
        tokio::task::yield_now().await;
        assert_eq!(s.resident_keys(), 2);
        // A write without a TTL removes the deadline.
        s.mset(items(&["a"], b"3"), None).await.unwrap();
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(s.mget(&keys(&["a"])).await.unwrap()[0].is_some());
        // Expire of an absent key is fine and does not create it.
        s.expire(&keys(&["zz"]), Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(s.resident_keys(), 2);
        s.delete(&keys(&["a", "c", "zz"])).await.unwrap();
        assert_eq!(s.resident_keys(), 0);
    }
}
