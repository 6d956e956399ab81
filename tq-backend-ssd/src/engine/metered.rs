//! [`MeteredEngine`]: bytes moved, batch latency and failed operations of an I/O engine
//! (`tq_ssd_{write,read}_bytes_total`, `tq_ssd_{write,read}_duration_seconds`,
//! `tq_ssd_io_errors_total`, labelled with the engine), recorded around every batch.

use super::{IoEngine, ReadOp, WriteOp};
use async_trait::async_trait;
use bytes::Bytes;
use metrics::{Counter, Histogram};
use std::io;
use std::sync::Arc;
use std::time::Instant;

/// Handles of one direction.
#[derive(Debug)]
struct Direction {
    bytes: Counter,
    duration: Histogram,
    errors: Counter,
}

impl Direction {
    fn new(engine: &'static str, op: &'static str) -> Direction {
        Direction {
            bytes: metrics::counter!(format!("tq_ssd_{op}_bytes_total"), "engine" => engine),
            duration: metrics::histogram!(format!("tq_ssd_{op}_duration_seconds"), "engine" => engine),
            errors: metrics::counter!("tq_ssd_io_errors_total", "engine" => engine, "op" => op),
        }
    }

    fn record<T>(&self, start: Instant, bytes: u64, results: &[io::Result<T>]) {
        self.duration.record(start.elapsed().as_secs_f64());
        self.bytes.increment(bytes);
        let failed = results.iter().filter(|r| r.is_err()).count() as u64;
        if failed > 0 {
            self.errors.increment(failed);
        }
    }
}

/// An [`IoEngine`] that records what the engine it wraps does.
#[derive(Debug)]
pub struct MeteredEngine {
    inner: Arc<dyn IoEngine>,
    write: Direction,
    read: Direction,
}

impl MeteredEngine {
    /// `engine` behind its meter (handles of the recorder installed now).
    pub fn wrap(engine: Arc<dyn IoEngine>) -> Arc<dyn IoEngine> {
        let name = engine.name();
        Arc::new(MeteredEngine {
            write: Direction::new(name, "write"),
            read: Direction::new(name, "read"),
            inner: engine,
        })
    }
}

#[async_trait]
impl IoEngine for MeteredEngine {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn write_files(&self, ops: Vec<WriteOp>) -> Vec<io::Result<()>> {
        let start = Instant::now();
        let bytes: u64 = ops.iter().map(|op| op.data.len() as u64).sum();
        let results = self.inner.write_files(ops).await;
        self.write.record(start, bytes, &results);
        results
    }

    async fn read_files(&self, ops: Vec<ReadOp>) -> Vec<io::Result<Bytes>> {
        let start = Instant::now();
        let results = self.inner.read_files(ops).await;
        let bytes = results
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .map(|b| b.len() as u64)
            .sum();
        self.read.record(start, bytes, &results);
        results
    }
}
