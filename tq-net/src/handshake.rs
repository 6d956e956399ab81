//! The connection handshake: protocol identification, version check and access token.
//!
//! ```text
//! client → server:  "TQNET"  u8 version  "\r\n"  u16 LE token length (≤ 4096)  token bytes
//! server → client:  "TQNET"  u8 version  u8 status  u16 LE message length  UTF-8 message
//!                   status: 0 ok, 1 version mismatch, 2 unauthorized
//! ```
//!
//! It happens once per connection, before any message. Its job is to make a mismatched or
//! unauthorized peer fail at once with a message a person can act on ("peer tcp://h:p speaks tq
//! protocol version 2, this build speaks 1"), instead of as a confusing framing error later.
//! On a refusal the server answers, then closes the connection and logs the peer address.
//!
//! The line break after the version (protocol 6 on) is for a client pointed at another kind of
//! server: it makes the first bytes a text line with no NUL in it, which a line-oriented server
//! answers at once — Redis with `-ERR unknown command 'TQNET…'`, an HTTP server with `400` —
//! so the client can say what it reached instead of waiting out its handshake timeout. (The
//! version is checked before anything after it is read, so older peers still get a version
//! mismatch in words.)

use crate::Endpoint;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tq_core::{Error, Result};

/// The protocol version this build speaks. Peers must speak the same one.
pub const PROTOCOL_VERSION: u8 = 11;

/// The first five bytes in both directions.
pub const MAGIC: &[u8; 5] = b"TQNET";

/// What follows the version byte in a client hello (see the module documentation).
pub const LINE_BREAK: &[u8; 2] = b"\r\n";

/// Longest access token a client may present.
pub const MAX_TOKEN_LEN: usize = 4096;

/// Handshake status: accepted.
pub const STATUS_OK: u8 = 0;
/// Handshake status: the client's protocol version differs from the server's.
pub const STATUS_VERSION_MISMATCH: u8 = 1;
/// Handshake status: the token is missing or wrong.
pub const STATUS_UNAUTHORIZED: u8 = 2;

/// After a refusal the server keeps reading (and discarding) for at most this long before
/// closing. Closing a socket with unread input makes the kernel send a reset, which can destroy
/// the refusal reply before the client reads it; draining lets the client see the reason.
const REFUSAL_DRAIN: Duration = Duration::from_millis(500);

/// The client hello bytes.
pub fn client_hello(version: u8, token: &[u8]) -> Result<Vec<u8>> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(Error::invalid(format!(
            "access token of {} bytes exceeds the protocol maximum of {MAX_TOKEN_LEN}",
            token.len()
        )));
    }
    let mut hello = Vec::with_capacity(8 + token.len());
    hello.extend_from_slice(MAGIC);
    hello.push(version);
    hello.extend_from_slice(LINE_BREAK);
    hello.extend_from_slice(&(token.len() as u16).to_le_bytes());
    hello.extend_from_slice(token);
    Ok(hello)
}

/// The server reply bytes. Messages longer than u16::MAX bytes are cut (on a char boundary).
pub fn server_reply(version: u8, status: u8, message: &str) -> Vec<u8> {
    let mut end = message.len().min(u16::MAX as usize);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let message = &message.as_bytes()[..end];
    let mut reply = Vec::with_capacity(9 + message.len());
    reply.extend_from_slice(MAGIC);
    reply.push(version);
    reply.push(status);
    reply.extend_from_slice(&(message.len() as u16).to_le_bytes());
    reply.extend_from_slice(message);
    reply
}

/// How the client side of a handshake failed. Both carry an `Unavailable` error naming the peer.
#[derive(Debug)]
pub(crate) enum ClientFailure {
    /// The connection broke or the bytes were not a tq reply: trying again may work.
    Lost(Error),
    /// The server answered and refused (version mismatch, token): trying again will not help.
    Refused(Error),
}

/// Runs the client side on a fresh stream. Returns the server's greeting (its name).
///
/// A version mismatch and a refused token say so in words and name `peer`.
pub(crate) async fn client<S>(
    stream: &mut S,
    token: Option<&str>,
    peer: &Endpoint,
) -> std::result::Result<String, ClientFailure>
where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let hello = client_hello(PROTOCOL_VERSION, token.unwrap_or("").as_bytes())
        .map_err(ClientFailure::Refused)?;
    let lost = |what: &str, e: std::io::Error| {
        ClientFailure::Lost(
            Error::unavailable(format!(
                "peer {peer}: connection lost during the handshake ({what}: {e}); is it a tq server?"
            ))
            .with_source(e),
        )
    };
    stream
        .write_all(&hello)
        .await
        .map_err(|e| lost("sending hello", e))?;
    stream.flush().await.map_err(|e| lost("sending hello", e))?;

    let mut head = [0u8; 9];
    stream
        .read_exact(&mut head)
        .await
        .map_err(|e| lost("reading reply", e))?;
    if &head[0..5] != MAGIC {
        return Err(ClientFailure::Refused(Error::unavailable(format!(
            "peer {peer} does not speak the tq protocol: {}",
            foreign_reply(&head)
        ))));
    }
    let version = head[5];
    let status = head[6];
    let len = u16::from_le_bytes([head[7], head[8]]) as usize;
    let mut message = vec![0u8; len];
    stream
        .read_exact(&mut message)
        .await
        .map_err(|e| lost("reading reply message", e))?;
    let message = String::from_utf8_lossy(&message).into_owned();
    // A refusal is final: retrying with the same token or version cannot succeed.
    let refused = |text: String| ClientFailure::Refused(Error::permission_denied(text));
    match status {
        STATUS_OK if version == PROTOCOL_VERSION => Ok(message),
        STATUS_OK | STATUS_VERSION_MISMATCH => Err(refused(format!(
            "peer {peer} speaks tq protocol version {version}, this build speaks {PROTOCOL_VERSION}{}",
            if message.is_empty() {
                String::new()
            } else {
                format!(" (server says: {message})")
            }
        ))),
        STATUS_UNAUTHORIZED => Err(refused(format!(
            "peer {peer}: unauthorized: token rejected ({message})"
        ))),
        other => Err(refused(format!(
            "peer {peer}: handshake refused with unknown status {other} ({message})"
        ))),
    }
}

/// What a reply that is not a tq handshake reply says about the server that sent it.
fn foreign_reply(head: &[u8]) -> String {
    let text = String::from_utf8_lossy(head);
    if head.starts_with(b"-ERR") || head.starts_with(b"-NOAUTH") || head.starts_with(b"+") {
        format!("it answered `{}…`, as a Redis server does: is this the address of Redis instead of a tq controller or storage unit?", text.trim_end())
    } else if head.starts_with(b"HTTP/") {
        format!("it answered `{}…`, as an HTTP server does: is this the address of a web or metrics endpoint instead of a tq server?", text.trim_end())
    } else {
        format!("its handshake reply starts with {head:02x?}, expected \"TQNET\"")
    }
}

/// Why the server did not accept a connection. Logged by the caller, which then closes it.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The peer closed without sending a byte (a port probe or health check): not worth a warning.
    Silent,
    /// Not a tq client (bad magic, bad token length) or the connection failed; no reply sent.
    Garbage(String),
    /// A tq client of another version; a status-1 reply was sent.
    VersionMismatch(u8),
    /// Missing or wrong token; a status-2 reply was sent.
    Unauthorized(&'static str),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Silent => f.write_str("closed by the peer before the handshake"),
            Refusal::Garbage(m) => write!(f, "not a tq handshake: {m}"),
            Refusal::VersionMismatch(v) => write!(
                f,
                "client speaks tq protocol version {v}, this server speaks {PROTOCOL_VERSION}"
            ),
            Refusal::Unauthorized(why) => write!(f, "unauthorized: {why}"),
        }
    }
}

/// Runs the server side. The caller bounds it with the handshake timeout.
///
/// `expected_token`: when set, the client must present exactly these bytes (compared in
/// constant time); when not, any token is accepted (loopback servers without access control).
pub(crate) async fn server<S>(
    stream: &mut S,
    expected_token: Option<&[u8]>,
    name: &str,
) -> std::result::Result<(), Refusal>
where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let garbage = |e: std::io::Error| Refusal::Garbage(format!("reading hello: {e}"));
    let mut head = [0u8; 6];
    match stream.read(&mut head).await {
        Ok(0) => return Err(Refusal::Silent),
        Ok(n) => stream.read_exact(&mut head[n..]).await.map_err(garbage)?,
        Err(e) => return Err(garbage(e)),
    };
    if &head[0..5] != MAGIC {
        return Err(Refusal::Garbage(format!(
            "hello starts with {:02x?}, expected \"TQNET\"",
            &head[0..5]
        )));
    }
    let version = head[5];
    if version != PROTOCOL_VERSION {
        // The rest of a foreign version's hello may be laid out differently: do not parse it.
        let text = format!(
            "this server speaks tq protocol version {PROTOCOL_VERSION}, the client speaks {version}"
        );
        refuse(stream, STATUS_VERSION_MISMATCH, &text).await;
        return Err(Refusal::VersionMismatch(version));
    }
    let mut line_break = [0u8; 2];
    stream.read_exact(&mut line_break).await.map_err(garbage)?;
    if &line_break != LINE_BREAK {
        return Err(Refusal::Garbage(format!(
            "hello has {line_break:02x?} after the version, expected \\r\\n"
        )));
    }
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await.map_err(garbage)?;
    let len = u16::from_le_bytes(len) as usize;
    if len > MAX_TOKEN_LEN {
        return Err(Refusal::Garbage(format!(
            "token length {len} exceeds the maximum {MAX_TOKEN_LEN}"
        )));
    }
    let mut token = vec![0u8; len];
    stream.read_exact(&mut token).await.map_err(garbage)?;

    if let Some(expected) = expected_token {
        let why = if token.is_empty() {
            Some("this server requires a token and none was presented")
        } else if !constant_time_eq(expected, &token) {
            Some("the presented token is wrong")
        } else {
            None
        };
        if let Some(why) = why {
            refuse(stream, STATUS_UNAUTHORIZED, why).await;
            return Err(Refusal::Unauthorized(why));
        }
    }
    let reply = server_reply(PROTOCOL_VERSION, STATUS_OK, name);
    stream
        .write_all(&reply)
        .await
        .map_err(|e| Refusal::Garbage(format!("sending the reply: {e}")))?;
    stream
        .flush()
        .await
        .map_err(|e| Refusal::Garbage(format!("sending the reply: {e}")))?;
    Ok(())
}

/// Sends a refusal, half-closes, and drains briefly so the client can read the reason.
async fn refuse<S>(stream: &mut S, status: u8, message: &str)
where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let reply = server_reply(PROTOCOL_VERSION, status, message);
    if stream.write_all(&reply).await.is_err() || stream.shutdown().await.is_err() {
        return;
    }
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut total = 0usize;
        // Bounded in bytes as well as time: a refused peer gets nothing but the reply.
        while total < (1 << 20) {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(REFUSAL_DRAIN, drain).await;
}

/// Compares `presented` with `expected` in time that depends only on `expected`'s length, so a
/// network peer cannot learn the token byte by byte from response times.
fn constant_time_eq(expected: &[u8], presented: &[u8]) -> bool {
    let mut diff = u8::from(expected.len() != presented.len());
    for (i, &e) in expected.iter().enumerate() {
        let p = presented.get(i).copied().unwrap_or(!e);
        diff |= e ^ p;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"secret", b"secre"));
        assert!(!constant_time_eq(b"secret", b""));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn hello_and_reply_layouts() {
        assert_eq!(
            client_hello(1, b"ab").expect("hello"),
            b"TQNET\x01\r\n\x02\x00ab".to_vec()
        );
        assert!(client_hello(1, &[0u8; MAX_TOKEN_LEN + 1]).is_err());
        assert_eq!(
            server_reply(1, 2, "no"),
            b"TQNET\x01\x02\x02\x00no".to_vec()
        );
    }
}
