//! What recording metrics costs: `cargo run --release -p tq-bench --bin metrics-overhead --
//! [--rounds N] [--block N]`.
//!
//! Runs the embedded simple-small workload (kv_batch_put, kv_batch_get, kv_clear of 1024
//! samples) and the controller benchmark (allocate → notify → fetch of 1024 samples × 28
//! fields) with metrics recorded into a Prometheus recorder ("on") and with no recorder
//! installed ("off": what a user who installs no exporter gets), in alternating blocks of the
//! same run (which variant goes first alternates too), and prints the median of each and the
//! on/off ratio. The controller is also run bare (no metering wrapper at all) as the baseline
//! of "off".

use std::sync::Arc;
use std::time::{Duration, Instant};
use tq_bench::workloads;
use tq_client::{Client, Config};
use tq_controller::{Controller, ControllerConfig, MeteredPlane};

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds = arg(&args, "--rounds", 20);
    let block = arg(&args, "--block", 20);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("duration_seconds".into()),
            &tq_core::telemetry::DURATION_BUCKETS,
        )
        .expect("buckets")
        .build_recorder();
    let handle = recorder.handle();
    // Components take their metric handles when built: built under the local recorder, a
    // client records into it for good; built outside, its handles are no-ops.
    let on = metrics::with_local_recorder(&recorder, || Client::embedded(Config::default()))
        .expect("client");
    let off = Client::embedded(Config::default()).expect("client");
    let plane_on = metrics::with_local_recorder(&recorder, || {
        MeteredPlane::new(Arc::new(
            Controller::new(ControllerConfig::default()).expect("controller"),
        ))
    });
    let plane_off = MeteredPlane::new(Arc::new(
        Controller::new(ControllerConfig::default()).expect("controller"),
    ));
    let bare = Controller::new(ControllerConfig::default()).expect("controller");

    let batch = workloads::by_name("simple-small", 1024).expect("workload");
    let keys = workloads::keys(batch.len());
    let mut put = [Vec::new(), Vec::new()];
    let mut get = [Vec::new(), Vec::new()];
    let mut clear = [Vec::new(), Vec::new()];
    let mut control = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..=rounds {
        // Which variant goes first alternates, so neither always runs on the other's warm-up.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let client = [&off, &on][i];
            let p = client.partition("bench");
            for _ in 0..block {
                let t = Instant::now();
                rt.block_on(p.kv_batch_put(&keys, &batch, None))
                    .expect("put");
                let t1 = Instant::now();
                rt.block_on(p.kv_batch_get(&keys, None)).expect("get");
                let t2 = Instant::now();
                rt.block_on(p.kv_clear(&keys)).expect("clear");
                let t3 = Instant::now();
                if round > 0 {
                    put[i].push(t1 - t);
                    get[i].push(t2 - t1);
                    clear[i].push(t3 - t2);
                }
            }
        }
        let planes: [&dyn tq_controller::ControlPlane; 3] = [&plane_off, &plane_on, &bare];
        let order = if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        for i in order {
            let plane = planes[i];
            for _ in 0..block {
                let t = tq_bench::controller::round(&rt, plane, 1024, 28).expect("controller");
                if round > 0 {
                    control[i].push(t);
                }
            }
        }
    }
    let recorded = handle.render();
    assert!(
        recorded.contains("tq_storage_request_total") && recorded.contains("NOTIFY_DATA_UPDATE"),
        "the 'on' variants recorded nothing"
    );
    println!("metrics overhead: {rounds} rounds of alternating blocks of {block} iterations");
    println!("| workload | op | off ms | on ms | on / off |");
    println!("|---|---|---|---|---|");
    let row = |workload: &str, op: &str, v: &[Vec<Duration>; 2]| {
        let (off, on) = (median(v[0].clone()), median(v[1].clone()));
        println!(
            "| {workload} | {op} | {:.3} | {:.3} | {:.3} |",
            off.as_secs_f64() * 1e3,
            on.as_secs_f64() * 1e3,
            on.as_secs_f64() / off.as_secs_f64()
        );
    };
    row("simple-small", "put", &put);
    row("simple-small", "get", &get);
    row("simple-small", "clear", &clear);
    let [c_off, c_on, c_bare] = control;
    row(
        "controller",
        "allocate+notify+fetch 1024×28",
        &[c_off.clone(), c_on],
    );
    row(
        "controller",
        "same, bare vs off (wrapper cost)",
        &[c_bare, c_off],
    );
}
