//! Operator mistakes that used to lose data silently, and the restarts a job must ride out,
//! each with real `tq` processes on free loopback ports: two controllers on one state dir, a
//! duplicate storage-unit id, a unit that must stop at SIGTERM, configuration a controller
//! cannot serve, a library-only job across a controller kill -9, and `tq demo --connect` on a
//! deployment other jobs use.

mod common;

use common::Tq;
use std::time::Duration;

/// A second `tq controller` on a `--state-dir` that a live controller uses exits at once with
/// an error naming the holder's pid, and writes nothing there; once the holder is gone (even by
/// SIGKILL) the directory can be used again.
#[test]
fn a_second_controller_on_a_state_dir_is_refused() {
    let dir = common::tempdir("state-dir-lock");
    let state = dir.join("state");
    let state = state.to_str().unwrap();
    let start = |listen: &str| {
        Tq::spawn(&[
            "controller",
            "--listen",
            listen,
            "--units",
            "1",
            "--state-dir",
            state,
        ])
    };
    let mut first = start(&common::free_listen());
    first.listening(1);
    let log = std::fs::metadata(dir.join("state/controller.log"))
        .unwrap()
        .len();

    let second = start(&common::free_listen());
    let (status, stderr) = second.wait_exit(Duration::from_secs(30));
    assert!(!status.success(), "the second controller must not start");
    assert!(stderr.contains("in use"), "{stderr}");
    assert!(stderr.contains(&format!("pid {}", first.pid())), "{stderr}");
    let after = std::fs::metadata(dir.join("state/controller.log"))
        .unwrap()
        .len();
    assert_eq!(log, after, "the refused controller wrote nothing");

    first.kill();
    let mut third = start(&common::free_listen());
    third.listening(1);
    let _ = third.terminate(Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A second `tq storage-unit` under the id of a live unit is refused (it exits, naming the
/// holder's address; the controller logs a warning) and the deployment keeps routing to the
/// holder; once the holder is dead, a unit under its id on another address takes its place
/// after the holder's registration lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_unit_id_is_refused_while_its_holder_lives() {
    use tq_core::{Batch, Column, Tensor};
    let dir = common::tempdir("duplicate-unit");
    let log = dir.join("controller.log");
    let mut controller = Tq::spawn_logged(
        &[
            "controller",
            "--listen",
            "tcp://127.0.0.1:0",
            "--units",
            "2",
        ],
        &[],
        &log,
    );
    let url = Tq::controller_endpoint(&controller.listening(1));
    let mut u0 = Tq::spawn(&["storage-unit", "--controller", &url, "--id", "unit-0"]);
    let u0_endpoint = u0.listening(1)[0].endpoint.clone();
    let mut u1 = Tq::spawn(&["storage-unit", "--controller", &url, "--id", "unit-1"]);
    u1.listening(1);
    let tq = tq_client::Client::connect(&url).await.unwrap();
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    let values: Vec<i64> = (0..8).collect();
    let batch = Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![8], &values).unwrap()),
    )])
    .unwrap();
    tq.partition("p")
        .kv_batch_put(&keys, &batch, None)
        .await
        .unwrap();

    let duplicate = Tq::spawn(&["storage-unit", "--controller", &url, "--id", "unit-0"]);
    let (status, stderr) = duplicate.wait_exit(Duration::from_secs(30));
    assert!(!status.success(), "the duplicate must not serve");
    assert!(stderr.contains("held by a live unit"), "{stderr}");
    assert!(stderr.contains(&u0_endpoint), "names the holder: {stderr}");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("refused a second storage unit"),
        "controller log: {logged}"
    );
    // Nothing moved: every key reads back from the holder, also for a new client.
    let fresh = tq_client::Client::connect(&url).await.unwrap();
    for client in [&tq, &fresh] {
        let got = client
            .partition("p")
            .kv_batch_get(&keys, None)
            .await
            .unwrap();
        assert_eq!(got, batch);
    }

    // The holder dies; a unit under its id on another address takes over once it lapsed.
    u0.kill();
    let mut replacement = Tq::spawn(&["storage-unit", "--controller", &url, "--id", "unit-0"]);
    let replacement_endpoint = replacement.listening(1)[0].endpoint.clone();
    assert_ne!(replacement_endpoint, u0_endpoint);
    let after = tq_client::Client::connect(&url).await.unwrap();
    let put: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
    after
        .partition("p")
        .kv_batch_put(&put, &batch, None)
        .await
        .unwrap();
    assert_eq!(
        after.partition("p").kv_batch_get(&put, None).await.unwrap(),
        batch
    );
    let _ = replacement.terminate(Duration::from_secs(5));
    u1.kill();
    let _ = controller.terminate(Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tq storage-unit` stops at SIGTERM while it is still trying to register (its controller is
/// not there), instead of ignoring it for up to 30 s.
#[test]
fn a_storage_unit_stops_at_sigterm_before_it_registered() {
    let dir = common::tempdir("unit-sigterm");
    let log = dir.join("unit.log");
    let nobody = common::free_listen();
    let mut unit = Tq::spawn_logged(
        &["storage-unit", "--controller", &nobody, "--id", "unit-0"],
        &[("RUST_LOG", "info")],
        &log,
    );
    // Its log says it is retrying: the signal handlers are in place.
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("retrying")
    {
        assert!(started.elapsed() < Duration::from_secs(20), "never retried");
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = unit
        .terminate(Duration::from_secs(5))
        .expect("SIGTERM ignored");
    assert!(status.success(), "a clean stop: {status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A controller refuses at start a configuration its clients could not use, instead of serving
/// it and leaving every client to fail: an unknown backend, `storage.num_units` for a backend
/// without units, and (in a build without TLS) a `rediss://` store.
#[test]
fn a_controller_refuses_configuration_its_clients_cannot_use() {
    let dir = common::tempdir("bad-config");
    let mut cases = vec![
        ("unknown-backend", "[storage]\nbackend = \"kvv\"\n", "`kvv` is not a built-in backend"),
        (
            "units-for-kv",
            "[storage]\nbackend = \"kv\"\nnum_units = 4\n[[storage.kv.stores]]\nurl = \"memory://\"\n",
            "storage.num_units applies to the `simple` backend",
        ),
    ];
    if cfg!(feature = "redis") {
        cases.push((
            "tls-without-tls",
            "[storage]\nbackend = \"kv\"\n[[storage.kv.stores]]\nurl = \"rediss://127.0.0.1:1\"\n",
            "TLS",
        ));
    }
    for (name, text, expected) in cases {
        let file = dir.join(format!("{name}.toml"));
        std::fs::write(&file, text).unwrap();
        let run = Tq::spawn(&[
            "controller",
            "--config",
            file.to_str().unwrap(),
            "--listen",
            "tcp://127.0.0.1:0",
        ]);
        let (status, stderr) = run.wait_exit(Duration::from_secs(30));
        assert!(!status.success(), "{name}: the controller started");
        assert!(stderr.contains(expected), "{name}: {stderr}");
    }
    // `TQ_STORAGE_NUM_UNITS` with a KV backend is refused the same way.
    let file = dir.join("kv.toml");
    std::fs::write(
        &file,
        "[storage]\nbackend = \"kv\"\n[[storage.kv.stores]]\nurl = \"memory://\"\n",
    )
    .unwrap();
    let run = Tq::spawn_env(
        &[
            "controller",
            "--config",
            file.to_str().unwrap(),
            "--listen",
            "tcp://127.0.0.1:0",
        ],
        &[("TQ_STORAGE_NUM_UNITS", "3")],
    );
    let (status, stderr) = run.wait_exit(Duration::from_secs(30));
    assert!(!status.success());
    assert!(stderr.contains("storage.num_units"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job written with the library alone — a producer of KV puts and an acknowledged stream
/// consumer, neither with retry code of its own — rides out a `tq controller --state-dir`
/// killed with SIGKILL and started again 0.5 s later: every put succeeds, every sample is
/// consumed exactly once, and the client counts its retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_job_rides_out_a_controller_restart() {
    use futures::StreamExt;
    use tq_core::{Batch, Column, Tensor};
    let dir = common::tempdir("ride-out");
    let state = dir.join("state");
    let listen = common::free_listen();
    let start = || common::state_dir_controller(&listen, &state, &[]);
    let mut controller = start();
    let mut units = common::storage_units(&listen, 2);
    let client = tq_client::Client::connect(&listen).await.unwrap();
    let (rounds, per_round) = (40usize, 5usize);
    let producer = {
        let p = client.partition("job");
        tokio::spawn(async move {
            for r in 0..rounds {
                let keys: Vec<String> = (0..per_round).map(|i| format!("k{r}-{i}")).collect();
                let ids: Vec<i64> = (0..per_round).map(|i| (r * per_round + i) as i64).collect();
                let batch = Batch::from_columns([(
                    "x",
                    Column::Dense(Tensor::from_slice(vec![per_round], &ids).unwrap()),
                )])
                .unwrap();
                p.kv_batch_put(&keys, &batch, None)
                    .await
                    .unwrap_or_else(|e| panic!("put {r}: {e}"));
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            p.complete().await.unwrap();
        })
    };
    let consumer = {
        let p = client.partition("job");
        tokio::spawn(async move {
            let config = tq_client::StreamConfig::new("train", &["x"], 4)
                .acknowledged(Duration::from_secs(3))
                .idle_timeout(Duration::from_secs(60));
            let mut stream = p.stream(config).unwrap();
            let mut seen = Vec::new();
            while let Some(item) = stream.next().await {
                let item = item.unwrap_or_else(|e| panic!("stream: {e}"));
                let Some(Column::Dense(x)) = item.batch.column("x") else {
                    panic!("dense x")
                };
                let ids = x.to_vec::<i64>().unwrap();
                let acked = stream
                    .ack(&item)
                    .await
                    .unwrap_or_else(|e| panic!("ack: {e}"));
                if acked == ids.len() {
                    seen.extend(ids);
                }
            }
            seen
        })
    };
    // Kill the controller mid-job, and start it again half a second later.
    while client
        .partition("job")
        .kv_list()
        .await
        .map_or(0, |l| l.entries.len())
        < 10 * per_round
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    controller.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let controller = start();
    producer.await.unwrap();
    let mut seen = consumer.await.unwrap();
    seen.sort_unstable();
    let all: Vec<i64> = (0..(rounds * per_round) as i64).collect();
    assert_eq!(seen, all, "every sample consumed exactly once");
    common::stop_deployment(controller, &mut units, &dir);
}

/// An insert and an at-most-once fetch whose answers are lost on the way (the controller applied
/// them; a proxy drops the answer and cuts the connection) are retried and get their first
/// answers: no sample is allocated twice, none is consumed and lost. The same after a `tq
/// controller --state-dir` killed with SIGKILL: a job of `put_new` and `fetch` (no retry code of
/// its own) ends with every sample consumed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answers_to_inserts_and_fetches_are_answered_again_not_applied_twice() {
    use tq_core::{Batch, Column, Tensor};
    let dir = common::tempdir("lost-answers");
    let state = dir.join("state");
    let listen = common::free_listen();
    let start = || common::state_dir_controller(&listen, &state, &[]);
    let mut controller = start();
    let mut units = common::storage_units(&listen, 2);
    let proxy = common::AnswerEater::start(&listen).await;
    let client = tq_client::Client::connect(&proxy.url).await.unwrap();
    let batch = |from: i64, n: usize| {
        let ids: Vec<i64> = (from..from + n as i64).collect();
        Batch::from_columns([(
            "x",
            Column::Dense(Tensor::from_slice(vec![n], &ids).unwrap()),
        )])
        .unwrap()
    };
    let ids_of = |b: &Batch| match b.column("x") {
        Some(Column::Dense(x)) => x.to_vec::<i64>().unwrap(),
        other => panic!("dense x, got {other:?}"),
    };

    // Lost answers, controller alive.
    let p = client.partition("once");
    proxy.eat_next();
    let first = p.put_new(&batch(0, 4)).await.expect("an insert retried");
    assert_eq!(proxy.eaten(), 1, "the insert's answer was dropped");
    p.put_new(&batch(4, 4)).await.unwrap();
    let status = p.production_status(&["x"]).await.unwrap();
    assert_eq!(
        status.samples.len(),
        8,
        "one allocation per insert: {status:?}"
    );
    assert_eq!(first.len(), 4);
    proxy.eat_next();
    let fetched = p.fetch(&["x"], "train", 4).await.expect("a fetch retried");
    assert_eq!(proxy.eaten(), 2, "the fetch's answer was dropped");
    let rest = p.fetch(&["x"], "train", 4).await.unwrap();
    let mut seen = ids_of(&client.get_data(&fetched).await.unwrap());
    seen.extend(ids_of(&client.get_data(&rest).await.unwrap()));
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..8).collect::<Vec<_>>(),
        "nothing lost, nothing twice"
    );

    // A job across a controller kill -9 (straight to the controller: no proxy).
    let direct = tq_client::Client::connect(&listen).await.unwrap();
    let rounds = 60i64;
    let producer = {
        let p = direct.partition("job");
        tokio::spawn(async move {
            for r in 0..rounds {
                p.put_new(&batch(r * 4, 4))
                    .await
                    .unwrap_or_else(|e| panic!("put {r}: {e}"));
            }
            p.complete().await.unwrap();
        })
    };
    let consumer = {
        let (client, p) = (direct.clone(), direct.partition("job"));
        tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                match p.fetch(&["x"], "train", 3).await {
                    Ok(meta) if meta.is_empty() => {}
                    Ok(meta) => {
                        let data = client
                            .get_data(&meta)
                            .await
                            .unwrap_or_else(|e| panic!("get: {e}"));
                        seen.extend(ids_of(&data));
                    }
                    Err(e) if e.kind() == &tq_core::ErrorKind::Closed => return seen,
                    Err(e) => panic!("fetch: {e}"),
                }
            }
        })
    };
    while direct
        .partition("job")
        .production_status(&["x"])
        .await
        .map_or(0, |s| s.samples.len())
        < 40
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    controller.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let controller = start();
    producer.await.unwrap();
    let mut seen = consumer.await.unwrap();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..rounds * 4).collect::<Vec<_>>(),
        "every sample consumed exactly once"
    );
    let status = direct
        .partition("job")
        .production_status(&["x"])
        .await
        .unwrap();
    assert_eq!(
        status.samples.len(),
        (rounds * 4) as usize,
        "no sample allocated twice"
    );
    common::stop_deployment(controller, &mut units, &dir);
}

/// `tq demo --connect` on a deployment in use: without the `grpo` sampler it stops before
/// writing anything (naming the setting); with it, it runs in partitions of its own, leaving
/// another job's `prompts` and `train` partitions as they were, and clears only what it wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_keeps_to_its_own_partitions_on_a_shared_deployment() {
    use tq_core::{Batch, Column, Tensor};
    let demo = |url: &str| {
        Tq::spawn(&[
            "demo",
            "--connect",
            url,
            "--prompts",
            "16",
            "--responses",
            "4",
            "--prompt-len",
            "16",
            "--response-len",
            "16",
            "--quiet",
        ])
    };
    // No sampler `grpo`: refused before anything is written.
    let (_plain, url) = common::serve(2, &[]);
    let (status, stderr) = demo(&url).wait_exit(Duration::from_secs(60));
    assert!(!status.success());
    assert!(stderr.contains("sampler `grpo`"), "{stderr}");
    let client = tq_client::Client::connect(&url).await.unwrap();
    assert!(
        client.list_partitions().await.unwrap().is_empty(),
        "nothing written"
    );

    let dir = common::tempdir("demo-shared");
    let config = dir.join("tq.toml");
    std::fs::write(&config, "[controller.samplers]\ngrpo = \"grpo:4\"\n").unwrap();
    let (_serve, url) = common::serve(2, &["--config", config.to_str().unwrap()]);
    let client = tq_client::Client::connect(&url).await.unwrap();
    let one = Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![1], &[7i64]).unwrap()),
    )])
    .unwrap();
    for p in ["prompts", "train"] {
        client
            .partition(p)
            .kv_batch_put(&["theirs"], &one, None)
            .await
            .unwrap();
    }
    let (status, stderr) = demo(&url).wait_exit(Duration::from_secs(120));
    assert!(status.success(), "{stderr}");
    let mut left = client.list_partitions().await.unwrap();
    left.sort();
    assert_eq!(
        left,
        ["prompts", "train"],
        "only the other job's partitions remain"
    );
    for p in ["prompts", "train"] {
        let got = client
            .partition(p)
            .kv_batch_get(&["theirs"], None)
            .await
            .unwrap();
        assert_eq!(got, one, "{p} untouched");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client pointed at a storage unit's address instead of the controller's is told so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_pointed_at_a_unit_is_told_it_is_a_unit() {
    let mut serve = Tq::spawn(&["serve", "--listen", "tcp://127.0.0.1:0", "--units", "1"]);
    let lines = serve.listening(2);
    let unit = lines
        .iter()
        .find(|l| l.role == "unit")
        .unwrap()
        .endpoint
        .clone();
    let mut config = tq_client::Config::default();
    config.net.connect_timeout_ms = 5_000;
    let Err(e) = tq_client::Client::connect_with(&unit, config).await else {
        panic!("a unit is not a controller");
    };
    assert!(
        e.message()
            .contains("this is storage unit `unit-0`, not a controller"),
        "{e}"
    );
    serve.kill();
}

/// `tq partition` looks after a running deployment's partitions — list (table and JSON),
/// complete, reset-consumption, clear (the partition stays), drop (it goes) — refusing a
/// partition that does not exist by name; `tq consume --clear` leaves nothing behind; every
/// client subcommand takes `--controller` (and the older `--connect` / positional URL).
#[test]
fn partition_administration_and_one_spelling_of_the_controller() {
    let (mut server, url) = common::serve(2, &[]);
    common::produce(&url, 30); // --connect: the older spelling still works
    let (status, _, stderr) = common::run(&[
        "produce",
        "--controller",
        &url,
        "--partition",
        "other",
        "--count",
        "10",
    ]);
    assert!(status.success(), "{stderr}");

    let (status, out, stderr) = common::run(&["partition", "list", "--controller", &url]);
    assert!(status.success(), "{stderr}");
    let row = |name: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no row for {name} in\n{out}"))
            .to_string()
    };
    assert_eq!(row("work").split_whitespace().nth(1), Some("30"), "{out}");
    assert_eq!(row("other").split_whitespace().nth(1), Some("10"), "{out}");
    let (_, json, _) = common::run(&["partition", "list", "--json", "--controller", &url]);
    let parsed: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(parsed.len(), 2, "{json}");
    assert!(
        parsed
            .iter()
            .any(|p| p["name"] == "work" && p["samples"] == 30),
        "{json}"
    );

    // A typo is an error naming the partition, and nothing is created.
    let (status, _, stderr) = common::run(&["partition", "clear", "wrok", "--controller", &url]);
    assert!(!status.success());
    assert!(
        stderr.contains("partition `wrok` does not exist"),
        "{stderr}"
    );

    // complete, then consume --clear: every sample consumed and cleared.
    let (status, out, stderr) =
        common::run(&["partition", "complete", "work", "--controller", &url]);
    assert!(status.success(), "{stderr}");
    assert!(out.contains("partition `work` is complete"), "{out}");
    let (status, out, stderr) = common::run(&[
        "consume",
        "--controller",
        &url,
        "--partition",
        "work",
        "--clear",
        "--idle-ms",
        "5000",
    ]);
    assert!(status.success(), "{stderr}");
    assert_eq!(
        common::acked_ids(&out.lines().map(String::from).collect::<Vec<_>>()).len(),
        30
    );
    let (_, json, _) = common::run(&["partition", "list", "--json", "--controller", &url]);
    let work: serde_json::Value = json
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|p| p["name"] == "work")
        .expect("the consumed partition stays");
    assert_eq!(
        work["samples"], 0,
        "consume --clear leaves no sample: {json}"
    );

    // reset-consumption of a task, clear (the partition stays), drop (it goes).
    let (status, _, stderr) = common::run(&[
        "consume",
        "--controller",
        &url,
        "--partition",
        "other",
        "--batch",
        "5",
        "--idle-ms",
        "300",
    ]);
    assert!(
        !status.success(),
        "not complete: the consumer waits out its idle time: {stderr}"
    );
    let (_, json, _) = common::run(&["partition", "list", "--json", "--controller", &url]);
    assert!(json.contains("\"consumed\":10"), "{json}");
    let (status, out, stderr) = common::run(&[
        "partition",
        "reset-consumption",
        "other",
        "--task",
        "consume",
        "--controller",
        &url,
    ]);
    assert!(status.success(), "{stderr}");
    assert!(out.contains("reset for task `consume`"), "{out}");
    let (_, json, _) = common::run(&["partition", "list", "--json", "--controller", &url]);
    assert!(json.contains("\"consumed\":0"), "{json}");
    let (status, out, _) = common::run(&["partition", "clear", "other", "--controller", &url]);
    assert!(status.success());
    assert!(
        out.contains("cleared 10 samples of partition `other`"),
        "{out}"
    );
    // An incomplete partition left empty goes, as after any clear; a complete one stays
    // (with its mark) until dropped.
    let (_, out, _) = common::run(&["partition", "list", "--controller", &url]);
    assert!(!out.contains("other"), "{out}");
    assert_eq!(
        row_of(&out, "work").split_whitespace().nth(4),
        Some("yes"),
        "{out}"
    );
    let (status, out, _) =
        common::run(&["partition", "drop", "other", "work", "--controller", &url]);
    assert!(status.success());
    assert!(
        out.contains("partition `other` does not exist; skipped"),
        "{out}"
    );
    assert!(out.contains("dropped partition `work`"), "{out}");
    let (_, out, _) = common::run(&["partition", "list", "--controller", &url]);
    assert!(out.contains("(no partitions)"), "{out}");

    // tq stats: positional URL, --controller, or --connect; two different ones are refused.
    for args in [
        vec!["stats", url.as_str()],
        vec!["stats", "--controller", url.as_str()],
        vec!["health", "--connect", url.as_str()],
    ] {
        let (status, _, stderr) = common::run(&args);
        assert!(status.success(), "{args:?}: {stderr}");
    }
    let (status, _, stderr) =
        common::run(&["stats", "tcp://127.0.0.1:1", "--controller", url.as_str()]);
    assert!(!status.success());
    assert!(stderr.contains("two controllers named"), "{stderr}");
    let _ = server.terminate(Duration::from_secs(5));
}

fn row_of(table: &str, name: &str) -> String {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row for {name} in\n{table}"))
        .to_string()
}

/// `tq config check FILE` says what a controller would refuse at start — an unknown key
/// (named), a backend this build lacks, an environment override that cannot work — and
/// accepts a good file; `tq config reference` prints the page docs/configuration.md holds.
#[test]
fn tq_config_check_refuses_what_a_controller_would() {
    let dir = common::tempdir("config-check");
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let good = write(
        "good.toml",
        "[controller.samplers]\ngrpo = \"grpo:4\"\n[storage]\nbackend = \"kv\"\n[storage.kv]\nstores = [{ url = \"memory://\" }]\n",
    );
    let (status, out, stderr) = common::run(&["config", "check", &good]);
    assert!(status.success(), "{stderr}");
    assert!(out.contains("ok (storage backend `kv`"), "{out}");
    assert!(out.contains("1 named sampler"), "{out}");
    for (name, text, expected) in [
        (
            "typo.toml",
            "[net]\nrequest_timeout = 5\n",
            "request_timeout",
        ),
        ("kvv.toml", "[storage]\nbackend = \"kvv\"\n", "kvv"),
        (
            "units.toml",
            "[storage]\nbackend = \"kv\"\nnum_units = 4\n",
            "storage.num_units",
        ),
        (
            "sampler.toml",
            "[controller]\ndefault_sampler = \"grpo:x\"\n",
            "default_sampler",
        ),
    ] {
        let path = write(name, text);
        let (status, _, stderr) = common::run(&["config", "check", &path]);
        assert!(!status.success(), "{name} accepted");
        assert!(stderr.contains(expected), "{name}: {stderr}");
        assert!(stderr.contains(name), "the error names the file: {stderr}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(["config", "check", &good])
        .env("TQ_NET_REQUEST_TIMEOUT_MS", "soon")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("TQ_NET_REQUEST_TIMEOUT_MS"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, page, _) = common::run(&["config", "reference"]);
    assert!(status.success());
    let committed = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md"),
    )
    .unwrap();
    assert_eq!(page, committed);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tq demo --controller` against a `tq controller --state-dir` killed with SIGKILL mid-run and
/// started again 0.5 s later: the demo (a library job with no retry code of its own) finishes
/// with every sample trained exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_rides_out_a_controller_kill() {
    let dir = common::tempdir("demo-kill");
    let config = dir.join("tq.toml");
    std::fs::write(&config, "[controller.samplers]\ngrpo = \"grpo:4\"\n").unwrap();
    let state = dir.join("state");
    let listen = common::free_listen();
    let extra = ["--config", config.to_str().unwrap()];
    let start = || common::state_dir_controller(&listen, &state, &extra);
    let mut controller = start();
    let mut units = common::storage_units(&listen, 2);
    let demo = Tq::spawn(&[
        "demo",
        "--controller",
        &listen,
        "--prompts",
        "1024",
        "--quiet",
    ]);
    // Mid-run: once the trainer has consumed something.
    let client = tq_client::Client::connect(&listen).await.unwrap();
    loop {
        let status = client.status().await.unwrap();
        let training = status
            .controller
            .partitions
            .iter()
            .any(|p| p.name.ends_with("/train") && p.tasks.iter().any(|t| t.consumed > 0));
        if training {
            break;
        }
        tokio::task::yield_now().await;
    }
    controller.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let controller = start();
    let (status, stderr) = demo.wait_exit(Duration::from_secs(120));
    assert!(status.success(), "{stderr}");
    common::stop_deployment(controller, &mut units, &dir);
}
