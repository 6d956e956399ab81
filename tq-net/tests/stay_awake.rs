//! A server connection that stays awake after each request (`ServerConfig::stay_awake`) still
//! answers every request, notices a peer that leaves, and stops when the server shuts down,
//! however long its window.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
mod common;

use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tq_net::{ServerConfig, DEFAULT_STAY_AWAKE};

/// A window far longer than any of these tests: whatever ends a connection's wait must do so
/// from inside the window.
const FOREVER: Duration = Duration::from_secs(3600);

fn awake(window: Duration) -> ServerConfig {
    ServerConfig {
        stay_awake: window,
        shutdown_timeout: Duration::from_secs(5),
        ..ServerConfig::default()
    }
}

/// A server that stays awake for an hour, and a pool that made one request: its connection is
/// a quick peer, so the server is now waiting for the next request inside the window.
async fn awake_after_one_request() -> (tq_net::Server, tq_net::Endpoint, tq_net::Pool) {
    let server = common::serve(common::Echo, awake(FOREVER)).await;
    let peer = server.local_endpoint().clone();
    let pool = common::pool();
    common::assert_serving(&pool, &peer).await;
    (server, peer, pool)
}

#[test]
fn the_default_window_is_short() {
    assert_eq!(ServerConfig::default().stay_awake, DEFAULT_STAY_AWAKE);
    assert!(DEFAULT_STAY_AWAKE > Duration::ZERO && DEFAULT_STAY_AWAKE <= Duration::from_millis(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_and_after_the_window_are_answered() {
    for window in [Duration::ZERO, Duration::from_micros(200), FOREVER] {
        let server = common::serve(common::Echo, awake(window)).await;
        let peer = server.local_endpoint().clone();
        let pool = common::pool();
        // Back to back (inside any window), then after the window has passed (200 µs).
        for _ in 0..50 {
            common::assert_serving(&pool, &peer).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        common::assert_serving(&pool, &peer).await;
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_leaves_inside_the_window_is_noticed() {
    let (server, peer, pool) = awake_after_one_request().await;
    assert_eq!(server.open_connections(), 1);
    drop(pool); // the pool and its connection are dropped: the socket closes.
    assert!(
        common::eventually(Duration::from_secs(5), || server.open_connections() == 0).await,
        "the connection is still counted open"
    );
    // A bare socket that connects and leaves before its handshake as well.
    let addr = peer.to_string().trim_start_matches("tcp://").to_owned();
    drop(TcpStream::connect(addr).await.expect("connect"));
    assert!(common::eventually(Duration::from_secs(5), || server.open_connections() == 0).await);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_connections_that_are_awake() {
    let (server, _peer, _pool) = awake_after_one_request().await;
    let started = Instant::now();
    server.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "shutdown waited {:?} for an awake connection",
        started.elapsed()
    );
}
