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
}

#[cfg(not(feature = "bench"))]
#[test]
fn a_production_build_has_no_bench_command() {
    let out = tq(&["bench"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unrecognized subcommand"));
}

#[test]
fn a_short_soak_with_faults_keeps_its_invariants() {
    let out = tq(&[
        "soak",
        "--duration",
        "4",
        "--fault-every",
        "1",
        "--clients",
        "2",
        "--batch",
        "8",
        "--width",
        "16",
        "--progress-every",
        "1",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("check: OK"), "{stdout}");
    // A long run says how it is going while it runs.
    assert!(stderr.contains("soak progress: "), "{stderr}");
    let faults: u32 = stdout
        .split(" faults")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(faults >= 2, "{stdout}");
}
