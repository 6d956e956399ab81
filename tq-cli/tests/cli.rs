//! The `tq` binary, run as a user would.

use std::process::Command;

fn tq(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(args)
        .output()
        .expect("run tq")
}

#[test]
fn demo_trains_every_sample_exactly_once() {
    let out = tq(&[
        "demo",
        "--prompts",
        "64",
        "--responses",
        "3",
        "--train-groups",
        "4",
        "--quiet",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("trained samples   192 "), "{stdout}");
    assert!(stdout.contains("check             OK"), "{stdout}");
    assert!(stdout.contains("peak memory"), "{stdout}");
}

#[test]
fn demo_rejects_bad_sizes_with_a_clear_error() {
    let out = tq(&["demo", "--responses", "0", "--quiet"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("at least 1"), "{stderr}");
}

#[cfg(feature = "bench")]
#[test]
fn bench_rejects_unknown_workloads() {
    let out = tq(&["bench", "--workloads", "nope"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown workload `nope`"));
}

#[cfg(feature = "bench")]
#[test]
fn bench_reports_figures_next_to_memcpy() {
    let out = tq(&[
        "bench",
        "--workloads",
        "simple-small",
        "--samples",
        "64",
        "--reps",
        "1",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    for op in ["memcpy", "put", "get", "clear"] {
        assert!(
            stdout.contains(&format!("| simple-small | {op} |")),
            "{stdout}"
        );
    }
    assert!(stdout.contains("allocate + notify + fetch"), "{stdout}");
    // The step table, once per deployment (embedded and remote), every step with a time.
    for step in [
        "put 1/3: kv_prepare_put (controller)",
        "put 2/3: storage put (units)",
        "put 3/3: notify_production (controller)",
        "get 1/2: kv_retrieve_meta (controller)",
        "get 2/2: storage get (units)",
        "floor, called from a task of the runtime",
        "floor, from a thread in wait_for",
        "kv_put of 4 KiB from block_on",
        "kv_put of 4 KiB from wait_for",
    ] {
        let rows: Vec<&str> = stdout
            .lines()
            .filter(|l| l.starts_with(&format!("| simple-small | {step} | ")))
            .collect();
        assert_eq!(rows.len(), 2, "`{step}` once per deployment: {stdout}");
        for row in rows {
            let ms: f64 = row
                .split('|')
                .nth(3)
                .and_then(|c| c.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no time in `{row}`"));
            assert!(ms > 0.0, "{row}");
        }
    }
}

#[cfg(feature = "bench")]
#[test]
fn bench_scale_reports_every_table_with_its_baseline() {
    let out = tq(&[
        "bench",
        "--deployment",
        "scale",
        "--scale-clients",
        "4",
        "--scale-samples",
        "256,512",
        "--scale-payloads",
        "0",
        "--reps",
        "1",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    for table in [
        "one fetch of 8 in process, by partition size",
        "whole-partition queries in process",
        "made durable on a state dir",
        "from OS threads at once",
        "C clients (own connections)",
    ] {
        assert!(stdout.contains(table), "no `{table}` table: {stdout}");
    }
    // Same-run baselines: the disk floor and the raw loopback floor have numbers.
    assert!(stdout.contains("disk floor"), "{stdout}");
    assert!(stdout.contains("raw floor samples/s"), "{stdout}");
    // Two threads on two partitions, and each many-clients row exactly once.
    assert!(stdout.contains("| 2 | 2 |"), "{stdout}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("| 256 | none | 4 |") || l.starts_with("| 512 | none | 4 |"))
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert!(rows.iter().all(|r| r.ends_with("| yes |")), "{rows:?}");
}

#[cfg(not(feature = "bench"))]
#[test]
fn a_production_build_has_no_bench_command() {
    let out = tq(&["bench"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unrecognized subcommand"));
}

/// The number just before the first `suffix` in `text`.
#[cfg(feature = "soak")]
fn number_before(text: &str, suffix: &str) -> Option<u64> {
    let (before, _) = text.split_once(suffix)?;
    before.rsplit(' ').next()?.parse().ok()
}

#[cfg(not(feature = "soak"))]
#[test]
fn a_production_build_has_no_soak_command() {
    let out = tq(&["soak"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unrecognized subcommand"));
}

/// Runs `tq soak` with `extra` arguments; returns its report after checking it passed with
/// faults of every kind of its storage.
#[cfg(feature = "soak")]
fn short_soak(extra: &[&str]) -> String {
    let mut args = vec![
        "soak",
        "--duration",
        "6",
        "--fault-every",
        "1",
        "--clients",
        "2",
        "--kv-clients",
        "2",
        "--batch",
        "8",
        "--width",
        "16",
        "--progress-every",
        "1",
    ];
    args.extend_from_slice(extra);
    let out = tq(&args);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("check: OK"), "{stdout}");
    assert!(stdout.contains("content mismatches: 0"), "{stdout}");
    assert!(
        stdout.contains("leaked after the final clear: 0"),
        "{stdout}"
    );
    // A long run says how it is going while it runs.
    assert!(stderr.contains("soak progress: "), "{stderr}");
    // Every kind of fault struck, and both kinds of worker did work that was checked.
    assert!(
        stdout.contains("worker killed (SIGKILL) and replaced"),
        "{stdout}"
    );
    assert!(stdout.contains("paused (SIGSTOP)"), "{stdout}");
    assert!(
        stdout.contains("controller killed (SIGKILL) and restarted on its state dir"),
        "{stdout}"
    );
    assert!(
        stdout.contains("killed (SIGKILL) and restarted"),
        "{stdout}"
    );
    assert!(
        number_before(&stdout, " rows verified") > Some(0),
        "{stdout}"
    );
    assert!(number_before(&stdout, " consumed") > Some(0), "{stdout}");
    stdout
}

#[cfg(feature = "soak")]
#[test]
fn a_short_soak_with_faults_keeps_its_invariants() {
    short_soak(&[]);
}

/// The same on Redis (append-only file synced on every write): restarts lose nothing.
#[cfg(all(feature = "redis", feature = "soak"))]
#[test]
fn a_short_soak_on_redis_with_faults_loses_nothing() {
    let has_redis = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok();
    if !has_redis {
        assert!(
            std::env::var("TQ_REQUIRE_REDIS").is_err(),
            "redis-server is not on PATH but TQ_REQUIRE_REDIS is set"
        );
        eprintln!("SKIPPED: redis-server not on PATH");
        return;
    }
    let report = short_soak(&["--storage", "redis"]);
    assert_eq!(
        number_before(&report, " reported lost"),
        Some(0),
        "{report}"
    );
    assert_eq!(
        number_before(&report, " rows reported lost"),
        Some(0),
        "{report}"
    );
    assert!(report.contains(", 0 Redis keys"), "{report}");
}

/// `tq --version` names the storage backends compiled in; the default build has Redis and
/// object storage.
#[test]
fn the_version_names_the_compiled_in_backends() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tq"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with(&format!("tq {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert!(text.contains("storage backends: simple, ssd"), "{text}");
    assert_eq!(text.contains("redis"), cfg!(feature = "redis"), "{text}");
    assert_eq!(
        text.contains("object-store"),
        cfg!(feature = "object-store"),
        "{text}"
    );
}
