//! Multi-process end-to-end tests: the real `tq` servers on free loopback ports, clients over TCP.

mod common;

use common::{serve, Tq};
use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tq_client::{Client, Config, GetMetaRequest, Wait};
use tq_core::{Batch, Column, ErrorKind, StorageManager, Tensor};

fn config(timeout_ms: u64) -> Config {
    let mut c = Config::default();
    c.net.request_timeout_ms = timeout_ms;
    c.net.connect_timeout_ms = 5_000;
    c
}

fn rows(n: usize, base: i64) -> Batch {
    let v: Vec<i64> = (0..n * 8).map(|i| base + i as i64).collect();
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![n, 8], &v).unwrap()),
    )])
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_kit_passes_against_a_remote_deployment() {
    let servers: Arc<Mutex<Vec<Tq>>> = Arc::default();
    tq_core::testkit::run_all(|| {
        let servers = servers.clone();
        async move {
            let (tq, url) = serve(2, &[]);
            servers.lock().unwrap().push(tq);
            let client = Client::connect_with(&url, config(10_000))
                .await
                .expect("connect");
            client.storage().clone() as std::sync::Arc<dyn StorageManager>
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_client_has_the_embedded_behaviour() {
    let (_tq, url) = serve(2, &[]);
    let tq = Client::connect_with(&url, config(10_000)).await.unwrap();
    tq.partition("p")
        .kv_batch_put(&["a", "b", "c"], &rows(3, 0), None)
        .await
        .unwrap();
    assert_eq!(
        tq.partition("p")
            .kv_batch_get(&["a", "b", "c"], None)
            .await
            .unwrap(),
        rows(3, 0)
    );
    let e = tq
        .partition("p")
        .kv_batch_put(&["a", "a"], &rows(2, 0), None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Invalid);
    let e = tq
        .partition("p")
        .kv_batch_get(&["zz"], None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::NotFound, "{e}");
    let m = tq.partition("p").fetch(&["x"], "t", 3).await.unwrap();
    assert_eq!(m.len(), 3);
    assert!(tq
        .partition("p")
        .consumption_status("t")
        .await
        .unwrap()
        .all_consumed());
    // A waiting fetch times out with the controller's Timeout error, not a transport error.
    let e = tq
        .get_meta(GetMetaRequest::fetch(
            "p",
            &["x"],
            "t",
            1,
            Wait::For(Duration::from_millis(200)),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Timeout, "{e}");
    tq.partition("p").kv_clear(&["a", "b", "c"]).await.unwrap();
    assert!(tq.list_partitions().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_across_processes_lose_and_duplicate_nothing() {
    let mut controller = Tq::spawn(&[
        "controller",
        "--listen",
        "tcp://127.0.0.1:0",
        "--units",
        "2",
    ]);
    let url = Tq::controller_endpoint(&controller.listening(1));
    let mut units: Vec<Tq> = ["unit-a", "unit-b"]
        .iter()
        .map(|id| Tq::spawn(&["storage-unit", "--controller", &url, "--id", id]))
        .collect();
    for u in &mut units {
        u.listening(1);
    }
    let producers = 3;
    let per_producer = 40;
    let mut tasks = Vec::new();
    for p in 0..producers {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let tq = Client::connect_with(&url, config(10_000)).await.unwrap();
            for i in 0..per_producer {
                let id = (p * per_producer + i) as i64;
                tq.partition("stream")
                    .put_new(&rows(1, id * 8))
                    .await
                    .unwrap();
            }
        }));
    }
    let seen: Arc<Mutex<Vec<i64>>> = Arc::default();
    let mut consumers = Vec::new();
    for _ in 0..3 {
        let (url, seen) = (url.clone(), seen.clone());
        consumers.push(tokio::spawn(async move {
            let tq = Client::connect_with(&url, config(10_000)).await.unwrap();
            loop {
                let req = GetMetaRequest::fetch(
                    "stream",
                    &["x"],
                    "c",
                    5,
                    Wait::For(Duration::from_millis(1500)),
                );
                let m = match tq.get_meta(req).await {
                    Ok(m) => m,
                    Err(e) if e.kind() == &ErrorKind::Timeout => break,
                    Err(e) => panic!("{e}"),
                };
                let d = tq.get_data(&m).await.unwrap();
                let Column::Dense(t) = d.column("x").unwrap() else {
                    panic!("dense")
                };
                let v = t.to_vec::<i64>().unwrap();
                // Each row is 8 consecutive numbers starting at id * 8.
                for r in v.chunks(8) {
                    assert!(r.windows(2).all(|w| w[1] == w[0] + 1), "row intact");
                    seen.lock().unwrap().push(r[0] / 8);
                }
                tq.clear_samples(&m).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for c in consumers {
        c.await.unwrap();
    }
    // Drain what is left (fewer than a batch).
    let tq = Client::connect_with(&url, config(10_000)).await.unwrap();
    loop {
        let m = tq
            .get_meta(GetMetaRequest::fetch(
                "stream",
                &["x"],
                "c",
                1,
                Wait::NoWait,
            ))
            .await
            .unwrap();
        if m.is_empty() {
            break;
        }
        let d = tq.get_data(&m).await.unwrap();
        let Column::Dense(t) = d.column("x").unwrap() else {
            panic!("dense")
        };
        seen.lock().unwrap().push(t.to_vec::<i64>().unwrap()[0] / 8);
        tq.clear_samples(&m).await.unwrap();
    }
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..(producers * per_producer) as i64).collect::<Vec<_>>()
    );
    let _ = controller.terminate(Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_unit_fails_fast_and_recovers_after_restart() {
    let mut controller = Tq::spawn(&[
        "controller",
        "--listen",
        "tcp://127.0.0.1:0",
        "--units",
        "2",
    ]);
    let url = Tq::controller_endpoint(&controller.listening(1));
    let mut u0 = Tq::spawn(&["storage-unit", "--controller", &url, "--id", "unit-0"]);
    u0.listening(1);
    let mut u1 = Tq::spawn(&["storage-unit", "--controller", &url, "--id", "unit-1"]);
    let u1_endpoint = u1.listening(1)[0].endpoint.clone();
    let tq = Client::connect_with(&url, config(3_000)).await.unwrap();
    // 24 keys: a run of 16 on unit-0, 8 on unit-1.
    let keys: Vec<String> = (0..24).map(|i| format!("k{i}")).collect();
    tq.partition("p")
        .kv_batch_put(&keys, &rows(24, 0), None)
        .await
        .unwrap();
    // Which keys live on which unit: the routing's.
    let meta = tq.partition("p").kv_meta(&keys).await.unwrap();
    let on_unit0: Vec<String> = keys
        .iter()
        .zip(meta.samples())
        .filter(|(_, s)| tq_core::routing::unit_of(s.index, 2) == 0)
        .map(|(k, _)| k.clone())
        .collect();
    assert!(!on_unit0.is_empty() && on_unit0.len() < keys.len());

    u1.kill();
    let started = Instant::now();
    let e = tq
        .partition("p")
        .kv_batch_get(&keys, None)
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "failed within the deadline"
    );
    assert!(
        matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "{e}"
    );
    assert!(e.message().contains("unit-1"), "error names the unit: {e}");
    // The other unit and the controller keep serving.
    assert_eq!(
        tq.partition("p")
            .kv_batch_get(&on_unit0, None)
            .await
            .unwrap()
            .len(),
        on_unit0.len()
    );
    assert_eq!(tq.partition("p").kv_list().await.unwrap().entries.len(), 24);

    // Restart unit-1 on the same address: the same client recovers without a restart.
    let mut u1 = Tq::spawn(&[
        "storage-unit",
        "--controller",
        &url,
        "--id",
        "unit-1",
        "--listen",
        &u1_endpoint,
    ]);
    u1.listening(1);
    let fresh: Vec<String> = (0..4).map(|i| format!("n{i}")).collect();
    tq.partition("p")
        .kv_batch_put(&fresh, &rows(4, 100), None)
        .await
        .unwrap();
    assert_eq!(
        tq.partition("p").kv_batch_get(&fresh, None).await.unwrap(),
        rows(4, 100)
    );
    // What the dead unit held is gone, and that is an error, not empty data: `DataLost`
    // naming the replacement, since this client wrote to the unit's earlier process.
    let lost: Vec<&String> = keys.iter().filter(|k| !on_unit0.contains(k)).collect();
    let e = tq
        .partition("p")
        .kv_batch_get(&lost, None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::DataLost, "{e}");
    assert!(e.message().contains("was replaced"), "{e}");
    // A client that connected after the restart never wrote to the earlier process.
    let late = Client::connect_with(&url, config(3_000)).await.unwrap();
    let e = late
        .partition("p")
        .kv_batch_get(&lost, None)
        .await
        .unwrap_err();
    assert!(!e.message().contains("was replaced"), "{e}");
    let _ = controller.terminate(Duration::from_secs(5));
}

fn hello(token: &str) -> Vec<u8> {
    let mut v = b"TQNET".to_vec();
    v.push(1);
    v.extend_from_slice(&(token.len() as u16).to_le_bytes());
    v.extend_from_slice(token.as_bytes());
    v
}

fn host_port(url: &str) -> String {
    url.trim_start_matches("tcp://").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_every_port_leaves_the_servers_serving() {
    let mut tq_proc = Tq::spawn(&["serve", "--listen", "tcp://127.0.0.1:0", "--units", "2"]);
    let lines = tq_proc.listening(3);
    let url = Tq::controller_endpoint(&lines);
    let mut idle = Vec::new();
    for l in &lines {
        let addr = host_port(&l.endpoint);
        // Plain garbage.
        let mut s = TcpStream::connect(&addr).unwrap();
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        // A good handshake, then a prefix claiming a 1 TiB body and 2^31 frames.
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(&hello("")).unwrap();
        let mut prefix = Vec::new();
        prefix.extend_from_slice(&7u64.to_le_bytes());
        prefix.push(0);
        prefix.extend_from_slice(&[0, 0, 0]);
        prefix.extend_from_slice(&16u32.to_le_bytes());
        prefix.extend_from_slice(&(1u32 << 31).to_le_bytes());
        prefix.extend_from_slice(&0u32.to_le_bytes());
        let _ = s.write_all(&prefix);
        let _ = s.write_all(&(1u64 << 40).to_le_bytes());
        // A truncated message: the prefix promises a header that never fully arrives.
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(&hello("")).unwrap();
        let mut p = Vec::new();
        p.extend_from_slice(&8u64.to_le_bytes());
        p.extend_from_slice(&[0, 0, 0, 0]);
        p.extend_from_slice(&100u32.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(b"only part of the header");
        let _ = s.write_all(&p);
        drop(s);
        // A valid frame whose header is not a request this server knows.
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(&hello("")).unwrap();
        let mut p = Vec::new();
        p.extend_from_slice(&9u64.to_le_bytes());
        p.extend_from_slice(&[0, 0, 0, 0]);
        p.extend_from_slice(&3u32.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&[0xff, 0xff, 0xff]);
        let _ = s.write_all(&p);
        // A peer that connects and says nothing.
        idle.push(TcpStream::connect(&addr).unwrap());
    }
    // Every server still answers real clients.
    let tq = Client::connect_with(&url, config(5_000)).await.unwrap();
    tq.partition("p")
        .kv_batch_put(&["a", "b", "c", "d"], &rows(4, 0), None)
        .await
        .unwrap();
    assert_eq!(
        tq.partition("p")
            .kv_batch_get(&["a", "b", "c", "d"], None)
            .await
            .unwrap(),
        rows(4, 0)
    );
    assert!(
        tq_proc.child.try_wait().unwrap().is_none(),
        "server still running"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_refuse_peers_without_the_token() {
    let (_tq, url) = serve(1, &["--token", "s3cret"]);
    let e = Client::connect_with(&url, config(3_000)).await.unwrap_err();
    assert!(e.message().contains("unauthorized"), "{e}");
    let mut with = config(3_000);
    with.net.token = Some("s3cret".into());
    let tq = Client::connect_with(&url, with).await.unwrap();
    tq.partition("p")
        .kv_put("a", &rows(1, 0), None)
        .await
        .unwrap();
    // A unit with the wrong token cannot register.
    let mut ctl = Tq::spawn_env(
        &[
            "controller",
            "--listen",
            "tcp://127.0.0.1:0",
            "--units",
            "1",
        ],
        &[("TQ_NET_TOKEN", "right")],
    );
    let curl = Tq::controller_endpoint(&ctl.listening(1));
    let unit = Tq::spawn_env(
        &["storage-unit", "--controller", &curl, "--id", "u"],
        &[("TQ_NET_TOKEN", "wrong")],
    );
    let (status, stderr) = unit.wait_exit(Duration::from_secs(40));
    assert!(!status.success());
    assert!(stderr.contains("unauthorized"), "{stderr}");
}

#[test]
fn non_loopback_needs_a_token_or_insecure() {
    let tq = Tq::spawn(&["controller", "--listen", "tcp://0.0.0.0:0", "--units", "1"]);
    let (status, stderr) = tq.wait_exit(Duration::from_secs(10));
    assert!(!status.success());
    assert!(
        stderr.contains("refusing to listen on non-loopback"),
        "{stderr}"
    );
    let mut tq = Tq::spawn(&[
        "controller",
        "--listen",
        "tcp://0.0.0.0:0",
        "--units",
        "1",
        "--insecure",
    ]);
    assert_eq!(tq.listening(1)[0].role, "controller");
    let mut tq2 = Tq::spawn(&[
        "controller",
        "--listen",
        "tcp://0.0.0.0:0",
        "--units",
        "1",
        "--token",
        "t",
    ]);
    assert_eq!(tq2.listening(1)[0].role, "controller");
    let _ = tq.terminate(Duration::from_secs(5));
}

#[test]
fn sigterm_shuts_servers_down_cleanly() {
    let (mut tq, _) = serve(2, &[]);
    let status = tq
        .terminate(Duration::from_secs(10))
        .expect("exited after SIGTERM");
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_that_never_notified_stays_invisible() {
    let (_tq, url) = serve(2, &[]);
    {
        // A client that writes storage and then disappears before announcing the cells.
        let writer = Client::connect_with(&url, config(5_000)).await.unwrap();
        let meta = writer
            .get_meta(GetMetaRequest {
                partition: "p".into(),
                fields: vec![],
                mode: tq_client::GetMetaMode::Insert { count: 4 },
                sampler: None,
                dp_rank: None,
                batch_index: None,
                sampler_args: None,
            })
            .await
            .unwrap();
        writer.storage().put(&meta, &rows(4, 0)).await.unwrap();
    }
    let reader = Client::connect_with(&url, config(5_000)).await.unwrap();
    let status = reader
        .partition("p")
        .production_status(&["x"])
        .await
        .unwrap();
    assert_eq!(status.samples.len(), 4);
    assert!(
        status.produced.iter().all(|&p| !p),
        "nothing announced, nothing visible"
    );
    let m = reader
        .get_meta(GetMetaRequest::fetch("p", &["x"], "t", 1, Wait::NoWait))
        .await
        .unwrap();
    assert!(m.is_empty());
    // The orphaned samples can be cleared like any other.
    reader.partition("p").clear().await.unwrap();
    assert!(reader.list_partitions().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_host_clients_can_use_a_unix_socket() {
    let dir = std::env::temp_dir().join(format!("tq-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("controller.sock");
    let url = format!("unix://{}", path.display());
    let mut tq_proc = Tq::spawn(&["serve", "--listen", &url, "--units", "1"]);
    let lines = tq_proc.listening(2);
    assert_eq!(Tq::controller_endpoint(&lines), url);
    let tq = Client::connect_with(&url, config(5_000)).await.unwrap();
    tq.partition("p")
        .kv_put("a", &rows(1, 5), None)
        .await
        .unwrap();
    assert_eq!(
        tq.partition("p").kv_batch_get(&["a"], None).await.unwrap(),
        rows(1, 5)
    );
    let _ = tq_proc.terminate(Duration::from_secs(5));
    assert!(!path.exists(), "the socket file is removed on shutdown");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_updates_and_links_work_remotely() {
    use futures::StreamExt;
    use tq_client::{LinkOptions, StreamConfig};
    let (_tq, url) = serve(2, &[]);
    let tq = Client::connect_with(&url, config(10_000)).await.unwrap();
    // kv_update merges on the remote units; closures cannot cross the network.
    tq.partition("p")
        .kv_batch_put(&["a", "b"], &rows(2, 0), None)
        .await
        .unwrap();
    tq.partition("p")
        .kv_batch_update(&["a", "b"], &rows(2, 100), &tq_core::MergeOp::Add)
        .await
        .unwrap();
    let got = tq.partition("p").kv_batch_get(&["a"], None).await.unwrap();
    let Column::Dense(t) = got.column("x").unwrap() else {
        panic!("dense")
    };
    assert_eq!(t.to_vec::<i64>().unwrap()[0], 100);
    let closure: tq_core::MergeFn =
        Arc::new(|_: &tq_core::Value, n: &tq_core::Value| Ok(n.clone()));
    let e = tq
        .partition("p")
        .kv_update("a", &rows(1, 0), &tq_core::MergeOp::Custom(closure))
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Unsupported { .. }), "{e}");
    // kv_link through the remote controller; reads resolve on the remote units.
    tq.partition("__public__")
        .kv_put("v", &rows(1, 500), None)
        .await
        .unwrap();
    tq.partition("d")
        .kv_link(
            &["r0", "r1", "r2"],
            &["v", "v", "v"],
            &["x"],
            &LinkOptions::default(),
        )
        .await
        .unwrap();
    let got = tq
        .partition("d")
        .kv_batch_get(&["r0", "r1", "r2"], None)
        .await
        .unwrap();
    let Column::Dense(t) = got.column("x").unwrap() else {
        panic!("dense")
    };
    assert_eq!(t.to_vec::<i64>().unwrap()[16], 500);
    assert_eq!(
        tq.partition("__public__")
            .kv_clear(&["v"])
            .await
            .unwrap_err()
            .kind(),
        &ErrorKind::Conflict
    );
    // A stream in acknowledged mode across processes ends when the partition is complete.
    for i in 0..3 {
        tq.partition("s").put_new(&rows(4, i * 100)).await.unwrap();
    }
    tq.partition("s").complete().await.unwrap();
    let mut s = tq
        .partition("s")
        .stream(StreamConfig::new("t", &["x"], 4).acknowledged(Duration::from_secs(10)))
        .unwrap();
    let mut n = 0;
    while let Some(item) = s.next().await {
        let item = item.unwrap();
        n += item.meta.len();
        // A consumer that needs longer keeps its batch (renew_lease across processes).
        let extend = Duration::from_secs(30);
        assert_eq!(s.renew(&item, extend).await.unwrap(), item.meta.len());
        assert_eq!(s.ack(&item).await.unwrap(), item.meta.len());
        assert_eq!(
            s.renew(&item, extend).await.unwrap(),
            0,
            "acknowledged: nothing held"
        );
    }
    assert_eq!(n, 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_units_can_offload_to_ssd() {
    let dir = std::env::temp_dir().join(format!("tq-ssd-serve-{}", std::process::id()));
    let path = dir.display().to_string();
    let (mut server, url) = serve(2, &["--ssd-path", &path, "--ssd-threshold", "32"]);
    let tq = Client::connect_with(&url, config(10_000)).await.unwrap();
    tq.partition("p")
        .kv_batch_put(&["a", "b", "c"], &rows(3, 0), None)
        .await
        .unwrap(); // 64 B rows
    assert_eq!(
        tq.partition("p")
            .kv_batch_get(&["a", "b", "c"], None)
            .await
            .unwrap(),
        rows(3, 0)
    );
    let count = |d: &std::path::Path| -> usize {
        fn walk(d: &std::path::Path) -> usize {
            std::fs::read_dir(d)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| {
                            if e.path().is_dir() {
                                walk(&e.path())
                            } else {
                                1
                            }
                        })
                        .sum()
                })
                .unwrap_or(0)
        }
        walk(d)
    };
    assert!(count(&dir) >= 3, "cells went to disk");
    let _ = server.terminate(Duration::from_secs(10));
    assert!(dir.exists(), "the user's directory stays");
    let _ = std::fs::remove_dir_all(&dir);
}

fn first_i64(b: &Batch, field: &str) -> i64 {
    let Column::Dense(t) = b.column(field).expect("field") else {
        panic!("dense")
    };
    t.to_vec::<i64>().unwrap()[0]
}

/// A remote client reads storage in parallel with the key lookup for keys it knows (key cache);
/// whatever another process did to those keys meanwhile, it answers what the controller says now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_cache_speculation_never_answers_stale_metadata() {
    let (_tq, url) = serve(2, &[]);
    let a = Client::connect_with(&url, config(10_000)).await.unwrap();
    let mut plain = config(10_000);
    plain.net.key_cache_entries = 0;
    let b = Client::connect_with(&url, plain).await.unwrap();
    assert_eq!(b.key_cache_stats(), None, "0 turns the cache off");
    let stats = |c: &Client| c.key_cache_stats().expect("cache on by default");

    // Read-your-writes: the put remembered the key, the get's early read is confirmed.
    a.partition("kc")
        .kv_put("k", &rows(1, 0), None)
        .await
        .unwrap();
    assert_eq!(
        a.partition("kc").kv_batch_get(&["k"], None).await.unwrap(),
        rows(1, 0)
    );
    assert_eq!((stats(&a).hits, stats(&a).misses), (1, 0));

    // Another process rewrites the bytes (same metadata): the answer has the new bytes.
    b.partition("kc")
        .kv_put("k", &rows(1, 100), None)
        .await
        .unwrap();
    assert_eq!(
        a.partition("kc").kv_batch_get(&["k"], None).await.unwrap(),
        rows(1, 100)
    );
    assert_eq!(stats(&a).hits, 2);

    // Another process adds a field: the early read (one field) is dropped, both come back.
    let y = Batch::from_columns([(
        "y",
        Column::Dense(Tensor::from_slice(vec![1, 2], &[7i64, 8]).unwrap()),
    )])
    .unwrap();
    b.partition("kc").kv_put("k", &y, None).await.unwrap();
    let got = a.partition("kc").kv_batch_get(&["k"], None).await.unwrap();
    assert_eq!(got.field_names().collect::<Vec<_>>(), vec!["x", "y"]);
    assert_eq!((first_i64(&got, "x"), first_i64(&got, "y")), (100, 7));
    assert_eq!(stats(&a).misses, 1);
    // ... and the fresh metadata is remembered: the next get is confirmed again.
    a.partition("kc")
        .kv_batch_get(&["k"], Some(&["y"]))
        .await
        .unwrap();
    assert_eq!((stats(&a).hits, stats(&a).misses), (3, 1));

    // Another process clears the key, gives its sample index to a new key (next generation)
    // and writes the key again elsewhere: the answer is the key's new value, never the bytes
    // of whichever sample now sits at the cached index.
    b.partition("kc").kv_clear(&["k"]).await.unwrap();
    b.partition("kc")
        .kv_put("other", &rows(1, 900), None)
        .await
        .unwrap();
    let wide = Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![1, 3], &[5i64, 6, 7]).unwrap()),
    )])
    .unwrap();
    b.partition("kc").kv_put("k", &wide, None).await.unwrap();
    assert_eq!(
        a.partition("kc").kv_batch_get(&["k"], None).await.unwrap(),
        wide
    );
    assert_eq!(stats(&a).misses, 2);

    // Cleared by another process: NotFound, not the remembered bytes.
    b.partition("kc").kv_clear(&["k", "other"]).await.unwrap();
    let e = a
        .partition("kc")
        .kv_batch_get(&["k"], None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::NotFound, "{e}");
    assert_eq!(stats(&a).hits, 3, "nothing stale was confirmed");
}

/// Defect 6 of the adversarial-testing issue: a controller killed and restarted on the same
/// address was never rejoined by its storage units, so no client could connect again. And the
/// restarted controller is a new epoch: a client from before is refused, never served the new
/// samples that reuse its indexes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_units_rejoin_a_restarted_controller() {
    let listen = common::free_listen();
    let start_controller = || Tq::spawn(&["controller", "--listen", &listen, "--units", "2"]);
    let mut controller = start_controller();
    let url = Tq::controller_endpoint(&controller.listening(1));
    // Register in the opposite order of their ids; routing follows the ids either way.
    let mut u1 = Tq::spawn(&["storage-unit", "--controller", &url, "--id", "unit-1"]);
    u1.listening(1);
    let mut u0 = Tq::spawn(&["storage-unit", "--controller", &url, "--id", "unit-0"]);
    u0.listening(1);
    let tq = Client::connect_with(&url, config(3_000)).await.unwrap();
    tq.partition("p")
        .kv_put("k", &rows(1, 0), None)
        .await
        .unwrap();
    let old_meta = tq.partition("p").kv_meta(&["k"]).await.unwrap();

    controller.kill();
    let mut controller = start_controller();
    controller.listening(1);
    // A new client waits (up to its connect timeout) until both units registered again.
    let fresh = Client::connect_with(&url, config(3_000)).await.unwrap();
    fresh
        .partition("q")
        .kv_put("k", &rows(1, 5), None)
        .await
        .unwrap();
    assert_eq!(
        fresh
            .partition("q")
            .kv_batch_get(&["k"], None)
            .await
            .unwrap(),
        rows(1, 5)
    );
    // The restarted controller has none of the earlier state: a new epoch. The client from
    // before the restart is refused by the controller and by the units alike — its metadata
    // names index 0, generation 0, which is now the new epoch's `q/k` on the same unit.
    assert_ne!(tq.epoch(), fresh.epoch());
    let refused = |e: tq_core::Error| {
        assert_eq!(e.kind(), &ErrorKind::Conflict, "{e}");
        assert_eq!(e.retry(), tq_core::Retry::Never, "{e}");
        assert!(e.message().contains("restarted without its state"), "{e}");
    };
    refused(
        tq.partition("q")
            .kv_batch_get(&["k"], None)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        old_meta.samples(),
        fresh
            .partition("q")
            .kv_meta(&["k"])
            .await
            .unwrap()
            .samples()
    );
    refused(tq.get_data(&old_meta).await.unwrap_err());
    refused(
        tq.clear_samples(&old_meta)
            .await
            .expect_err("an old clear must not reach the new sample"),
    );
    assert_eq!(
        fresh
            .partition("q")
            .kv_batch_get(&["k"], None)
            .await
            .unwrap(),
        rows(1, 5),
        "the new sample is untouched"
    );
    let _ = controller.terminate(Duration::from_secs(5));
}

/// Sends `signal` (e.g. `STOP`, `CONT`) to a process.
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_update_reports_outcome_unknown_and_a_timed_out_read_is_safe() {
    let (mut controller, url) = common::controller(1);
    let mut unit = Tq::spawn(&["storage-unit", "--controller", &url, "--id", "unit-0"]);
    unit.listening(1);
    let tq = Client::connect_with(&url, config(400)).await.unwrap();
    let p = tq.partition("p");
    p.kv_put("k", &rows(1, 0), None).await.unwrap();

    // A frozen unit accepts the bytes on its socket but never answers: the update was sent
    // and may be applied when the unit wakes up, so its outcome is unknown.
    signal(unit.pid(), "STOP");
    let e = p
        .kv_update("k", &rows(1, 100), &tq_core::MergeOp::Add)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Timeout, "{e}");
    assert_eq!(e.retry(), tq_core::Retry::OutcomeUnknown, "{e}");
    assert!(
        !e.is_retryable(),
        "an update that may have been applied is not safe to repeat"
    );
    // A read is idempotent: it was retried once and is safe to repeat.
    let e = p.kv_batch_get(&["k"], None).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Timeout, "{e}");
    assert_eq!(e.retry(), tq_core::Retry::Safe, "{e}");
    assert!(e.is_retryable());
    signal(unit.pid(), "CONT");

    // Nothing was published for the timed-out update: the key still reads its first value
    // (the unit may have merged the cells meanwhile; the controller did not publish them).
    let got = p.kv_batch_get(&["k"], Some(&["x"])).await.unwrap();
    assert_eq!(got.len(), 1);
    controller.kill();
    // A peer that cannot be reached was never sent the request: safe to retry.
    let e = p.kv_batch_get(&["k"], None).await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert_eq!(e.retry(), tq_core::Retry::Safe, "{e}");
}

/// `tq controller --state-dir`, killed with SIGKILL while two producers and a consumer (in
/// processes of their own, acknowledged delivery) are at work, and started again on the same
/// directory and address: the storage units rejoin without losing their cells (same epoch), the
/// workers ride out the outage, and every sample is consumed — none twice, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_with_a_state_dir_survives_kill_9() {
    let dir = common::tempdir("state-dir");
    let listen = common::free_listen();
    let state = dir.join("state");
    let start = || {
        Tq::spawn(&[
            "controller",
            "--listen",
            &listen,
            "--units",
            "2",
            "--state-dir",
            state.to_str().unwrap(),
        ])
    };
    let mut controller = start();
    controller.listening(1);
    let mut units = common::storage_units(&listen, 2);
    let mut controller =
        common::a_job_across_a_controller_kill(&listen, controller, start, 2, 200).await;
    let _ = controller.terminate(Duration::from_secs(5));
    for u in &mut units {
        u.kill();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `return_fetched` over the network: samples a fetch took and gave back are fetched again,
/// and giving back what is no longer taken changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_given_back_over_the_network_are_fetched_again() {
    use tq_controller::ControlPlane;
    let (_tq, url) = serve(2, &[]);
    let tq = Client::connect_with(&url, config(10_000)).await.unwrap();
    let p = tq.partition("p");
    p.put_new(&rows(4, 0)).await.unwrap();
    let taken = p.fetch(&["x"], "t", 4).await.unwrap();
    assert_eq!(taken.len(), 4);
    let control = tq_controller::RemoteControlPlane::new(
        tq_net::Pool::new(tq_net::ClientConfig::default()),
        url.parse().unwrap(),
        Duration::from_secs(10),
    );
    let back = control.return_fetched("p", "t", None, taken.samples());
    assert_eq!(back.await.unwrap(), 4);
    let again = p.fetch(&["x"], "t", 4).await.unwrap();
    assert_eq!(again.samples(), taken.samples());
    let leased = control.return_fetched("p", "t", Some(12345), taken.samples());
    assert_eq!(
        leased.await.unwrap(),
        0,
        "no sample is held under that lease"
    );
}

/// A checkpoint of a deployment whose payloads live in storage-unit processes (one of them
/// offloading to SSD): saved with `tq checkpoint save` while 50 of 200 samples are consumed,
/// then every process is killed (the payloads die with them), a new controller and new unit
/// processes start, `tq checkpoint load` puts the state and the cells back, and a consumer
/// finishes the job: every sample consumed exactly once, with its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_carries_storage_unit_payloads_to_new_processes() {
    let dir = common::tempdir("unit-checkpoint");
    let checkpoint = dir.join("checkpoint");
    let ssd = dir.join("ssd");
    let listen = common::free_listen();
    let start = |generation: &str| {
        let mut controller = Tq::spawn(&["controller", "--listen", &listen, "--units", "2"]);
        controller.listening(1);
        let ssd_path = ssd.join(generation);
        let units: Vec<Tq> = (0..2)
            .map(|i| {
                let id = format!("unit-{i}");
                let mut args = vec!["storage-unit", "--controller", &listen, "--id", &id];
                let path = ssd_path.display().to_string();
                if i == 1 {
                    args.extend(["--ssd-path", &path, "--ssd-threshold", "16"]);
                }
                let mut u = Tq::spawn(&args);
                u.listening(1);
                u
            })
            .collect();
        (controller, units)
    };
    let (mut controller, mut units) = start("a");
    common::produce(&listen, 200);
    let tq = Client::connect_with(&listen, config(10_000)).await.unwrap();
    let first = common::consume_acked(&tq, 50).await;
    common::checkpoint("save", &format!("file://{}", checkpoint.display()), &listen);
    let cells_files = std::fs::read_dir(&checkpoint)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "cells")
        })
        .count();
    assert!(cells_files >= 2, "each unit's cells are in the checkpoint");

    controller.kill();
    for u in &mut units {
        u.kill();
    }
    let (mut controller, mut units) = start("b");
    common::checkpoint("load", checkpoint.to_str().unwrap(), &listen);
    common::finish_job(&listen, &first, 200);
    let _ = controller.terminate(Duration::from_secs(5));
    for u in &mut units {
        u.kill();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The threads of process `pid` named `name` (Linux: `/proc/<pid>/task/*/comm`), read until
/// there are `expected` or 10 s passed: a new thread names itself once it runs.
fn threads_named(pid: u32, name: &str, expected: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == name)
            .count();
        if found == expected || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_run_the_configured_worker_threads_and_refuse_a_bad_count() {
    // The default: one worker thread per server process (decision 0051).
    let (mut controller, url) = common::controller(1);
    let mut unit = Tq::spawn_env(
        &["storage-unit", "--controller", &url, "--id", "unit-0"],
        &[("TQ_NET_SERVER_THREADS", "3")],
    );
    unit.listening(1);
    assert_eq!(threads_named(controller.pid(), "tq-server", 1), 1);
    assert_eq!(threads_named(unit.pid(), "tq-server", 3), 3);
    // And they serve: a put and a get through both.
    let tq = Client::connect_with(&url, config(10_000)).await.unwrap();
    tq.partition("threads")
        .kv_put("k", &rows(1, 5), None)
        .await
        .unwrap();
    let back = tq
        .partition("threads")
        .kv_batch_get(&["k"], None)
        .await
        .unwrap();
    assert_eq!(back.len(), 1);
    drop(tq);
    let _ = unit.terminate(Duration::from_secs(5));
    let _ = controller.terminate(Duration::from_secs(5));

    let refused = Tq::spawn_env(
        &["serve", "--listen", "tcp://127.0.0.1:0", "--units", "1"],
        &[("TQ_NET_SERVER_THREADS", "0")],
    );
    let (status, stderr) = refused.wait_exit(Duration::from_secs(10));
    assert!(!status.success());
    assert!(stderr.contains("net.server_threads"), "{stderr}");
}
