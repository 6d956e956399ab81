//! Baselines: the same bytes moved without tq, in the same run.

use crate::measure::{copy_batch, measure, Stats};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tq_core::{Batch, Error, Result};

/// Allocate and copy every buffer of `batch`, holding all copies (like a reader holds a batch).
pub fn memcpy(batch: &Batch, reps: usize) -> Stats {
    measure(1, reps, || {
        std::hint::black_box(copy_batch(batch));
    })
}

fn io(e: std::io::Error) -> Error {
    Error::internal("raw TCP baseline").with_source(e)
}

/// Raw tokio TCP over loopback with `TCP_NODELAY`, over `streams` connections at once (as many as
/// a remote deployment moves the batch over: one per storage unit), each carrying its share of
/// `bytes`: `send` times writing to peers that read into fresh buffers and answer one byte;
/// `receive` times asking for the bytes and reading them into fresh buffers. These are what a put
/// and a get must at least do.
pub async fn tcp(bytes: usize, streams: usize, reps: usize) -> Result<(Stats, Stats)> {
    let streams = streams.max(1);
    let share = move |i: usize| bytes / streams + usize::from(i < bytes % streams);
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(io)?;
    let addr = listener.local_addr().map_err(io)?;
    let server = tokio::spawn(async move {
        let mut peers = Vec::with_capacity(streams);
        for i in 0..streams {
            let (s, _) = listener.accept().await?;
            s.set_nodelay(true)?;
            peers.push(tokio::spawn(echo_peer(s, share(i))));
        }
        for p in peers {
            p.await.map_err(std::io::Error::other)??;
        }
        Ok::<_, std::io::Error>(())
    });
    let mut conns = Vec::with_capacity(streams);
    for i in 0..streams {
        let c = TcpStream::connect(addr).await.map_err(io)?;
        c.set_nodelay(true).map_err(io)?;
        conns.push((c, vec![0xA5u8; share(i)]));
    }
    let mut send = Vec::new();
    let mut receive = Vec::new();
    for i in 0..=reps {
        let t = Instant::now();
        let sends = conns.iter_mut().map(|(c, payload)| async move {
            c.write_all(b"S").await?;
            c.write_all(payload).await?;
            let mut ack = [0u8; 1];
            c.read_exact(&mut ack).await.map(|_| ())
        });
        for r in futures::future::join_all(sends).await {
            r.map_err(io)?;
        }
        let s = t.elapsed();
        let t = Instant::now();
        let receives = conns.iter_mut().map(|(c, payload)| async move {
            c.write_all(b"R").await?;
            // The same kind of fresh buffer tq reads a column into (huge pages when large).
            let mut buf = tq_core::buffer::zeroed(payload.len());
            c.read_exact(&mut buf).await?;
            Ok::<_, std::io::Error>(std::hint::black_box(buf))
        });
        for r in futures::future::join_all(receives).await {
            r.map_err(io)?;
        }
        let r = t.elapsed();
        if i > 0 {
            send.push(s);
            receive.push(r);
        }
    }
    drop(conns);
    server
        .await
        .map_err(|e| Error::internal("raw TCP baseline server").with_source(e))?
        .map_err(io)?;
    Ok((Stats::from_samples(send), Stats::from_samples(receive)))
}

/// One peer of [`tcp`]: `S` = read `len` bytes into a fresh buffer and answer one byte; `R` =
/// send `len` bytes.
async fn echo_peer(mut s: TcpStream, len: usize) -> std::io::Result<()> {
    let payload = vec![0xA5u8; len];
    loop {
        let mut op = [0u8; 1];
        if s.read_exact(&mut op).await.is_err() {
            return Ok(());
        }
        if op[0] == b'S' {
            // A plain fresh buffer, as a storage unit receives a put into (tq-net grows its
            // receive buffer by doubling instead of trusting the claimed size; see
            // docs/benchmarks/log/2026-11-30-0420-core-embedded-remote.md on huge pages).
            let mut buf = vec![0u8; len];
            s.read_exact(&mut buf).await?;
            std::hint::black_box(&buf);
            s.write_all(b"k").await?;
        } else {
            s.write_all(&payload).await?;
        }
    }
}

/// Round trips of `bytes` over raw loopback TCP: the floor under a small put + get.
pub async fn tcp_ping_pong(bytes: usize, rounds: usize) -> Result<Vec<Duration>> {
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(io)?;
    let addr = listener.local_addr().map_err(io)?;
    let server = tokio::spawn(echo(listener, bytes));
    let times = ping_pong(addr, bytes, rounds).await;
    let _ = server.await;
    times
}

/// Round trips of `bytes` over raw loopback TCP to an echo server running on its own OS thread
/// (its own single-threaded runtime), so each direction wakes a sleeping peer as a request to
/// another process does. This is the floor under one remote call; [`tcp_ping_pong`] (both ends
/// on one thread, nobody ever sleeps) is the floor of the socket path alone.
pub async fn tcp_ping_pong_cross_thread(bytes: usize, rounds: usize) -> Result<Vec<Duration>> {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io)?;
    let addr = std_listener.local_addr().map_err(io)?;
    std_listener.set_nonblocking(true).map_err(io)?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        rt.block_on(async move { echo(TcpListener::from_std(std_listener)?, bytes).await })
    });
    let times = ping_pong(addr, bytes, rounds).await?;
    server
        .join()
        .map_err(|_| Error::internal("raw TCP echo thread panicked"))?
        .map_err(io)?;
    Ok(times)
}

/// Accepts one connection and echoes `bytes`-sized messages until it closes.
async fn echo(listener: TcpListener, bytes: usize) -> std::io::Result<()> {
    let (mut s, _) = listener.accept().await?;
    s.set_nodelay(true)?;
    let mut buf = vec![0u8; bytes];
    while s.read_exact(&mut buf).await.is_ok() {
        s.write_all(&buf).await?;
    }
    Ok(())
}

/// Times `rounds` round trips of `bytes` to the echo server at `addr`, then closes.
async fn ping_pong(
    addr: std::net::SocketAddr,
    bytes: usize,
    rounds: usize,
) -> Result<Vec<Duration>> {
    let mut c = TcpStream::connect(addr).await.map_err(io)?;
    c.set_nodelay(true).map_err(io)?;
    let out = vec![1u8; bytes];
    let mut back = vec![0u8; bytes];
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        c.write_all(&out).await.map_err(io)?;
        c.read_exact(&mut back).await.map_err(io)?;
        times.push(t.elapsed());
    }
    Ok(times)
}
