//! `tq soak-worker`: one client process of a soak, which the soak may kill at any moment.
//!
//! - role `stream`: a producer writing keyed samples (`kv_batch_put`, tag `id`) and a consumer
//!   taking them with an acknowledged stream, checking every row's checksum, acknowledging,
//!   then clearing the samples (metadata API); samples a fault destroyed are read one by one and
//!   reported lost, never taken for data.
//! - role `kv`: rounds over keys of its own: put, `kv_batch_update` (add), `kv_link` to public
//!   rows, field clears, reads checked against what it wrote, and clears checked to read
//!   `NotFound`.
//!
//! Everything it does goes to its log (see [`super::ledger`]). It stops when its standard input
//! closes: the producer stops, the consumer drains what is left, and it exits.

use super::content::{self, FIELDS};
use super::ledger::{format_ids, sample_id, Log};
use clap::{Args, ValueEnum};
use futures::StreamExt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tq_client::{Client, Config, GetMetaRequest, LinkOptions, StreamConfig, Wait};
use tq_core::{
    Batch, BatchMeta, Column, Error, ErrorKind, MergeOp, Result, Retry, TagValue, Tags, Tensor,
};

/// The partition of the stream samples.
pub const STREAM_PARTITION: &str = "soak";
/// The partition of the KV workers' keys.
pub const KV_PARTITION: &str = "soak-kv";
/// Where the KV workers' linked rows live.
pub const PUBLIC_PARTITION: &str = "__public__/soak";
const TASK: &str = "train";
/// How long a failing step is retried before it is reported as failed.
const RETRY_BUDGET: Duration = Duration::from_secs(30);
/// Keys per KV worker, in three groups of what is done to them each round.
const KV_KEYS: usize = 16;
const UPDATED: std::ops::Range<usize> = 0..8;
const LINKED: std::ops::Range<usize> = 8..12;
const FIELD_CLEARED: std::ops::Range<usize> = 12..16;
const PUBLIC_KEYS: usize = 4;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Role {
    Stream,
    Kv,
}

#[derive(Args, Debug, Clone)]
pub struct WorkerArgs {
    /// The controller (`tcp://host:port`).
    #[arg(long)]
    connect: String,
    #[arg(long, value_enum)]
    role: Role,
    /// This worker's number (unique per incarnation: sample ids and keys are derived from it).
    #[arg(long)]
    worker: u64,
    /// The log file.
    #[arg(long)]
    log: PathBuf,
    #[arg(long, default_value_t = 16)]
    batch: usize,
    #[arg(long, default_value_t = 256)]
    width: usize,
    /// The producer waits while the stream partition holds more samples than this.
    #[arg(long, default_value_t = 8192)]
    max_backlog: usize,
    /// Lease of a consumed batch, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    lease_ms: u64,
}

struct Ctx {
    tq: Client,
    log: Log,
    args: WorkerArgs,
    stop: Arc<AtomicBool>,
    /// Set when this worker's producer has written its last put: its consumer drains only
    /// after that, so no sample of its own arrives after the consumers have left.
    produced_all: AtomicBool,
    /// Errors already printed in full (step and kind).
    said: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Ctx {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn error(&self, what: &str, e: &Error) {
        self.log.line(&format!("E {what}: {:?}", e.kind()));
        self.say_first(what, e);
    }

    /// Prints the first error of each kind per step in full, for the person reading the run.
    fn say_first(&self, what: &str, e: &Error) {
        let first = self
            .said
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(format!("{what}: {:?}", e.kind()));
        if first {
            eprintln!("soak worker {}: {what}: {e}", self.args.worker);
        }
    }

    /// Runs `op` until it succeeds, fails for good, or has failed for [`RETRY_BUDGET`].
    /// `idempotent`: also repeat it after an outcome-unknown failure.
    async fn retrying<T, F, Fut>(&self, what: &str, idempotent: bool, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let started = Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) => {
                    let again = match e.retry() {
                        Retry::Safe => true,
                        Retry::OutcomeUnknown => idempotent,
                        _ => false,
                    };
                    if !again || started.elapsed() > RETRY_BUDGET {
                        return Err(e);
                    }
                    self.log
                        .line(&format!("E {what} (retried): {:?}", e.kind()));
                    self.say_first(&format!("{what} (retried)"), &e);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
    }
}

pub async fn run(args: WorkerArgs) -> Result<()> {
    if args.batch == 0 || args.width == 0 {
        return Err(Error::invalid("--batch and --width must be at least 1"));
    }
    let log = Log::create(&args.log)?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        // Standard input closing is the signal to finish.
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            stop.store(true, Ordering::Relaxed);
        });
    }
    let mut config = Config::default();
    config.net.request_timeout_ms = 5_000;
    let started = Instant::now();
    let tq = loop {
        match Client::connect_with(&args.connect, config.clone()).await {
            Ok(tq) => break tq,
            Err(e) if started.elapsed() < RETRY_BUDGET => {
                log.line(&format!("E connect (retried): {:?}", e.kind()));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let ctx = Arc::new(Ctx {
        tq,
        log,
        args,
        stop,
        produced_all: AtomicBool::new(false),
        said: Default::default(),
    });
    match ctx.args.role {
        Role::Stream => {
            let producer = tokio::spawn(produce(ctx.clone()));
            consume(&ctx).await;
            producer
                .await
                .map_err(|e| Error::internal(format!("the producer panicked: {e}")))?;
        }
        Role::Kv => kv_rounds(&ctx).await,
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Stream role

async fn produce(ctx: Arc<Ctx>) {
    let partition = ctx.tq.partition(STREAM_PARTITION);
    let mut seq = 0u64;
    while !ctx.stopped() {
        if ctx.args.max_backlog > 0 {
            let backlog = ctx.tq.controller_status().await.map(|s| {
                s.partitions
                    .iter()
                    .find(|p| p.name == STREAM_PARTITION)
                    .map_or(0, |p| p.samples)
            });
            match backlog {
                Ok(n) if n as usize > ctx.args.max_backlog => {
                    // A real rollout waits for its trainer the same way.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    ctx.error("status", &e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        }
        let n = ctx.args.batch as u64;
        let ids: Vec<i64> = (seq..seq + n)
            .map(|s| sample_id(ctx.args.worker, s))
            .collect();
        seq += n;
        let samples: Vec<(i64, i64)> = ids.iter().map(|&id| (id, 0)).collect();
        let batch = match content::rows(&samples, ctx.args.width) {
            Ok(b) => b,
            Err(e) => return ctx.log.line(&format!("V building a batch: {e}")),
        };
        let keys: Vec<String> = ids.iter().map(|id| format!("s{id}")).collect();
        let tags: Vec<Tags> = ids
            .iter()
            .map(|&id| Tags::from([("id".to_string(), TagValue::Int(id))]))
            .collect();
        ctx.log.line(&format!("P {}", format_ids(&ids)));
        // Same keys, same data: repeating the put after an unknown outcome is harmless.
        let put = ctx
            .retrying("put", true, || {
                partition.kv_batch_put(&keys, &batch, Some(tags.clone()))
            })
            .await;
        match put {
            Ok(_) => ctx.log.line("p"),
            Err(e) => {
                ctx.log.line(&format!("x {:?}", e.kind()));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    ctx.produced_all.store(true, Ordering::Relaxed);
}

/// Consumes with an acknowledged stream until stopped and idle for longer than a lease (so
/// that batches a killed worker held come back and are taken).
async fn consume(ctx: &Ctx) {
    let partition = ctx.tq.partition(STREAM_PARTITION);
    let lease = Duration::from_millis(ctx.args.lease_ms);
    let mut idle_since: Option<Instant> = None;
    loop {
        let config = StreamConfig::new(TASK, &FIELDS, ctx.args.batch)
            .acknowledged(lease)
            .idle_timeout(Duration::from_secs(1))
            .prefetch(1);
        let mut stream = match partition.stream(config) {
            Ok(s) => s,
            Err(e) => return ctx.log.line(&format!("V cannot open a stream: {e}")),
        };
        while let Some(item) = stream.next().await {
            match item {
                Ok(item) => {
                    idle_since = None;
                    let acked = ctx.retrying("ack", true, || stream.ack(&item)).await;
                    finish(ctx, &item.meta, Ok(&item.batch), acked).await;
                }
                Err(e) if e.kind() == &ErrorKind::Timeout => break,
                Err(e) if matches!(e.kind(), ErrorKind::DataLost | ErrorKind::NotFound) => {
                    // The stream gave the batch back; find it and report what is lost.
                    ctx.error("stream read", &e);
                    idle_since = None;
                    fetch_and_sort_out(ctx).await;
                    break;
                }
                Err(e) => {
                    ctx.error("stream", &e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    break;
                }
            }
        }
        if ctx.stopped() && ctx.produced_all.load(Ordering::Relaxed) {
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() > lease + Duration::from_secs(2) {
                return;
            }
        }
    }
}

/// The ids of `meta`'s samples, from their `id` tags.
fn tagged_ids(meta: &BatchMeta) -> Option<Vec<i64>> {
    meta.tags()
        .iter()
        .map(|t| match t.get("id") {
            Some(TagValue::Int(id)) => Some(*id),
            _ => None,
        })
        .collect()
}

/// Checks a read batch against its samples' ids, logs the acknowledgement, clears the samples.
async fn finish(
    ctx: &Ctx,
    meta: &BatchMeta,
    read: std::result::Result<&Batch, &Error>,
    acked: Result<usize>,
) {
    let Some(ids) = tagged_ids(meta) else {
        return ctx.log.line("V a stream sample without its `id` tag");
    };
    if let Ok(batch) = read {
        match content::check(batch) {
            Ok(rows) if rows.len() == ids.len() => {
                for (row, id) in rows.iter().zip(&ids) {
                    if !row.intact || row.id != *id {
                        ctx.log.line(&format!(
                            "M sample {id}: read row of sample {} version {} (checksum {})",
                            row.id,
                            row.ver,
                            if row.intact { "holds" } else { "fails" }
                        ));
                    }
                }
            }
            Ok(rows) => ctx.log.line(&format!(
                "M {} samples read as {} rows",
                ids.len(),
                rows.len()
            )),
            Err(what) => ctx
                .log
                .line(&format!("M samples {}: {what}", format_ids(&ids))),
        }
    }
    // `F` is written before the acknowledgement is known, for a kill in between; the stream
    // acknowledged already, so the end follows at once.
    ctx.log.line(&format!("F {}", format_ids(&ids)));
    match (&read, acked) {
        (Err(e), _) => ctx.log.line(&format!("L {:?}", e.kind())),
        (Ok(_), Ok(n)) if n == ids.len() => ctx.log.line("A"),
        (Ok(_), Ok(_)) => ctx.log.line("a"),
        (Ok(_), Err(e)) => {
            ctx.error("ack", &e);
            ctx.log.line("a");
        }
    }
    if let Err(e) = ctx
        .retrying("clear", true, || ctx.tq.clear_samples(meta))
        .await
    {
        ctx.error("clear", &e);
    }
}

/// After a stream read failed for lost data: fetches a batch under a lease, reads it sample by
/// sample, and finishes the readable ones as consumed and the rest as lost.
async fn fetch_and_sort_out(ctx: &Ctx) {
    let req = GetMetaRequest::fetch(
        STREAM_PARTITION,
        &FIELDS,
        TASK,
        ctx.args.batch,
        Wait::For(Duration::from_secs(1)),
    )
    .with_lease(Duration::from_millis(ctx.args.lease_ms));
    let meta = match ctx.tq.get_meta(req).await {
        Ok(m) if !m.is_empty() => m,
        Ok(_) => return,
        Err(e) => return ctx.error("fetch", &e),
    };
    for position in 0..meta.len() {
        let one = match meta.select_samples(&[position]) {
            Ok(m) => m,
            Err(e) => return ctx.log.line(&format!("V selecting a sample: {e}")),
        };
        let read = ctx.retrying("read", true, || ctx.tq.get_data(&one)).await;
        if let Err(e) = &read {
            if !matches!(e.kind(), ErrorKind::DataLost | ErrorKind::NotFound) {
                // Not a loss: leave it leased; it comes back when the lease ends.
                ctx.error("read", e);
                continue;
            }
        }
        let acked = ctx.retrying("ack", true, || ctx.tq.ack(TASK, &one)).await;
        finish(ctx, &one, read.as_ref(), acked).await;
    }
}

// ---------------------------------------------------------------------------------------------
// KV role

/// What a key must read as.
#[derive(Clone, Debug, PartialEq)]
enum Expect {
    /// Cleared (or never written): reads are `NotFound`.
    Absent,
    /// Written at `ver`; `n` is one of `n` (several after an update whose outcome is unknown;
    /// none after its field clear); `p` is linked when `linked`.
    Written { ver: i64, n: Vec<i64>, linked: bool },
    /// A write failed half-way: nothing is checked until the next clear.
    Unknown,
}

struct Keys {
    names: Vec<String>,
    ids: Vec<i64>,
    expect: Vec<Expect>,
    public: Vec<String>,
    /// False once the backend answered `kv_link` with `Unsupported` (KV storage resolves no
    /// links): the linked group is then written and read like the others, without `p`.
    linking: bool,
    /// Whether any link was made (the public rows are swept at the end only then: a public
    /// row never linked is not swept, by design).
    linked_once: bool,
}

impl Keys {
    fn of(worker: u64) -> Keys {
        Keys {
            names: (0..KV_KEYS).map(|k| format!("w{worker}-k{k}")).collect(),
            ids: (0..KV_KEYS).map(|k| sample_id(worker, k as u64)).collect(),
            expect: vec![Expect::Absent; KV_KEYS],
            public: (0..PUBLIC_KEYS)
                .map(|k| format!("w{worker}-pub{k}"))
                .collect(),
            linking: true,
            linked_once: false,
        }
    }

    fn public_id(&self, key: usize) -> i64 {
        -1 - (key % PUBLIC_KEYS) as i64
    }
}

fn public_row(id: i64, width: usize) -> Result<Batch> {
    let p: Vec<i64> = content::payload(id, 0, width).collect();
    Batch::from_columns([("p", Column::Dense(Tensor::from_slice(vec![1, width], &p)?))])
}

async fn kv_rounds(ctx: &Ctx) {
    let partition = ctx.tq.partition(KV_PARTITION);
    let public = ctx.tq.partition(PUBLIC_PARTITION);
    let mut keys = Keys::of(ctx.args.worker);
    if let Err(e) = write_public_rows(ctx, &keys).await {
        return ctx.log.line(&format!("V {e}"));
    }
    let mut round = 0i64;
    while !ctx.stopped() {
        round += 1;
        kv_round(ctx, &partition, &mut keys, round).await;
        ctx.log.line("R");
    }
    // Leave nothing behind: the keys, then the public rows no key links to any more.
    if let Err(e) = ctx
        .retrying("clear", true, || partition.kv_clear(&keys.names))
        .await
    {
        ctx.error("final clear", &e);
    }
    if !keys.linked_once {
        // Never linked: not the sweep's to remove.
        if let Err(e) = ctx
            .retrying("public clear", true, || public.kv_clear(&keys.public))
            .await
        {
            ctx.error("public clear", &e);
        }
        return;
    }
    let prefix = format!("w{}-pub", ctx.args.worker);
    match ctx
        .retrying("public sweep", true, || {
            public.kv_clear_unlinked_public(&prefix)
        })
        .await
    {
        Ok(swept) if swept.len() != PUBLIC_KEYS => ctx.log.line(&format!(
            "V the sweep of unlinked public rows removed {swept:?}, not the {PUBLIC_KEYS} rows"
        )),
        Ok(_) => {}
        Err(e) => ctx.error("public sweep", &e),
    }
}

/// Writes the public rows the linked keys point at (again, after a fault destroyed them).
async fn write_public_rows(ctx: &Ctx, keys: &Keys) -> Result<()> {
    let public = ctx.tq.partition(PUBLIC_PARTITION);
    for (k, name) in keys.public.iter().enumerate() {
        let row = public_row(keys.public_id(k), ctx.args.width)?;
        ctx.retrying("public put", true, || public.kv_put(name, &row, None))
            .await
            .map_err(|e| e.context(format!("cannot write public row {name}")))?;
    }
    Ok(())
}

async fn kv_round(ctx: &Ctx, partition: &tq_client::Partition, keys: &mut Keys, round: i64) {
    let width = ctx.args.width;
    // 1. Put every key at version `round`, with `n` = 0.
    let samples: Vec<(i64, i64)> = keys.ids.iter().map(|&id| (id, round)).collect();
    let batch = content::rows(&samples, width).and_then(|mut b| {
        b.insert(
            "n",
            Column::Dense(Tensor::from_slice(vec![KV_KEYS], &[0i64; KV_KEYS])?),
        )?;
        Ok(b)
    });
    let batch = match batch {
        Ok(b) => b,
        Err(e) => return ctx.log.line(&format!("V building a KV batch: {e}")),
    };
    let put = ctx
        .retrying("kv put", true, || {
            partition.kv_batch_put(&keys.names, &batch, None)
        })
        .await;
    match put {
        Ok(_) => {
            for e in keys.expect.iter_mut() {
                let linked = matches!(e, Expect::Written { linked: true, .. });
                *e = Expect::Written {
                    ver: round,
                    n: vec![0],
                    linked,
                };
            }
        }
        Err(e) => {
            ctx.error("kv put", &e);
            return reset(ctx, partition, keys).await;
        }
    }
    // 2. Add 1 to `n` of the first group (not idempotent: repeated only when nothing happened).
    let names = &keys.names[UPDATED];
    let ones = Batch::from_columns([(
        "n",
        Column::Dense(Tensor::from_vec(vec![1i64; UPDATED.len()])),
    )]);
    let updated = match ones {
        Ok(ones) => {
            ctx.retrying("kv update", false, || {
                partition.kv_batch_update(names, &ones, &MergeOp::Add)
            })
            .await
        }
        Err(e) => Err(e),
    };
    for k in UPDATED {
        if let Expect::Written { n, .. } = &mut keys.expect[k] {
            let before = n.clone();
            *n = match &updated {
                Ok(_) => before.iter().map(|v| v + 1).collect(),
                // Either outcome may have happened.
                Err(_) => before.iter().flat_map(|&v| [v, v + 1]).collect(),
            };
        }
    }
    if let Err(e) = &updated {
        ctx.error("kv update", e);
    }
    // 3. Link `p` of the second group to the public rows, where not linked yet.
    let unlinked: Vec<usize> = LINKED
        .filter(|&k| {
            keys.linking && matches!(keys.expect[k], Expect::Written { linked: false, .. })
        })
        .collect();
    if !unlinked.is_empty() {
        let names: Vec<&str> = unlinked.iter().map(|&k| keys.names[k].as_str()).collect();
        let targets: Vec<&str> = unlinked
            .iter()
            .map(|&k| keys.public[k % PUBLIC_KEYS].as_str())
            .collect();
        let options = LinkOptions {
            public_partition: PUBLIC_PARTITION.to_string(),
            ..LinkOptions::default()
        };
        match ctx
            .retrying("kv link", true, || {
                partition.kv_link(&names, &targets, &["p"], &options)
            })
            .await
        {
            Ok(_) => {
                keys.linked_once = true;
                for &k in &unlinked {
                    if let Expect::Written { linked, .. } = &mut keys.expect[k] {
                        *linked = true;
                    }
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::Unsupported { .. }) => {
                ctx.say_first("kv link", &e);
                keys.linking = false;
            }
            Err(e) => {
                ctx.error("kv link", &e);
                return reset(ctx, partition, keys).await;
            }
        }
    }
    // 4. Clear `n` of the third group.
    let names = &keys.names[FIELD_CLEARED];
    match ctx
        .retrying("kv clear fields", true, || {
            partition.kv_clear_fields(names, &["n"])
        })
        .await
    {
        Ok(()) => {
            for k in FIELD_CLEARED {
                if let Expect::Written { n, .. } = &mut keys.expect[k] {
                    n.clear();
                }
            }
        }
        Err(e) => {
            ctx.error("kv clear fields", &e);
            return reset(ctx, partition, keys).await;
        }
    }
    // 5. Read everything back; after a loss, write the keys (and the public rows, which may
    //    have been lost too) again from scratch.
    if !verify(ctx, partition, keys).await {
        reset(ctx, partition, keys).await;
        if let Err(e) = write_public_rows(ctx, keys).await {
            ctx.error("public put", &e);
        }
        return;
    }
    // 6. Every third round: clear, and check the keys read as gone.
    if round % 3 == 0 {
        reset(ctx, partition, keys).await;
        if keys.expect.iter().all(|e| *e == Expect::Absent) {
            match partition.kv_batch_get(&keys.names[..2], None).await {
                Ok(_) => ctx.log.line(&format!(
                    "V keys {:?} read as data after their clear",
                    &keys.names[..2]
                )),
                Err(e) if e.kind() == &ErrorKind::NotFound => {}
                Err(e) => ctx.error("read after clear", &e),
            }
        }
    }
}

/// Clears every key; they are then `Absent`, or `Unknown` when the clear failed.
async fn reset(ctx: &Ctx, partition: &tq_client::Partition, keys: &mut Keys) {
    let cleared = ctx
        .retrying("kv clear", true, || partition.kv_clear(&keys.names))
        .await;
    let after = match cleared {
        Ok(()) => Expect::Absent,
        Err(e) => {
            ctx.error("kv clear", &e);
            Expect::Unknown
        }
    };
    keys.expect.iter_mut().for_each(|e| *e = after.clone());
}

/// Reads every key and checks it against `keys.expect`; false when data was reported lost
/// (the keys are then cleared and written again).
async fn verify(ctx: &Ctx, partition: &tq_client::Partition, keys: &Keys) -> bool {
    let mut with_n: Vec<&str> = FIELDS.to_vec();
    with_n.push("n");
    let groups: [(std::ops::Range<usize>, Vec<&str>); 4] = [
        (UPDATED, with_n.clone()),
        (LINKED, with_n),
        (if keys.linking { LINKED } else { 0..0 }, vec!["p"]),
        (FIELD_CLEARED, FIELDS.to_vec()),
    ];
    let mut verified = 0usize;
    for (range, fields) in groups {
        if range.is_empty()
            || keys.expect[range.clone()]
                .iter()
                .any(|e| !matches!(e, Expect::Written { .. }))
        {
            continue;
        }
        let names = &keys.names[range.clone()];
        let read = ctx
            .retrying("kv read", true, || {
                partition.kv_batch_get(names, Some(&fields))
            })
            .await;
        let batch = match read {
            Ok(b) => b,
            Err(e) if matches!(e.kind(), ErrorKind::DataLost | ErrorKind::NotFound) => {
                ctx.log.line(&format!("KL {} {:?}", names.len(), e.kind()));
                return false;
            }
            Err(e) => {
                ctx.error("kv read", &e);
                return false;
            }
        };
        if fields == ["p"] {
            verified += check_public(ctx, keys, range, &batch);
        } else {
            verified += check_rows(ctx, keys, range, &batch);
        }
    }
    // The field-cleared group must not read `n` as data.
    if let Expect::Written { n, .. } = &keys.expect[FIELD_CLEARED.start] {
        if n.is_empty() {
            match partition
                .kv_batch_get(&keys.names[FIELD_CLEARED], Some(&["n"]))
                .await
            {
                Ok(_) => ctx.log.line(&format!(
                    "V field `n` of {:?} read as data after its field clear",
                    &keys.names[FIELD_CLEARED]
                )),
                Err(e) if e.kind() == &ErrorKind::NotFound => {}
                Err(e) => ctx.error("read of a cleared field", &e),
            }
        }
    }
    ctx.log.line(&format!("G {verified}"));
    true
}

fn check_rows(ctx: &Ctx, keys: &Keys, range: std::ops::Range<usize>, batch: &Batch) -> usize {
    let rows = match content::check(batch) {
        Ok(rows) if rows.len() == range.len() => rows,
        Ok(rows) => {
            ctx.log.line(&format!(
                "M {} keys read as {} rows",
                range.len(),
                rows.len()
            ));
            return 0;
        }
        Err(what) => {
            ctx.log
                .line(&format!("M keys {:?}: {what}", &keys.names[range]));
            return 0;
        }
    };
    let ns: Option<Vec<i64>> = match batch.column("n") {
        Some(Column::Dense(t)) => t.to_vec::<i64>().ok(),
        _ => None,
    };
    let mut ok = 0;
    for (r, k) in range.enumerate() {
        let Expect::Written { ver, n, .. } = &keys.expect[k] else {
            continue;
        };
        let row = rows[r];
        let n_read = ns.as_ref().and_then(|v| v.get(r).copied());
        let n_ok = n.is_empty() || n_read.is_some_and(|v| n.contains(&v));
        if row.intact && row.id == keys.ids[k] && row.ver == *ver && n_ok {
            ok += 1;
        } else {
            ctx.log.line(&format!(
                "M key {}: expected version {ver} n in {n:?}, read sample {} version {} n {n_read:?} (checksum {})",
                keys.names[k],
                row.id,
                row.ver,
                if row.intact { "holds" } else { "fails" }
            ));
        }
    }
    ok
}

fn check_public(ctx: &Ctx, keys: &Keys, range: std::ops::Range<usize>, batch: &Batch) -> usize {
    let Some(Column::Dense(p)) = batch.column("p") else {
        ctx.log.line("M a read of linked field `p` without it");
        return 0;
    };
    let Ok(values) = p.to_vec::<i64>() else {
        ctx.log.line("M linked field `p` of another dtype");
        return 0;
    };
    let width = ctx.args.width;
    let mut ok = 0;
    for (r, k) in range.enumerate() {
        let expected: Vec<i64> = content::payload(keys.public_id(k), 0, width).collect();
        if values.get(r * width..(r + 1) * width) == Some(expected.as_slice()) {
            ok += 1;
        } else {
            ctx.log.line(&format!(
                "M key {}: linked field `p` does not hold public row {}",
                keys.names[k],
                keys.public[k % PUBLIC_KEYS]
            ));
        }
    }
    ok
}
