//! Many requests in flight on one connection, answered out of order and matched by id; pooled
//! connections are reused.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
mod common;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tq_core::Result;
use tq_net::{async_trait, CallOptions, ClientConfig, Handler, Message, Pool, ServerConfig};

#[derive(Serialize, Deserialize)]
struct Numbered {
    n: u64,
    sleep_ms: u64,
}

/// Sleeps as long as the request says, then answers with its number; records completion order
/// and counts requests that reached it (so tests wait for that instead of sleeping).
#[derive(Default, Clone)]
struct Sleeper {
    completed: Arc<Mutex<Vec<u64>>>,
    started: Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait]
impl Handler for Sleeper {
    async fn handle(&self, request: Message) -> Result<Message> {
        let req: Numbered = request.decode()?;
        self.started
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(req.sleep_ms)).await;
        self.completed.lock().expect("lock").push(req.n);
        // The frame carries the number too, so a mismatched answer would show in both.
        Message::encode(&req.n, vec![Bytes::from(req.n.to_le_bytes().to_vec())])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_requests_in_flight_are_answered_out_of_order_and_matched() {
    let sleeper = Sleeper::default();
    let server = common::serve(sleeper.clone(), ServerConfig::default()).await;
    let peer = server.local_endpoint().clone();
    let pool = common::pool();
    const N: u64 = 64;
    const STEP_MS: u64 = 5;
    let started = Instant::now();
    let mut calls = Vec::new();
    for n in 0..N {
        let pool = pool.clone();
        let peer = peer.clone();
        calls.push(tokio::spawn(async move {
            // Later numbers sleep less, so they finish first.
            let request = Message::encode(
                &Numbered {
                    n,
                    sleep_ms: (N - n) * STEP_MS,
                },
                vec![],
            )
            .expect("encode");
            let answer = pool
                .call(&peer, request, CallOptions::default())
                .await
                .expect("call");
            let got: u64 = answer.decode().expect("decode");
            let frame = u64::from_le_bytes(answer.frames[0][..].try_into().expect("8 bytes"));
            (n, got, frame)
        }));
    }
    for call in calls {
        let (n, got, frame) = call.await.expect("task");
        assert_eq!((got, frame), (n, n), "answer matched to its request");
    }
    let elapsed = started.elapsed();
    let serial: u64 = (1..=N).map(|k| k * STEP_MS).sum();
    assert!(
        elapsed < Duration::from_millis(serial / 2),
        "requests ran concurrently: {elapsed:?} vs {serial} ms if serial"
    );
    let completed = sleeper.completed.lock().expect("lock").clone();
    assert_eq!(completed.len() as u64, N);
    assert!(
        completed.windows(2).any(|w| w[0] > w[1]),
        "answers were produced out of request order"
    );
    assert!(
        server.connections_accepted() <= pool.config().connections_per_peer as u64,
        "{} connections for {} requests",
        server.connections_accepted(),
        N
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_slow_request_does_not_block_a_later_one_on_the_same_connection() {
    let sleeper = Sleeper::default();
    let server = common::serve(sleeper.clone(), ServerConfig::default()).await;
    let peer = server.local_endpoint().clone();
    let pool = Pool::new(ClientConfig {
        connections_per_peer: 1,
        ..ClientConfig::default()
    });
    let slow = {
        let (pool, peer) = (pool.clone(), peer.clone());
        tokio::spawn(async move {
            let request = Message::encode(
                &Numbered {
                    n: 1,
                    sleep_ms: 3_000,
                },
                vec![],
            )
            .expect("encode");
            pool.call(&peer, request, CallOptions::default()).await
        })
    };
    // The slow request is on the connection and being handled first.
    let started = sleeper.started.clone();
    assert!(
        common::eventually(Duration::from_secs(5), || started
            .load(std::sync::atomic::Ordering::SeqCst)
            == 1)
        .await
    );
    let started = Instant::now();
    let fast = Message::encode(&Numbered { n: 2, sleep_ms: 0 }, vec![]).expect("encode");
    let answer = pool
        .call(&peer, fast, CallOptions::default())
        .await
        .expect("fast call");
    assert_eq!(answer.decode::<u64>().expect("decode"), 2);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "fast request waited for the slow one"
    );
    assert!(!slow.is_finished());
    assert_eq!(server.connections_accepted(), 1, "both on one connection");
    let slow_answer = slow.await.expect("task").expect("slow call");
    assert_eq!(slow_answer.decode::<u64>().expect("decode"), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn sequential_calls_reuse_one_connection() {
    let server = common::serve(common::Echo, ServerConfig::default()).await;
    let peer = server.local_endpoint().clone();
    let pool = common::pool();
    let clone = pool.clone();
    for i in 0..50u32 {
        let p = if i % 2 == 0 { &pool } else { &clone };
        common::assert_serving(p, &peer).await;
    }
    assert_eq!(server.connections_accepted(), 1);
    assert_eq!(pool.connection_count(&peer), 1);
    server.shutdown().await;
}
