//! Clears (hide → delete → release) and the clears whose storage step failed.
//!
//! A clear first hides its samples at the controller, then deletes their cells in storage,
//! then releases the indexes; the caller does not wait for the release's answer (the
//! client's next request does, decision 0044). When the storage step fails (a unit or Redis is down), the
//! samples stay hidden — nothing reads half-deleted data — but their keys cannot be written
//! again until the clear is finished. Three things finish it, so a key is never stuck:
//! - the client retries every unfinished clear in the background, with backoff
//!   ([`Client::retry_unfinished_clears`] runs them at once);
//! - the next `kv_clear` of the key marks samples already being cleared again and finishes them;
//! - the next `kv_put` of the key finishes its clear first (the controller reports such keys
//!   instead of refusing them).

use crate::client::{owned_fields, owned_keys};
use crate::Client;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tq_core::{BatchMeta, Error, FieldFilter, FieldName, Result, SampleId};

/// A clear whose storage step failed, kept to be finished later.
#[derive(Debug, Clone)]
enum Unfinished {
    /// Whole samples, marked clearing: delete every cell, then release.
    Samples(BatchMeta),
    /// A field-level clear: delete the cells of `fields`, then unblock them.
    Fields {
        meta: BatchMeta,
        samples: Vec<SampleId>,
        fields: Vec<FieldName>,
    },
}

/// The unfinished clears of one client (shared by its clones). Each stays listed until a
/// retry succeeds, so the count never dips while a retry is in flight.
#[derive(Debug, Default)]
pub(crate) struct UnfinishedClears {
    items: Mutex<(u64, Vec<(u64, Unfinished)>)>,
    /// A background retry task is running.
    retrying: AtomicBool,
}

impl UnfinishedClears {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Vec<(u64, Unfinished)>)> {
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn push(&self, u: Unfinished) {
        let mut g = self.lock();
        g.0 += 1;
        let id = g.0;
        g.1.push((id, u));
    }
    fn snapshot(&self) -> Vec<(u64, Unfinished)> {
        self.lock().1.clone()
    }
    fn remove(&self, id: u64) {
        self.lock().1.retain(|(i, _)| *i != id);
    }
    fn len(&self) -> usize {
        self.lock().1.len()
    }
}

/// First pause of the background retry; it doubles up to [`RETRY_MAX_PAUSE`].
const RETRY_FIRST_PAUSE: Duration = Duration::from_millis(100);
const RETRY_MAX_PAUSE: Duration = Duration::from_secs(10);
/// The background task gives up after this many rounds (about 10 minutes); the keys are still
/// freed by their next clear or put, or by clearing the partition.
const RETRY_ROUNDS: u32 = 70;

impl Client {
    /// Clears whole samples: hide them at once, delete their cells, then release the indexes.
    /// Samples already cleared are skipped; a failed clear can simply be repeated (and is
    /// retried in the background).
    pub async fn clear_samples(&self, meta: &BatchMeta) -> Result<()> {
        if meta.is_empty() {
            return Ok(());
        }
        self.clear(meta.partition(), Some(meta.samples())).await
    }

    /// Clears every sample of `partition` and removes the partition (with its completion mark
    /// and sampler state).
    pub(crate) async fn clear_partition(&self, partition: &str) -> Result<()> {
        self.forget_cached(partition, None);
        self.clear(partition, None).await?;
        self.control().drop_partition(partition).await
    }

    /// Clears every sample of `partition`; a complete partition stays (see
    /// `Partition::clear_samples`).
    pub(crate) async fn clear_all_samples(&self, partition: &str) -> Result<()> {
        self.forget_cached(partition, None);
        self.clear(partition, None).await
    }

    async fn clear(&self, partition: &str, samples: Option<&[SampleId]>) -> Result<()> {
        let marked = self.control().mark_clearing(partition, samples).await?;
        self.finish_clear(partition, marked).await
    }

    /// Steps 2 and 3 of a whole-sample clear of `marked` (already hidden).
    pub(crate) async fn finish_clear(&self, partition: &str, marked: BatchMeta) -> Result<()> {
        if marked.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.storage().clear(&marked, &FieldFilter::All).await {
            self.defer(Unfinished::Samples(marked));
            return Err(e.context(format!(
                "partition `{partition}`: storage clear failed; the samples stay hidden and the \
                 clear is retried in the background (or by clearing them again)"
            )));
        }
        // The cells are gone: the caller need not wait for the release's answer (a remote
        // controller's round trip), and this client's next request waits for it instead.
        self.control()
            .release_behind(partition, marked.samples())
            .await
    }

    /// Waits until the requests this client sent without waiting for their answer (the
    /// release that ends a clear, see [`tq_controller::ControlPlane::release_behind`]) have
    /// been answered. A client about to stop calls it, so that its runtime does not drop them.
    pub async fn settle(&self) {
        self.control().settle().await
    }

    /// Clears keys. Without `fields` the keys disappear; with `fields` only those cells are
    /// removed and keys, other fields, tags and consumption stay. Keys or fields that do not
    /// exist are skipped, so clearing twice is harmless; a key whose earlier clear failed
    /// half-way is cleared for good. An empty field list is `Invalid`.
    pub(crate) async fn kv_clear<K: AsRef<str>>(
        &self,
        partition: &str,
        keys: &[K],
        fields: Option<&[&str]>,
    ) -> Result<()> {
        let keys = owned_keys(partition, keys)?;
        let fields = fields.map(|f| owned_fields(partition, f)).transpose()?;
        self.forget_cached(partition, Some(&keys));
        let Some(fields) = fields else {
            return self.clear_keys(partition, &keys).await;
        };
        let kv = self
            .control()
            .kv_retrieve_meta(partition, &keys, false)
            .await?;
        if kv.meta.is_empty() {
            return Ok(());
        }
        let samples = kv.meta.samples().to_vec();
        let marked = self
            .control()
            .begin_clear_fields(partition, &samples, &fields)
            .await?;
        if !marked.is_empty() {
            let only = FieldFilter::Only(fields.clone());
            if let Err(e) = self.storage().clear(&marked, &only).await {
                self.defer(Unfinished::Fields {
                    meta: marked,
                    samples,
                    fields: fields.clone(),
                });
                return Err(e.context(format!(
                    "partition `{partition}`: storage clear of fields {fields:?} failed; the cells \
                     read as cleared and the clear is retried in the background"
                )));
            }
        }
        self.control()
            .finish_clear_fields(partition, &samples, &fields)
            .await
    }

    /// Whole-key clear, including keys a failed clear left hidden.
    pub(crate) async fn clear_keys(&self, partition: &str, keys: &[String]) -> Result<()> {
        let marked = self.control().kv_mark_clearing(partition, keys).await?;
        self.finish_clear(partition, marked).await
    }

    /// How many clears whose storage step failed are waiting to be finished.
    pub fn unfinished_clears(&self) -> usize {
        self.unfinished().len()
    }

    /// Tries every unfinished clear now (the background task does the same with backoff).
    /// Returns how many are still unfinished; the first error, if every one that failed did.
    pub async fn retry_unfinished_clears(&self) -> Result<usize> {
        let mut first_error: Option<Error> = None;
        for (id, u) in self.unfinished().snapshot() {
            let result = match &u {
                Unfinished::Samples(meta) => {
                    match self.storage().clear(meta, &FieldFilter::All).await {
                        Ok(()) => {
                            self.control()
                                .release(meta.partition(), meta.samples())
                                .await
                        }
                        Err(e) => Err(e),
                    }
                }
                Unfinished::Fields {
                    meta,
                    samples,
                    fields,
                } => {
                    let only = FieldFilter::Only(fields.clone());
                    match self.storage().clear(meta, &only).await {
                        Ok(()) => {
                            self.control()
                                .finish_clear_fields(meta.partition(), samples, fields)
                                .await
                        }
                        Err(e) => Err(e),
                    }
                }
            };
            match result {
                Ok(()) => self.unfinished().remove(id),
                Err(e) => {
                    tracing::debug!(error = %e, "unfinished clear still fails");
                    first_error.get_or_insert(e);
                }
            }
        }
        let left = self.unfinished().len();
        match first_error {
            Some(e) if left > 0 => Err(e.context(format!("{left} clears still unfinished"))),
            _ => Ok(left),
        }
    }

    /// Keeps `u` and makes sure a background task retries it.
    fn defer(&self, u: Unfinished) {
        self.unfinished().push(u);
        self.spawn_retry();
    }

    fn spawn_retry(&self) {
        if self.unfinished().retrying.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.unfinished().retrying.store(false, Ordering::Release);
            return;
        };
        let client = self.clone();
        runtime.spawn(async move {
            let mut pause = RETRY_FIRST_PAUSE;
            let mut done = false;
            for _ in 0..RETRY_ROUNDS {
                tokio::time::sleep(pause).await;
                if matches!(client.retry_unfinished_clears().await, Ok(0)) {
                    done = true;
                    break;
                }
                pause = (pause * 2).min(RETRY_MAX_PAUSE);
            }
            client.unfinished().retrying.store(false, Ordering::Release);
            let left = client.unfinished().len();
            if done && left > 0 {
                // Deferred while this task was finishing: keep going.
                client.spawn_retry();
            } else if left > 0 {
                tracing::error!(
                    left,
                    "giving up retrying unfinished clears in the background; their keys are \
                     freed by the next clear or put of them, or by clearing the partition"
                );
            }
        });
    }
}
