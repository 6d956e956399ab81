//! Seeing inside a running deployment: a real `tq serve` scraped over HTTP after a known
//! workload, `tq stats` / `tq health`, and one operation's request id in the logs of a separate
//! controller process and storage-unit process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Tq;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use tq::telemetry::MetricsSnapshot;
use tq_client::{Client, Config};
use tq_core::{Batch, Column, Tensor};

fn config() -> Config {
    let mut c = Config::default();
    c.net.request_timeout_ms = 10_000;
    c
}

/// `n` rows of 8 i64 (64 payload bytes per sample).
fn rows(n: usize) -> Batch {
    let v: Vec<i64> = (0..n as i64 * 8).collect();
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![n, 8], &v).unwrap()),
    )])
    .unwrap()
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// One HTTP GET; returns the status code and the body.
fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, body.to_string())
}

fn scrape(addr: &str) -> MetricsSnapshot {
    let (code, body) = http_get(addr, "/metrics");
    assert_eq!(code, 200, "{body}");
    MetricsSnapshot::parse(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_after_a_known_workload_shows_its_counts_and_the_state() {
    let mut tq = Tq::spawn(&[
        "serve",
        "--listen",
        "tcp://127.0.0.1:0",
        "--units",
        "2",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let lines = tq.listening(4);
    let url = Tq::controller_endpoint(&lines);
    let metrics = lines.iter().find(|l| l.role == "metrics").unwrap();
    let metrics = metrics.endpoint.trim_start_matches("http://").to_string();
    let (code, body) = http_get(&metrics, "/healthz");
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    assert_eq!(http_get(&metrics, "/nothing").0, 404);

    let client = Client::connect_with(&url, config()).await.unwrap();
    let (p, q, r) = (
        client.partition("p"),
        client.partition("q"),
        client.partition("r"),
    );
    p.kv_batch_put(&keys("a", 8), &rows(8), None).await.unwrap();
    let back = p.kv_batch_get(&keys("a", 8), None).await.unwrap();
    assert_eq!(back.len(), 8);
    p.kv_clear(&keys("a", 4)).await.unwrap();
    q.kv_batch_put(&keys("b", 4), &rows(4), None).await.unwrap();
    assert_eq!(q.fetch(&["x"], "actor", 2).await.unwrap().len(), 2);
    let refused = q.fetch(&["x"], "actor", 0).await;
    assert!(refused.is_err(), "a fetch of 0 samples is refused");
    // A task that reads the complete partition to its end: the fetch after the last sample
    // ends the stream (`Closed`), which is no request error.
    q.complete().await.unwrap();
    assert_eq!(q.fetch(&["x"], "finisher", 4).await.unwrap().len(), 4);
    let end = q.fetch(&["x"], "finisher", 4).await.unwrap_err();
    assert_eq!(end.kind(), &tq_core::ErrorKind::Closed, "{end}");
    r.kv_batch_put(&keys("c", 2), &rows(2), None).await.unwrap();

    let m = scrape(&metrics);
    let r_labels = [("partition_id", "r")];
    assert_eq!(m.value("tq_partition_samples_total", &r_labels), Some(2.0));
    r.kv_clear(&keys("c", 2)).await.unwrap();
    // The clear's release goes behind its answer (decision 0044); the scrape is no request of
    // this client, so it waits for it explicitly.
    client.settle().await;
    let m = scrape(&metrics);

    // Request counters equal the operations done.
    let op = |name: &'static str| [("op_type", name)];
    let c = |metric: &str, name: &'static str| m.sum(metric, &op(name));
    assert_eq!(
        c("tq_controller_request_samples_total", "NOTIFY_DATA_UPDATE"),
        14.0
    );
    assert_eq!(c("tq_controller_request_samples_total", "CLEAR_META"), 6.0);
    assert_eq!(c("tq_controller_request_errors_total", "GET_META"), 1.0);
    assert_eq!(
        c("tq_controller_request_errors_total", "NOTIFY_DATA_UPDATE"),
        0.0
    );
    assert_eq!(c("tq_controller_request_total", "GET_META"), 4.0);
    let notifies = c("tq_controller_request_total", "NOTIFY_DATA_UPDATE");
    assert_eq!(notifies, 3.0, "one production notice per put");
    let timed = c(
        "tq_controller_request_duration_seconds_count",
        "NOTIFY_DATA_UPDATE",
    );
    assert_eq!(timed, notifies);
    let buckets = m.label_sets("tq_controller_request_duration_seconds_bucket");
    for le in ["0.001", "0.005", "0.25", "5", "+Inf"] {
        assert!(
            buckets
                .iter()
                .any(|l| l.get("le").map(String::as_str) == Some(le)),
            "bucket {le}: {buckets:?}"
        );
    }
    assert_eq!(c("tq_storage_request_samples_total", "PUT_DATA"), 14.0);
    assert_eq!(c("tq_storage_request_samples_total", "GET_DATA"), 8.0);
    assert_eq!(c("tq_storage_request_samples_total", "CLEAR_DATA"), 6.0);
    assert_eq!(c("tq_storage_request_errors_total", "PUT_DATA"), 0.0);

    // Gauges equal the state.
    assert_eq!(m.value("tq_partitions_total", &[]), Some(2.0));
    let pl = ("partition_id", "p");
    let ql = ("partition_id", "q");
    assert_eq!(m.value("tq_partition_samples_total", &[pl]), Some(4.0));
    assert_eq!(m.value("tq_partition_samples_total", &[ql]), Some(4.0));
    for task in ["all", "actor"] {
        let l = [ql, ("task_name", task)];
        assert_eq!(m.value("tq_partition_production_progress", &l), Some(1.0));
    }
    let actor = [ql, ("task_name", "actor")];
    assert_eq!(
        m.value("tq_partition_consumption_progress", &actor),
        Some(0.5)
    );
    assert_eq!(m.sum("tq_storage_active_keys_total", &[]), 8.0);
    assert_eq!(m.sum("tq_storage_bytes", &[]), 8.0 * 64.0);
    assert_eq!(
        m.label_sets("tq_storage_bytes").len(),
        2,
        "one series per unit"
    );
    assert!(!m.has("tq_storage_capacity_total"), "units are unlimited");
    assert_eq!(m.value("tq_global_index_allocated_total", &[]), Some(8.0));
    // q's four samples reused indexes p's clear released; r's two are free again.
    assert_eq!(m.value("tq_global_index_reusable_total", &[]), Some(2.0));
    assert!(m.value("tq_controller_uptime_seconds", &[]).unwrap() > 0.0);
    assert!(m.value("tq_controller_memory_rss_bytes", &[]).unwrap() > 1e6);
    assert!(m.value("tq_controller_connections", &[]).unwrap() >= 1.0);

    // The dropped partition's label sets are gone.
    for family in [
        "tq_partition_samples_total",
        "tq_partition_production_progress",
    ] {
        assert!(
            m.label_sets(family)
                .iter()
                .all(|l| l.get("partition_id").map(String::as_str) != Some("r")),
            "{family} still has partition r"
        );
    }

    // `tq stats --json` and `tq health` see the same deployment.
    let stats = std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(["stats", &url, "--json"])
        .output()
        .unwrap();
    assert!(stats.status.success(), "{stats:?}");
    let status: tq_client::DeploymentStatus = serde_json::from_slice(&stats.stdout).unwrap();
    let names: Vec<&str> = status
        .controller
        .partitions
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(names, ["p", "q"]);
    assert_eq!(status.units.iter().map(|u| u.rows).sum::<u64>(), 8);
    let table = std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(["stats", &url])
        .output()
        .unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.contains("actor") && table.contains("unit-1") && table.contains("FREEING"),
        "{table}"
    );
    // Served units report what their clears freed, and what is still being freed.
    assert!(
        status
            .units
            .iter()
            .all(|u| u.counters.contains_key("memory_free_pending_bytes")),
        "{:?}",
        status.units
    );
    let health = std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(["health", &url])
        .output()
        .unwrap();
    assert!(health.status.success(), "{health:?}");
    tq.kill();
    let down = std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(["health", &url])
        .env("TQ_NET_CONNECT_TIMEOUT_MS", "2000")
        .output()
        .unwrap();
    assert!(
        !down.status.success(),
        "health of a dead controller must fail"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_operations_request_id_is_in_the_controller_and_unit_logs() {
    let dir = tempfile::tempdir().unwrap();
    let (controller_log, unit_log) = (dir.path().join("controller"), dir.path().join("unit"));
    let env = [("RUST_LOG", "info,tq_controller=debug,tq_unit=debug")];
    let mut controller = Tq::spawn_logged(
        &[
            "controller",
            "--listen",
            "tcp://127.0.0.1:0",
            "--units",
            "1",
        ],
        &env,
        &controller_log,
    );
    let url = Tq::controller_endpoint(&controller.listening(1));
    let mut unit = Tq::spawn_logged(
        &[
            "storage-unit",
            "--controller",
            &url,
            "--id",
            "unit-0",
            "--log-format",
            "json",
        ],
        &env,
        &unit_log,
    );
    unit.listening(1);
    let client = Client::connect_with(&url, config()).await.unwrap();
    let p = client.partition("p");
    let id = 0x5eed_1234;
    tq_core::telemetry::with_trace_id(id, p.kv_batch_put(&keys("k", 3), &rows(3), None))
        .await
        .unwrap();
    p.kv_batch_get(&keys("k", 3), None).await.unwrap();
    // Without an id of the caller's, one operation still sends all its requests under one.
    p.kv_batch_put(&keys("m", 2), &rows(2), None).await.unwrap();
    drop(client);
    assert!(controller.terminate(Duration::from_secs(30)).is_some());
    assert!(unit.terminate(Duration::from_secs(30)).is_some());

    let text = |path: &std::path::Path| std::fs::read_to_string(path).unwrap();
    let controller_text = text(&controller_log);
    let traced: Vec<&str> = controller_text
        .lines()
        .filter(|l| l.contains("5eed1234"))
        .collect();
    for op in ["KV_PREPARE_PUT", "NOTIFY_DATA_UPDATE"] {
        assert!(
            traced.iter().any(|l| l.contains(op)),
            "controller log has no {op} line under the request id:\n{controller_text}"
        );
    }
    // The read afterwards ran under other ids.
    assert!(!traced.iter().any(|l| l.contains("KV_RETRIEVE_META")));
    let last_trace = |op: &str| -> String {
        let line = controller_text
            .lines()
            .rev()
            .find(|l| l.contains(op))
            .unwrap_or_else(|| panic!("no {op} line:\n{controller_text}"));
        let at = line.find("trace=").expect("a request span") + "trace=".len();
        line[at..at + 8].to_string()
    };
    let second = last_trace("KV_PREPARE_PUT");
    assert_ne!(second, "5eed1234");
    assert_eq!(last_trace("NOTIFY_DATA_UPDATE"), second);

    // The unit logs JSON: every log line is an object (the plain `shutting down` notice is not
    // a log line), and the put's line carries the id in its request span.
    let unit_text = text(&unit_log);
    let mut found = false;
    let mut last_put = None;
    for line in unit_text.lines().filter(|l| *l != "shutting down") {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        let op = v["fields"]["op"].as_str();
        let trace = v["span"]["trace"].as_str();
        if op == Some("PUT_DATA") && trace == Some("5eed1234") {
            found = true;
        }
        if op == Some("PUT_DATA") {
            last_put = trace.map(str::to_string);
        }
    }
    assert_eq!(
        last_put,
        Some(second),
        "the second put's unit request has its id"
    );
    assert!(
        found,
        "unit log has no PUT_DATA line under the id:\n{unit_text}"
    );
}

/// Every metric the Grafana dashboard queries is one docs/operations.md documents: the
/// dashboard and the docs cannot drift apart silently.
#[test]
fn the_dashboard_queries_only_documented_metrics() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dashboard = std::fs::read_to_string(root.join("docs/grafana-dashboard.json")).unwrap();
    let docs = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let names = |text: &str| -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        let bytes = text.as_bytes();
        let mut i = 0;
        while let Some(at) = text[i..].find("tq_") {
            let start = i + at;
            let mut end = start;
            while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
                end += 1;
            }
            let name = &text[start..end];
            let name = name.strip_suffix("_bucket").unwrap_or(name);
            if start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_')
            {
                out.insert(name.to_string());
            }
            i = end;
        }
        out
    };
    let documented = names(&docs);
    let queried = names(&dashboard);
    assert!(queried.len() > 15, "{queried:?}");
    for name in &queried {
        let role_form = name
            .replace("tq_controller_request", "tq_<role>_request")
            .replace("tq_storage_request", "tq_<role>_request");
        assert!(
            documented.contains(name) || docs.contains(&role_form),
            "the dashboard queries {name}, which docs/operations.md does not document"
        );
    }
}

/// With one storage unit dead: `tq stats` shows the rest and marks it, `tq health` and the
/// controller's `/healthz` fail naming it; `tq stats --json` prints the epoch as the hex
/// string the table shows; `tq stats --watch` into a pipe that closes ends cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_unit_is_shown_and_fails_health() {
    let mut controller = Tq::spawn(&[
        "controller",
        "--listen",
        "tcp://127.0.0.1:0",
        "--units",
        "2",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let lines = controller.listening(2);
    let url = Tq::controller_endpoint(&lines);
    let metrics = lines.iter().find(|l| l.role == "metrics").unwrap();
    let metrics = metrics.endpoint.trim_start_matches("http://").to_string();
    let mut u0 = Tq::spawn(&["storage-unit", "--controller", &url, "--id", "unit-0"]);
    u0.listening(1);
    let mut u1 = Tq::spawn(&["storage-unit", "--controller", &url, "--id", "unit-1"]);
    u1.listening(1);
    let client = Client::connect_with(&url, config()).await.unwrap();
    client
        .partition("p")
        .kv_batch_put(&keys("a", 4), &rows(4), None)
        .await
        .unwrap();
    assert_eq!(http_get(&metrics, "/healthz").0, 200);
    let tq = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
            .args(args)
            .env("TQ_NET_CONNECT_TIMEOUT_MS", "2000")
            .output()
            .unwrap()
    };

    let json = tq(&["stats", &url, "--json"]);
    assert!(json.status.success(), "{json:?}");
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let epoch = value["controller"]["epoch"].as_str().expect("a string");
    assert_eq!(epoch.len(), 16, "{epoch}");
    let parsed: tq_client::DeploymentStatus = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(format!("{:016x}", parsed.controller.epoch), epoch);

    u1.kill();
    let table = tq(&["stats", &url]);
    assert!(table.status.success(), "{table:?}");
    let text = String::from_utf8(table.stdout).unwrap();
    let unit_lines: Vec<&str> = text.lines().filter(|l| l.starts_with("unit-")).collect();
    assert_eq!(unit_lines.len(), 2, "{text}");
    assert!(!unit_lines[0].contains("DOWN"), "{text}");
    assert!(unit_lines[1].contains("DOWN"), "{text}");
    let health = tq(&["health", &url]);
    assert!(!health.status.success(), "{health:?}");
    let why = String::from_utf8_lossy(&health.stderr);
    assert!(why.contains("unit-1") && why.contains("down"), "{why}");
    // The controller notices once the unit's registration lapses.
    let started = std::time::Instant::now();
    loop {
        let (code, body) = http_get(&metrics, "/healthz");
        if code == 503 {
            assert!(body.contains("unit-1"), "{body}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still {code} {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // A reader that stops after the first line: the watcher ends without a panic.
    let mut watch = std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(["stats", &url, "--watch", "0.05"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = watch.stdout.take().unwrap();
    let mut first = [0u8; 64];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let out = watch.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    u0.kill();
    let _ = controller.terminate(Duration::from_secs(5));
}
