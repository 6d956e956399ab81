//! Operator mistakes that used to lose data silently, each with real `tq` processes on free
//! loopback ports: two controllers on one state dir, a duplicate storage-unit id, a retried
//! acknowledgement after a controller restart.

mod common;

use common::Tq;
use std::time::Duration;

fn tempdir(name: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("tq-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A second `tq controller` on a `--state-dir` that a live controller uses exits at once with
/// an error naming the holder's pid, and writes nothing there; once the holder is gone (even by
/// SIGKILL) the directory can be used again.
#[test]
fn a_second_controller_on_a_state_dir_is_refused() {
    let dir = tempdir("state-dir-lock");
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
