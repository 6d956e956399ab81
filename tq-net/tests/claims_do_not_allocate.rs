//! A peer that claims a large body (within the limits) and then sends little or nothing costs
//! only what it actually sent: the server's receive buffers grow with the bytes that arrive.
//!
//! Alone in its test binary so that no other test's allocations disturb the measurement. It
//! measures VmData (the process's allocated address space), which an eager `Vec::with_capacity`
//! of the claimed size would raise even though untouched pages never show up in RSS.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic

mod common;

use common::{assert_serving, prefix, raw_handshaken};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tq_net::ServerConfig;

/// A field of /proc/self/status, in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Bytes waiting unread in the receive queues of the server's accepted IPv4 loopback sockets
/// on `port` (from /proc/net/tcp, where the kernel lists each socket's `rx_queue`).
fn unread_bytes_on_server_port(port: u16) -> u64 {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let local_port = cols.get(1)?.rsplit(':').next()?;
            let state = cols.get(3)?;
            let rx_queue = cols.get(4)?.split(':').nth(1)?;
            // 01: ESTABLISHED (the listening socket's queue counts connections, not bytes).
            (u16::from_str_radix(local_port, 16).ok()? == port && *state == "01")
                .then(|| u64::from_str_radix(rx_queue, 16).ok())
                .flatten()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claimed_sizes_within_limits_are_not_allocated_up_front() {
    // Default limits: 16 GiB body, 2^20 frames, 64 MiB header.
    let server = common::serve(common::Echo, ServerConfig::default()).await;
    let peer = server.local_endpoint().clone();
    let pool = common::pool();
    assert_serving(&pool, &peer).await;
    let before_data = status_kib("VmData:");
    let before_rss = status_kib("VmRSS:");

    let mut stalled = Vec::new();
    // 8 GiB body claimed, 100 bytes sent.
    for i in 0..4u64 {
        let mut s = raw_handshaken(&peer).await;
        let mut b = prefix(i, 0, 0, 1);
        b.extend_from_slice(&(8u64 << 30).to_le_bytes());
        b.extend_from_slice(&[7u8; 100]);
        s.write_all(&b).await.expect("write");
        stalled.push(s);
    }
    // 2^20 frames claimed (an 8 MiB length table), 16 bytes of the table sent.
    {
        let mut s = raw_handshaken(&peer).await;
        let mut b = prefix(9, 0, 0, 1 << 20);
        b.extend_from_slice(&[0u8; 16]);
        s.write_all(&b).await.expect("write");
        stalled.push(s);
    }
    // A 64 MiB header claimed, 10 bytes sent.
    {
        let mut s = raw_handshaken(&peer).await;
        let mut b = prefix(10, 0, 64 << 20, 0);
        b.extend_from_slice(&[1u8; 10]);
        s.write_all(&b).await.expect("write");
        stalled.push(s);
    }
    // Once the server has read everything that was sent (nothing left in its sockets' receive
    // queues) it waits for the rest; meanwhile it serves others.
    let port: u16 = peer
        .to_string()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a TCP endpoint with a port");
    assert!(
        common::eventually(Duration::from_secs(10), || unread_bytes_on_server_port(
            port
        ) == 0)
        .await,
        "the server did not read what the stalled peers sent"
    );
    for _ in 0..5 {
        assert_serving(&pool, &peer).await;
    }
    let grown_data_mib = status_kib("VmData:").saturating_sub(before_data) / 1024;
    let grown_rss_mib = status_kib("VmRSS:").saturating_sub(before_rss) / 1024;
    // Claimed: 4 x 8 GiB + 8 MiB + 64 MiB. Allowed: the initial 1 MiB buffers plus slack.
    assert!(
        grown_data_mib < 256,
        "allocated address space grew by {grown_data_mib} MiB for claims of 32 GiB"
    );
    assert!(grown_rss_mib < 128, "RSS grew by {grown_rss_mib} MiB");
    drop(stalled);
    server.shutdown().await;
}
