//! The [`KvStore`] trait: the small surface a key-value engine implements to sit under the
//! adapter, its declared [`KvCapabilities`], and the [`KvStoreExt`] conveniences built on it.

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use std::time::Duration;
use tq_core::Result;

/// What a [`KvStore`] can do. The adapter reads these instead of guessing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCapabilities {
    /// `mset` honours its `ttl` argument (the key disappears on its own after it).
    pub native_ttl: bool,
    /// `expire` sets a deadline on existing keys; when false, the adapter deletes instead.
    pub native_expire: bool,
    /// The most keys one call should carry; the adapter splits larger batches.
    pub max_keys_per_call: usize,
    /// How many calls the adapter keeps in flight at once (pipelining).
    pub max_concurrent_calls: usize,
    /// [`KvStore::raise_generations`] is atomic per key (a compare-and-set in the store), so a
    /// stale writer can never move a sample's generation key back. Without it the default
    /// read-then-write is used, with the race documented in docs/backends.md.
    pub atomic_generations: bool,
}

impl Default for KvCapabilities {
    fn default() -> Self {
        KvCapabilities {
            native_ttl: false,
            native_expire: false,
            max_keys_per_call: 1024,
            max_concurrent_calls: 16,
            atomic_generations: false,
        }
    }
}

/// A value to write: an optional small header followed by the payload, kept as two buffers so a
/// store can write them back to back without first copying them into one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KvValue {
    head: Bytes,
    body: Bytes,
}

impl KvValue {
    /// A value that is `head` immediately followed by `body`.
    pub fn new(head: Bytes, body: Bytes) -> Self {
        KvValue { head, body }
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The two parts, in order.
    pub fn parts(&self) -> [&Bytes; 2] {
        [&self.head, &self.body]
    }

    /// The value as one buffer (copies only when there is a header).
    pub fn to_bytes(&self) -> Bytes {
        if self.head.is_empty() {
            return self.body.clone();
        }
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(&self.head);
        v.extend_from_slice(&self.body);
        Bytes::from(v)
    }
}

impl From<Bytes> for KvValue {
    fn from(body: Bytes) -> Self {
        KvValue {
            head: Bytes::new(),
            body,
        }
    }
}

/// A key-value engine under the generic KV adapter.
///
/// Keys are UTF-8 strings chosen by the adapter; values are opaque bytes. Every method is a
/// batch operation; the adapter keeps each call within [`KvCapabilities::max_keys_per_call`].
/// Failures to reach the engine are [`tq_core::ErrorKind::Unavailable`].
#[async_trait]
pub trait KvStore: Send + Sync + 'static {
    /// A short name for messages and routing tags (`"redis"`, `"memory"`).
    fn name(&self) -> &str;

    fn capabilities(&self) -> KvCapabilities;

    /// Writes every item. With `ttl`, each key disappears `ttl` after this write, replacing any
    /// deadline it had; without, the key lives until deleted (an earlier deadline is removed).
    async fn mset(&self, items: Vec<(String, KvValue)>, ttl: Option<Duration>) -> Result<()>;

    /// Reads the keys, in order; `None` for a key that is not stored.
    async fn mget(&self, keys: &[String]) -> Result<Vec<Option<Bytes>>>;

    /// Removes the keys; absent keys are fine.
    async fn delete(&self, keys: &[String]) -> Result<()>;

    /// Makes the keys disappear `after` from now; absent keys are fine. Stores without
    /// [`KvCapabilities::native_expire`] delete.
    async fn expire(&self, keys: &[String], after: Duration) -> Result<()> {
        let _ = after;
        self.delete(keys).await
    }

    /// Raises sample generation keys: for each `(key, generation)`, stores the generation
    /// (`codec::encode_generation`) unless the key holds a larger one, with `ttl` as for
    /// [`KvStore::mset`]; returns the generation each key holds afterwards, in order. A store
    /// that declares [`KvCapabilities::atomic_generations`] does each key as one atomic step;
    /// this default reads, then writes (not atomic). A call names each key once (the adapter
    /// refuses a put naming a sample index twice): stores may read every key before writing
    /// any, so a key named twice may keep either generation.
    async fn raise_generations(
        &self,
        items: Vec<(String, u32)>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u32>> {
        raise_by_read_then_write(self, items, ttl).await
    }

    /// Writes `items` as [`KvStore::mset`] does, then raises `raise` as
    /// [`KvStore::raise_generations`] does and answers as it does, for any number of items.
    /// A put of samples whose cells all live in this store calls it: a store that can send
    /// both in one round trip, cells first, does (Redis: one pipeline per node, in which a
    /// sample's generation key shares its cells' hash slot). This default writes with
    /// [`KvStoreExt::mset_all`], then raises with [`KvStoreExt::raise_generations_all`].
    async fn mset_then_raise(
        &self,
        items: Vec<(String, KvValue)>,
        raise: Vec<(String, u32)>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u32>> {
        self.mset_all(items, ttl).await?;
        self.raise_generations_all(raise, ttl).await
    }

    /// Deletes sample generation keys: each `(key, generation)` unless the key holds a larger
    /// generation (a newer sample reused the index). A store that declares
    /// [`KvCapabilities::atomic_generations`] checks and deletes each key in one atomic step;
    /// this default reads, then deletes.
    async fn clear_generations(&self, items: Vec<(String, u32)>) -> Result<()> {
        let keys: Vec<String> = items.iter().map(|(k, _)| k.clone()).collect();
        let current = self.mget(&keys).await?;
        let mut doomed = Vec::with_capacity(items.len());
        for ((key, at_most), have) in items.into_iter().zip(current) {
            let Some(raw) = have else { continue };
            if crate::codec::decode_generation(&key, &raw)? <= at_most {
                doomed.push(key);
            }
        }
        if doomed.is_empty() {
            return Ok(());
        }
        self.delete(&doomed).await
    }
}

/// [`KvStore::raise_generations`] by reading every key, then writing those to raise: not
/// atomic (a writer in between can be overwritten). The trait's default, and the fallback of
/// stores whose conditional writes turn out to be missing.
pub(crate) async fn raise_by_read_then_write<S: KvStore + ?Sized>(
    store: &S,
    items: Vec<(String, u32)>,
    ttl: Option<Duration>,
) -> Result<Vec<u32>> {
    let keys: Vec<String> = items.iter().map(|(k, _)| k.clone()).collect();
    let current = store.mget(&keys).await?;
    let mut out = Vec::with_capacity(items.len());
    let mut writes = Vec::new();
    for ((key, want), have) in items.into_iter().zip(current) {
        let have = have
            .map(|raw| crate::codec::decode_generation(&key, &raw))
            .transpose()?;
        match have {
            Some(h) if h > want => out.push(h),
            _ => {
                writes.push((key, crate::codec::encode_generation(want).into()));
                out.push(want);
            }
        }
    }
    if !writes.is_empty() {
        store.mset(writes, ttl).await?;
    }
    Ok(out)
}

/// Batch helpers over any [`KvStore`]: split to the store's per-call limit and keep up to
/// `max_concurrent_calls` calls in flight.
#[async_trait]
pub trait KvStoreExt: KvStore {
    /// [`KvStore::mset`] of any number of items.
    async fn mset_all(&self, items: Vec<(String, KvValue)>, ttl: Option<Duration>) -> Result<()> {
        let caps = self.capabilities();
        // A store may declare 0 (a public field); treat it as one key per call, never divide by it.
        let per_call = caps.max_keys_per_call.max(1);
        if items.len() <= per_call {
            return self.mset(items, ttl).await;
        }
        let mut chunks = Vec::with_capacity(items.len() / per_call + 1);
        let mut it = items.into_iter().peekable();
        while it.peek().is_some() {
            chunks.push(it.by_ref().take(per_call).collect::<Vec<_>>());
        }
        let calls: Vec<_> = chunks.into_iter().map(|c| self.mset(c, ttl)).collect();
        futures::stream::iter(calls)
            .buffer_unordered(caps.max_concurrent_calls.max(1))
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }

    /// [`KvStore::mget`] of any number of keys, in order.
    async fn mget_all(&self, keys: &[String]) -> Result<Vec<Option<Bytes>>> {
        if keys.len() <= self.capabilities().max_keys_per_call.max(1) {
            return self.mget(keys).await;
        }
        let mut out = vec![None; keys.len()];
        let mut chunks = self.mget_chunks(keys);
        while let Some((offset, values)) = chunks.try_next().await? {
            for (slot, v) in out[offset..].iter_mut().zip(values) {
                *slot = v;
            }
        }
        Ok(out)
    }

    /// [`KvStore::mget`] of any number of keys, split to the per-call limit with up to
    /// `max_concurrent_calls` calls in flight, yielding each call's values with the position of
    /// its first key as soon as the call completes (in completion order): a caller can work on
    /// early values while later calls are still on the wire.
    fn mget_chunks<'a>(
        &'a self,
        keys: &'a [String],
    ) -> BoxStream<'a, Result<(usize, Vec<Option<Bytes>>)>> {
        let caps = self.capabilities();
        let per_call = caps.max_keys_per_call.max(1);
        futures::stream::iter(
            keys.chunks(per_call)
                .enumerate()
                .map(move |(i, chunk)| async move { Ok((i * per_call, self.mget(chunk).await?)) }),
        )
        .buffer_unordered(caps.max_concurrent_calls.max(1))
        .boxed()
    }

    /// [`KvStore::raise_generations`] of any number of keys, answers in order.
    async fn raise_generations_all(
        &self,
        items: Vec<(String, u32)>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u32>> {
        let per_call = self.capabilities().max_keys_per_call.max(1);
        let mut out = Vec::with_capacity(items.len());
        let mut it = items.into_iter().peekable();
        while it.peek().is_some() {
            let chunk: Vec<_> = it.by_ref().take(per_call).collect();
            out.extend(self.raise_generations(chunk, ttl).await?);
        }
        Ok(out)
    }

    /// [`KvStore::clear_generations`] of any number of keys.
    async fn clear_generations_all(&self, items: Vec<(String, u32)>) -> Result<()> {
        let caps = self.capabilities();
        let per_call = caps.max_keys_per_call.max(1);
        let mut calls = Vec::with_capacity(items.len() / per_call + 1);
        let mut it = items.into_iter().peekable();
        while it.peek().is_some() {
            calls.push(self.clear_generations(it.by_ref().take(per_call).collect()));
        }
        futures::stream::iter(calls)
            .buffer_unordered(caps.max_concurrent_calls.max(1))
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }

    /// [`KvStore::delete`] of any number of keys.
    async fn delete_all(&self, keys: &[String]) -> Result<()> {
        let caps = self.capabilities();
        let calls: Vec<_> = keys
            .chunks(caps.max_keys_per_call.max(1))
            .map(|c| self.delete(c))
            .collect();
        futures::stream::iter(calls)
            .buffer_unordered(caps.max_concurrent_calls.max(1))
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }

    /// [`KvStore::expire`] of any number of keys, or [`KvStoreExt::delete_all`] when the store
    /// cannot expire.
    async fn expire_all(&self, keys: &[String], after: Duration) -> Result<()> {
        let caps = self.capabilities();
        if !caps.native_expire {
            return self.delete_all(keys).await;
        }
        let calls: Vec<_> = keys
            .chunks(caps.max_keys_per_call.max(1))
            .map(|c| self.expire(c, after))
            .collect();
        futures::stream::iter(calls)
            .buffer_unordered(caps.max_concurrent_calls.max(1))
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }
}

impl<T: KvStore + ?Sized> KvStoreExt for T {}
