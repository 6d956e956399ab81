//! [`MeteredStore`]: latency and failures of every store command, per store and command
//! (`tq_kv_store_command_duration_seconds{store, command}`,
//! `tq_kv_store_command_errors_total{store, command}`), so an operator can tell a slow Redis
//! from a slow tq. The adapter wraps every store it is given.

use crate::store::{KvCapabilities, KvStore, KvValue};
use async_trait::async_trait;
use bytes::Bytes;
use metrics::{Counter, Histogram, Label};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tq_core::Result;

/// Handles of one command.
struct Command {
    duration: Histogram,
    errors: Counter,
}

impl Command {
    fn new(store: &str, command: &'static str) -> Command {
        let labels = || {
            vec![
                Label::new("store", store.to_string()),
                Label::new("command", command),
            ]
        };
        Command {
            duration: metrics::histogram!("tq_kv_store_command_duration_seconds", labels()),
            errors: metrics::counter!("tq_kv_store_command_errors_total", labels()),
        }
    }

    async fn measure<T>(&self, work: impl Future<Output = Result<T>>) -> Result<T> {
        let start = Instant::now();
        let result = work.await;
        self.duration.record(start.elapsed().as_secs_f64());
        if result.is_err() {
            self.errors.increment(1);
        }
        result
    }
}

/// A [`KvStore`] that times every command it forwards.
pub struct MeteredStore {
    inner: Arc<dyn KvStore>,
    mset: Command,
    mget: Command,
    delete: Command,
    expire: Command,
    raise: Command,
    mset_then_raise: Command,
    clear: Command,
}

impl MeteredStore {
    /// `store`, named `name` in the `store` label, behind its meter (handles of the recorder
    /// installed now).
    pub fn wrap(name: &str, store: Arc<dyn KvStore>) -> Arc<dyn KvStore> {
        Arc::new(MeteredStore {
            inner: store,
            mset: Command::new(name, "mset"),
            mget: Command::new(name, "mget"),
            delete: Command::new(name, "delete"),
            expire: Command::new(name, "expire"),
            raise: Command::new(name, "raise_generations"),
            mset_then_raise: Command::new(name, "mset_then_raise"),
            clear: Command::new(name, "clear_generations"),
        })
    }
}

#[async_trait]
impl KvStore for MeteredStore {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn capabilities(&self) -> KvCapabilities {
        self.inner.capabilities()
    }

    async fn mset(&self, items: Vec<(String, KvValue)>, ttl: Option<Duration>) -> Result<()> {
        self.mset.measure(self.inner.mset(items, ttl)).await
    }

    async fn mget(&self, keys: &[String]) -> Result<Vec<Option<Bytes>>> {
        self.mget.measure(self.inner.mget(keys)).await
    }

    async fn delete(&self, keys: &[String]) -> Result<()> {
        self.delete.measure(self.inner.delete(keys)).await
    }

    async fn expire(&self, keys: &[String], after: Duration) -> Result<()> {
        self.expire.measure(self.inner.expire(keys, after)).await
    }

    async fn raise_generations(
        &self,
        items: Vec<(String, u32)>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u32>> {
        self.raise
            .measure(self.inner.raise_generations(items, ttl))
            .await
    }

    /// Timed as one `mset_then_raise` command (one round trip where the store combines them).
    async fn mset_then_raise(
        &self,
        items: Vec<(String, KvValue)>,
        raise: Vec<(String, u32)>,
        ttl: Option<Duration>,
    ) -> Result<Vec<u32>> {
        self.mset_then_raise
            .measure(self.inner.mset_then_raise(items, raise, ttl))
            .await
    }

    async fn clear_generations(&self, items: Vec<(String, u32)>) -> Result<()> {
        self.clear
            .measure(self.inner.clear_generations(items))
            .await
    }
}
