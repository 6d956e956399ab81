//! Criterion: same-host shared memory (`net.shared_memory`, docs/decisions/0042). One remote
//! deployment (a controller and two storage-unit processes on loopback, started by this
//! benchmark), reached by two clients of this process: one over TCP only, one with shared
//! memory on. Each moves the same 1 MiB samples (put, get, clear), next to raw loopback TCP
//! carrying the same bytes in the same run. A same-host get of whole-page rows returns the
//! units' own pages mapped side by side, so it should beat the TCP figures by several times;
//! a put still copies once into a fresh segment.
//!
//! 128 samples per batch (128 MiB) instead of the usual 1024, so that a 2-core machine gets
//! criterion's samples in seconds; above the 256 KiB per unit request from which puts use a
//! segment either way.
//! Run: `cargo bench -p tq-bench --bench same_host [-- shm]`

mod common;

use common::{
    criterion, put_get_clear, runtime, serve_if_child, tcp_baseline, Deployment, Workload,
};

/// Samples per batch of this target (see the module doc).
const ROWS: usize = 128;

fn main() {
    serve_if_child();
    let mut c = criterion(3);
    let rt = runtime();
    let deployment = Deployment::start();
    let tcp = rt
        .block_on(tq::Client::connect(&deployment.url))
        .expect("connect over TCP");
    let mut config = tq::Config::default();
    config.net.shared_memory = true;
    let shm = rt
        .block_on(tq::Client::connect_with(&deployment.url, config))
        .expect("connect with shared memory");
    for name in ["simple-large", "complex-large"] {
        let w = Workload::with_rows(name, ROWS);
        let mut g = w.group(&mut c, "same-host-tcp");
        tcp_baseline(&mut g, w.bytes() as usize);
        put_get_clear(&mut g, &rt, &tcp, &w);
        g.finish();
        let mut g = w.group(&mut c, "same-host-shm");
        put_get_clear(&mut g, &rt, &shm, &w);
        g.finish();
    }
    drop((tcp, shm));
    drop(deployment);
    c.final_summary();
}
