//! Helpers shared by the integration tests: servers on free loopback ports, raw-socket tools for
//! crafting hostile bytes, and small handlers.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tq_core::Result;
use tq_net::{async_trait, ClientConfig, Endpoint, Handler, Message, Pool, Server, ServerConfig};

/// A loopback TCP endpoint on a port the OS picks.
pub fn any_port() -> Endpoint {
    "tcp://127.0.0.1:0".parse().expect("endpoint")
}

pub async fn serve(handler: impl Handler, config: ServerConfig) -> Server {
    Server::bind(&any_port(), config, Arc::new(handler))
        .await
        .expect("bind")
}

/// A pool with a 20 s request timeout that retries only once (these tests look at single
/// attempts; `faults.rs` tests the default retry policy on its own).
pub fn pool() -> Pool {
    Pool::new(ClientConfig {
        request_timeout: Duration::from_secs(20),
        retry: tq_net::RetryConfig::once(),
        ..ClientConfig::default()
    })
}

/// Answers every request with the request itself.
pub struct Echo;

#[async_trait]
impl Handler for Echo {
    async fn handle(&self, request: Message) -> Result<Message> {
        Ok(request)
    }
}

/// Echo, counting requests.
#[derive(Default, Clone)]
pub struct CountingEcho(pub Arc<AtomicUsize>);

#[async_trait]
impl Handler for CountingEcho {
    async fn handle(&self, request: Message) -> Result<Message> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(request)
    }
}

/// Checks that `pool` gets an echo from `peer` (the server is still serving).
pub async fn assert_serving(pool: &Pool, peer: &Endpoint) {
    let request = Message::new(
        bytes::Bytes::from_static(b"ping"),
        vec![bytes::Bytes::from_static(b"frame")],
    );
    let answer = pool
        .call(
            peer,
            request.clone(),
            tq_net::CallOptions::default().with_timeout(Duration::from_secs(10)),
        )
        .await
        .expect("server still serving");
    assert_eq!(answer, request);
}

/// The `host:port` of a TCP endpoint.
pub fn addr(endpoint: &Endpoint) -> String {
    match endpoint {
        Endpoint::Tcp(a) => a.clone(),
        Endpoint::Unix(_) => panic!("not tcp"),
    }
}

/// A raw TCP connection (no handshake).
pub async fn raw(endpoint: &Endpoint) -> TcpStream {
    TcpStream::connect(addr(endpoint)).await.expect("connect")
}

/// A raw TCP connection that has completed a handshake (this build's version) without a token.
pub async fn raw_handshaken(endpoint: &Endpoint) -> TcpStream {
    let mut s = raw(endpoint).await;
    let hello = tq_net::handshake::client_hello(tq_net::PROTOCOL_VERSION, b"").expect("hello");
    s.write_all(&hello).await.expect("hello");
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await.expect("reply");
    assert_eq!(&head[..5], b"TQNET");
    assert_eq!(head[6], 0, "handshake accepted");
    let len = u16::from_le_bytes([head[7], head[8]]) as usize;
    let mut msg = vec![0u8; len];
    s.read_exact(&mut msg).await.expect("reply message");
    s
}

/// Waits until the server closes `s` (read returns 0 or an error), at most `within`.
/// Discards anything the server sends first.
pub async fn assert_closed_by_server(s: &mut TcpStream, within: Duration) {
    let closed = async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    };
    tokio::time::timeout(within, closed)
        .await
        .expect("server should close the connection");
}

/// The 24-byte message prefix, built by hand from the spec.
pub fn prefix(id: u64, kind: u8, header_len: u32, frame_count: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(24);
    b.extend_from_slice(&id.to_le_bytes());
    b.push(kind);
    b.extend_from_slice(&[0, 0, 0]);
    b.extend_from_slice(&header_len.to_le_bytes());
    b.extend_from_slice(&frame_count.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b
}

/// Polls `cond` until true or `within` passes.
pub async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}
