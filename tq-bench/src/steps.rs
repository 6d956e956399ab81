//! A KV put and get taken apart into the calls they make, each timed on its own: the key
//! resolution, the storage write, the production notice, the key lookup and the storage read.
//!
//! Why: a remote `kv_batch_put` is three sequential round trips (controller, units,
//! controller) and its wall time alone does not say which of them is far from the wire. The
//! steps are the same calls `tq_client` makes (`Client::control()` and `Client::storage()`),
//! in the same order, on the same batch, so their sum should be close to the whole call; a
//! controller round trip of one key is measured next to them as the floor of any controller
//! step.
//!
//! The last rows are what a caller outside the runtime pays: the floor again from a task of the
//! runtime and from a thread waiting with [`tq_client::wait::wait_for`] (which stays awake for
//! a moment before it parks), and a one-sample `kv_put` from a thread, awaited by `block_on`
//! (parks at once) or by `wait_for`. The gap between `block_on` and a task is the wake-up of
//! the parked calling thread, once per answer.

use crate::measure::Stats;
use crate::workloads;
use std::time::{Duration, Instant};
use tq_client::wait::wait_for;
use tq_client::Client;
use tq_controller::ProductionNotice;
use tq_core::{Batch, Error, Result, Tags};

/// The partition the steps write to (its keys are cleared after every repetition).
const PARTITION: &str = "bench-steps";

/// One workload's steps: name and timing, in the order a put then a get makes them.
#[derive(Debug, Clone)]
pub struct StepReport {
    pub workload: String,
    pub bytes: usize,
    pub steps: Vec<(&'static str, Stats)>,
}

/// Runs `reps` rounds (after one untimed, verified round) of the steps of a `kv_batch_put` and
/// a `kv_batch_get` of `batch` under keys `key_{i}`, each round ending with an untimed
/// `kv_clear`.
pub fn run(
    runtime: &tokio::runtime::Runtime,
    tq: &Client,
    name: &str,
    batch: &Batch,
    reps: usize,
) -> Result<StepReport> {
    let keys = workloads::keys(batch.len());
    let one_key = vec![keys[0].clone()];
    let types = batch.type_schemas();
    let small = crate::latency::sample_4k()?;
    let mut times: [Vec<Duration>; 10] = Default::default();
    for rep in 0..=reps.max(1) {
        let round = runtime.block_on(async {
            let control = tq.control();
            let storage = tq.storage();
            let t = Instant::now();
            let kv = control.kv_prepare_put(PARTITION, &keys, &types).await?;
            let prepare = t.elapsed();
            if !kv.clearing.is_empty() || kv.keys != keys {
                return Err(Error::internal(format!(
                    "{name}: partition `{PARTITION}` was not empty before a step round"
                )));
            }
            let t = Instant::now();
            let receipt = storage.put(&kv.meta, batch).await?;
            let write = t.elapsed();
            let t = Instant::now();
            control
                .notify_production(ProductionNotice {
                    partition: PARTITION.to_string(),
                    samples: kv.meta.samples().to_vec(),
                    schemas: receipt.schemas,
                    tags: Some(vec![Tags::new(); keys.len()]),
                    backend_meta: receipt.backend_meta,
                })
                .await?;
            let notify = t.elapsed();
            let t = Instant::now();
            let found = control.kv_retrieve_meta(PARTITION, &keys, false).await?;
            let lookup = t.elapsed();
            let t = Instant::now();
            let back = storage.get(&found.meta).await?;
            let read = t.elapsed();
            if rep == 0 && &back != batch {
                return Err(Error::internal(format!(
                    "{name}: the steps read back other data than they wrote"
                )));
            }
            drop(std::hint::black_box(back));
            let t = Instant::now();
            control.kv_retrieve_meta(PARTITION, &one_key, false).await?;
            let floor = t.elapsed();
            tq.partition(PARTITION).kv_clear(&keys).await?;
            Ok([prepare, write, notify, lookup, read, floor])
        })?;
        // The floor again from a task of the runtime instead of `block_on`: the answer then
        // wakes its caller on the worker that read it, not a thread parked outside the runtime.
        let floor_in_task = {
            let (tq, one_key) = (tq.clone(), one_key.clone());
            in_task(runtime, async move {
                let t = Instant::now();
                tq.control()
                    .kv_retrieve_meta(PARTITION, &one_key, false)
                    .await?;
                Ok(t.elapsed())
            })?
        };
        // The floor from a thread that stays awake for a moment before it parks.
        let t = Instant::now();
        wait_for(
            runtime.handle(),
            tq.control().kv_retrieve_meta(PARTITION, &one_key, false),
        )?;
        let floor_waiting = t.elapsed();
        // One small kv_put from outside the runtime, awaited by block_on and by wait_for.
        let t = Instant::now();
        runtime.block_on(tq.partition(PARTITION).kv_put("small", &small, None))?;
        let small_parked = t.elapsed();
        let t = Instant::now();
        wait_for(
            runtime.handle(),
            tq.partition(PARTITION).kv_put("small", &small, None),
        )?;
        let small_waiting = t.elapsed();
        runtime.block_on(tq.partition(PARTITION).kv_clear(&["small"]))?;
        if rep > 0 {
            let more = [floor_in_task, floor_waiting, small_parked, small_waiting];
            for (all, d) in times.iter_mut().zip(round.into_iter().chain(more)) {
                all.push(d);
            }
        }
    }
    let [prepare, write, notify, lookup, read, floor, floor_in_task, floor_waiting, small_parked, small_waiting] =
        times.map(Stats::from_samples);
    Ok(StepReport {
        workload: name.to_string(),
        bytes: batch.nbytes(),
        steps: vec![
            ("put 1/3: kv_prepare_put (controller)", prepare),
            ("put 2/3: storage put (units)", write),
            ("put 3/3: notify_production (controller)", notify),
            ("get 1/2: kv_retrieve_meta (controller)", lookup),
            ("get 2/2: storage get (units)", read),
            ("floor: kv_retrieve_meta of 1 key", floor),
            ("floor, called from a task of the runtime", floor_in_task),
            ("floor, from a thread in wait_for", floor_waiting),
            ("kv_put of 4 KiB from block_on", small_parked),
            ("kv_put of 4 KiB from wait_for", small_waiting),
        ],
    })
}

/// Runs `work` as a task of `runtime` and waits for it from outside the runtime.
fn in_task<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    work: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    runtime
        .block_on(runtime.spawn(work))
        .map_err(|e| Error::internal("a step task failed").with_source(e))?
}

/// Markdown table header for [`StepReport::rows`].
pub const TABLE_HEADER: &str =
    "| workload | step | ms median (min–max) | Gbit/s |\n|---|---|---|---|";

impl StepReport {
    /// Markdown rows, one per step, then the sums of the put's and the get's medians.
    pub fn rows(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut out: Vec<String> = self
            .steps
            .iter()
            .map(|(step, s)| {
                let gbit = if step.contains("storage") {
                    format!("{:.2}", s.gbit_per_s(self.bytes))
                } else {
                    String::new()
                };
                format!(
                    "| {} | {step} | {:.3} ({:.3}–{:.3}) | {gbit} |",
                    self.workload,
                    ms(s.median),
                    ms(s.min),
                    ms(s.max)
                )
            })
            .collect();
        let sum = |prefix: &str| -> f64 {
            self.steps
                .iter()
                .filter(|(step, _)| step.starts_with(prefix))
                .map(|(_, s)| ms(s.median))
                .sum()
        };
        out.push(format!(
            "| {} | put, sum of its steps | {:.3} | |",
            self.workload,
            sum("put ")
        ));
        out.push(format!(
            "| {} | get, sum of its steps | {:.3} | |",
            self.workload,
            sum("get ")
        ));
        out.join("\n")
    }
}
