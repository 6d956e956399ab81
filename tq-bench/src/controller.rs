//! Controller micro-benchmarks: the metadata cost of a batch, with no payload.

use crate::measure::{measure, measure_rounds, Stats};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tq_controller::{
    ControlPlane, Controller, ControllerConfig, GetMetaMode, GetMetaRequest, ProductionNotice,
    RequestId, Wait,
};
use tq_core::{DType, FieldMeta, Result};

/// Untimed rounds before the timed ones: a fresh controller's first rounds grow its tables and
/// are several times slower than the steady state every later round sees.
pub const WARMUP_ROUNDS: usize = 10;

/// `fields` dense f32 fields of 128 elements, `field_0`, `field_1`, ...
fn f32_fields(fields: usize) -> BTreeMap<String, FieldMeta> {
    (0..fields)
        .map(|f| {
            (
                format!("field_{f}"),
                FieldMeta::dense(DType::F32, vec![128]),
            )
        })
        .collect()
}

/// `allocate → notify(fields) → fetch` of `samples` samples with `fields` fields, then an
/// untimed clear so every iteration starts from the same state.
pub fn allocate_notify_fetch(
    runtime: &tokio::runtime::Runtime,
    samples: usize,
    fields: usize,
    reps: usize,
) -> Result<Stats> {
    let c = Controller::new(ControllerConfig::default())?;
    let schemas = f32_fields(fields);
    measure_rounds(WARMUP_ROUNDS, reps, || {
        runtime.block_on(one_round(&c, samples, &schemas))
    })
}

/// [`allocate_notify_fetch`] with the insert and the fetch tagged with request ids
/// (`Controller::get_meta_once`, what a remote client sends): the cost of remembering each
/// answer, next to the plain round in the same run.
pub fn allocate_notify_fetch_tagged(
    runtime: &tokio::runtime::Runtime,
    samples: usize,
    fields: usize,
    reps: usize,
) -> Result<Stats> {
    let c = Controller::new(ControllerConfig::default())?;
    let schemas = f32_fields(fields);
    let seq = std::sync::atomic::AtomicU64::new(1);
    let tagged = |req| {
        let n = seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // One request in flight at a time: everything below it is finished.
        let id = RequestId {
            client: 1,
            seq: n,
            done_below: n,
        };
        c.get_meta_once(req, id)
    };
    measure_rounds(WARMUP_ROUNDS, reps, || {
        runtime.block_on(one_round_with(&c, samples, &schemas, tagged))
    })
}

/// One timed allocate → notify → fetch of `samples` samples with `fields` fields on `plane`,
/// followed by an untimed clear.
pub fn round(
    runtime: &tokio::runtime::Runtime,
    plane: &dyn ControlPlane,
    samples: usize,
    fields: usize,
) -> Result<Duration> {
    runtime.block_on(one_round(plane, samples, &f32_fields(fields)))
}

/// One timed allocate → notify → fetch, followed by an untimed clear.
async fn one_round(
    c: &dyn ControlPlane,
    samples: usize,
    schemas: &BTreeMap<String, FieldMeta>,
) -> Result<Duration> {
    one_round_with(c, samples, schemas, |req| c.get_meta(req)).await
}

/// [`one_round`] with the insert and the fetch made by `get_meta` (plain, or tagged with a
/// request id).
async fn one_round_with<F, Fut>(
    c: &dyn ControlPlane,
    samples: usize,
    schemas: &BTreeMap<String, FieldMeta>,
    get_meta: F,
) -> Result<Duration>
where
    F: Fn(GetMetaRequest) -> Fut,
    Fut: std::future::Future<Output = Result<tq_core::BatchMeta>>,
{
    let t = Instant::now();
    let meta = get_meta(insert_request("bench", &[], samples)).await?;
    c.notify_production(produced("bench", &meta, schemas.clone()))
        .await?;
    let fetched = get_meta(GetMetaRequest {
        partition: "bench".into(),
        fields: schemas.keys().cloned().collect(),
        mode: GetMetaMode::Fetch {
            task: "t".into(),
            batch_size: samples,
            wait: Wait::NoWait,
            lease: None,
        },
        sampler: None,
        dp_rank: None,
        batch_index: None,
        sampler_args: None,
    })
    .await?;
    let elapsed = t.elapsed();
    assert_eq!(fetched.len(), samples, "fetch returned the whole batch");
    let marked = c.mark_clearing("bench", Some(meta.samples())).await?;
    c.release("bench", marked.samples()).await?;
    Ok(elapsed)
}

/// An insert of `count` samples into `partition` that will write `fields`.
pub(crate) fn insert_request(partition: &str, fields: &[&str], count: usize) -> GetMetaRequest {
    GetMetaRequest {
        partition: partition.into(),
        fields: fields.iter().map(|f| f.to_string()).collect(),
        mode: GetMetaMode::Insert { count },
        sampler: None,
        dp_rank: None,
        batch_index: None,
        sampler_args: None,
    }
}

/// The production notice of `meta`'s samples for `schemas`.
pub(crate) fn produced(
    partition: &str,
    meta: &tq_core::BatchMeta,
    schemas: BTreeMap<String, FieldMeta>,
) -> ProductionNotice {
    ProductionNotice {
        partition: partition.into(),
        samples: meta.samples().to_vec(),
        schemas,
        tags: None,
        backend_meta: None,
    }
}

/// `kv_retrieve_meta` of `keys` existing keys (each with `fields` produced fields).
pub fn kv_retrieve_meta(
    runtime: &tokio::runtime::Runtime,
    keys: usize,
    fields: usize,
    reps: usize,
) -> Result<Stats> {
    let c = Controller::new(ControllerConfig::default())?;
    let names = crate::workloads::keys(keys);
    runtime.block_on(async {
        let kv = c.kv_retrieve_meta("bench", &names, true).await?;
        c.notify_production(ProductionNotice {
            partition: "bench".into(),
            samples: kv.meta.samples().to_vec(),
            schemas: (0..fields)
                .map(|f| (format!("field_{f}"), FieldMeta::dense(DType::F32, vec![16])))
                .collect(),
            tags: None,
            backend_meta: None,
        })
        .await
    })?;
    let mut err = None;
    let stats = measure(WARMUP_ROUNDS, reps, || {
        match runtime.block_on(c.kv_retrieve_meta("bench", &names, false)) {
            Ok(kv) => assert_eq!(kv.meta.len(), keys),
            Err(e) => err = Some(e),
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(stats),
    }
}

/// A controller holding the metadata of `samples` keyed samples (`fields` dense fields, one
/// tag each, half of them consumed by a task): what a checkpoint or a recovery must carry.
pub fn populated(
    runtime: &tokio::runtime::Runtime,
    samples: usize,
    fields: usize,
) -> Result<Controller> {
    let c = Controller::new(ControllerConfig::default())?;
    let schemas = f32_fields(fields);
    runtime.block_on(async {
        let mut done = 0;
        while done < samples {
            let n = (samples - done).min(4096);
            let names: Vec<String> = (done..done + n).map(|i| format!("key_{i}")).collect();
            let kv = c.kv_retrieve_meta("bench", &names, true).await?;
            c.notify_production(ProductionNotice {
                partition: "bench".into(),
                samples: kv.meta.samples().to_vec(),
                schemas: schemas.clone(),
                tags: Some(
                    (done..done + n)
                        .map(|i| {
                            tq_core::Tags::from([(
                                "len".to_string(),
                                tq_core::TagValue::Int(i as i64),
                            )])
                        })
                        .collect(),
                ),
                backend_meta: None,
            })
            .await?;
            done += n;
        }
        let half = c
            .get_meta(GetMetaRequest::fetch(
                "bench",
                &["field_0"],
                "train",
                samples / 2,
                Wait::NoWait,
            ))
            .await?;
        assert_eq!(half.len(), samples / 2);
        Ok::<_, tq_core::Error>(())
    })?;
    Ok(c)
}

/// [`allocate_notify_fetch`] through a controller server on loopback TCP (a remote client's
/// view), with the state kept in `state_dir` (`tq controller --state-dir`) or in memory only.
pub fn remote_allocate_notify_fetch(
    runtime: &tokio::runtime::Runtime,
    samples: usize,
    fields: usize,
    reps: usize,
    state_dir: Option<&std::path::Path>,
) -> Result<Stats> {
    use std::sync::Arc;
    let controller = Arc::new(Controller::new(ControllerConfig::default())?);
    let mut service = tq_controller::ControllerServer::new(controller, 1);
    if let Some(dir) = state_dir {
        service = service.with_state_dir(dir)?;
    }
    let schemas = f32_fields(fields);
    runtime.block_on(async {
        let server = tq_net::Server::bind(
            &tq_net::Endpoint::tcp("127.0.0.1:0"),
            tq_net::ServerConfig::default(),
            Arc::new(service),
        )
        .await?;
        let remote = tq_controller::RemoteControlPlane::new(
            tq_net::Pool::new(tq_net::ClientConfig::default()),
            server.local_endpoint().clone(),
            Duration::from_secs(30),
        );
        remote.topology().await?;
        let mut times = Vec::new();
        for i in 0..WARMUP_ROUNDS + reps {
            let elapsed = one_round(&remote, samples, &schemas).await?;
            if i >= WARMUP_ROUNDS {
                times.push(elapsed);
            }
        }
        server.shutdown().await;
        Ok(Stats::from_samples(times))
    })
}

/// The controller's part of a KV clear, step by step, on `plane` (a remote controller for the
/// cost a client sees): `[empty round trip, kv_mark_clearing, release]` of `keys` keys with
/// `fields` dense fields, medians of `reps` rounds after a warm-up. The empty round trip
/// (`list_partitions`) is the request path with nothing to do; what `kv_mark_clearing` and
/// `release` take beyond it is their work on the keys. Each round writes the keys' metadata
/// again, untimed.
pub async fn kv_clear_steps(
    plane: &dyn ControlPlane,
    keys: usize,
    fields: usize,
    reps: usize,
) -> Result<[Stats; 3]> {
    const PARTITION: &str = "bench-clear-steps";
    let names = crate::workloads::keys(keys);
    let schemas = f32_fields(fields);
    let (mut empty, mut mark, mut release) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..WARMUP_ROUNDS + reps.max(1) {
        let kv = plane.kv_retrieve_meta(PARTITION, &names, true).await?;
        plane
            .notify_production(ProductionNotice {
                partition: PARTITION.into(),
                samples: kv.meta.samples().to_vec(),
                schemas: schemas.clone(),
                tags: None,
                backend_meta: None,
            })
            .await?;
        let t = Instant::now();
        plane.list_partitions().await?;
        let e = t.elapsed();
        let t = Instant::now();
        let marked = plane.kv_mark_clearing(PARTITION, &names).await?;
        let m = t.elapsed();
        assert_eq!(marked.len(), keys, "every key was marked");
        let t = Instant::now();
        plane.release(PARTITION, marked.samples()).await?;
        let r = t.elapsed();
        if i >= WARMUP_ROUNDS {
            empty.push(e);
            mark.push(m);
            release.push(r);
        }
    }
    plane.drop_partition(PARTITION).await?;
    Ok([
        Stats::from_samples(empty),
        Stats::from_samples(mark),
        Stats::from_samples(release),
    ])
}
