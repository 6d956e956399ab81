//! The shared-memory channel: a unit server's Unix listener and the client's link to it.
//!
//! One request at a time per connection: the client sends a unit request (the same envelope as
//! over the network, plus descriptors), the unit answers with a status byte, the response
//! header, its frames and descriptors. A client keeps a few idle connections and opens more
//! for concurrent calls. Every connection starts with a hello carrying the secret of the offer,
//! which the client got over the unit's authenticated network endpoint.

use super::fdpass::{self, Received};
use super::segment::Segment;
use super::ShmOffer;
use crate::net::server::UnitServer;
use bytes::Bytes;
use std::os::fd::{OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Mutex, Weak};
use tokio::net::{UnixListener, UnixStream};
use tq_core::{Error, Result};
use tq_net::{Message, WireError};

const STATUS_OK: u8 = 0;
const STATUS_ERROR: u8 = 1;
const HELLO_OK: &[u8] = b"tq-shm ok";
/// Idle connections a link keeps for the next call.
const IDLE_CONNECTIONS: usize = 8;

/// A unit server's shared-memory listener; stops listening when dropped.
///
/// The socket is in Linux's abstract namespace (no file: nothing is left behind when the
/// process is killed); anyone in the network namespace can connect, which is why the hello
/// must carry the offer's secret.
pub(crate) struct ShmListener {
    offer: ShmOffer,
    task: tokio::task::AbortHandle,
}

impl ShmListener {
    /// Listens on a new abstract socket and serves `server` there. Must be called inside a
    /// Tokio runtime.
    pub(crate) fn start(server: Weak<UnitServer>, unit: &str) -> Result<ShmListener> {
        let secret = random_secret()?;
        let tag: String = unit
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(40)
            .collect();
        let nonce: String = secret[..4].iter().map(|b| format!("{b:02x}")).collect();
        let name = format!("tq-shm-{}-{tag}-{nonce}", std::process::id());
        let listener = bind_abstract(&name).map_err(|e| {
            Error::unavailable(format!(
                "storage unit `{unit}`: cannot listen for shared memory at @{name}: {e}"
            ))
        })?;
        raise_descriptor_limit();
        let path = format!("@{name}");
        let offer = ShmOffer {
            path: path.clone(),
            host: super::host_id(),
            secret: secret.clone(),
        };
        let unit_id = unit.to_owned();
        let task = tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(unit = %unit_id, error = %e, "shared-memory channel: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if server.strong_count() == 0 {
                    break;
                }
                let server = server.clone();
                let secret = secret.clone();
                let unit_id = unit_id.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve_channel(server, stream, &secret).await {
                        tracing::debug!(unit = %unit_id, error = %e, "shared-memory connection ended");
                    }
                });
            }
        })
        .abort_handle();
        tracing::info!(unit, path = %path, "offering shared memory to clients on this host");
        Ok(ShmListener { offer, task })
    }

    pub(crate) fn offer(&self) -> ShmOffer {
        self.offer.clone()
    }
}

impl Drop for ShmListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves one connection: the hello, then requests until the peer closes.
pub(crate) async fn serve_channel(
    server: Weak<UnitServer>,
    stream: UnixStream,
    secret: &[u8],
) -> std::io::Result<()> {
    let Some(hello) = fdpass::recv(&stream).await? else {
        return Ok(());
    };
    if hello.header[..] != *secret {
        let refusal = error_reply(&Error::permission_denied(
            "shared-memory channel: wrong secret (ask the unit's network endpoint for its offer)",
        ));
        fdpass::send(&stream, &refusal, &[], &[]).await?;
        return Ok(());
    }
    fdpass::send(&stream, HELLO_OK, &[], &[]).await?;
    while let Some(Received {
        header,
        frames,
        fds,
    }) = fdpass::recv(&stream).await?
    {
        let Some(server) = server.upgrade() else {
            return Ok(());
        };
        let answer = match fds
            .into_iter()
            .map(Segment::map)
            .collect::<Result<Vec<_>>>()
        {
            Ok(segments) => {
                server
                    .serve(Message::new(header, frames), Some(segments))
                    .await
            }
            Err(e) => Err(e),
        };
        drop(server);
        match answer {
            Ok((reply, segments)) => {
                let mut head = Vec::with_capacity(1 + reply.header.len());
                head.push(STATUS_OK);
                head.extend_from_slice(&reply.header);
                let fds: Vec<RawFd> = segments
                    .iter()
                    .map(|s| std::os::fd::AsRawFd::as_raw_fd(s.fd()))
                    .collect();
                fdpass::send(&stream, &head, &reply.frames, &fds).await?;
            }
            Err(e) => fdpass::send(&stream, &error_reply(&e), &[], &[]).await?,
        }
    }
    Ok(())
}

fn error_reply(e: &Error) -> Vec<u8> {
    let mut head = vec![STATUS_ERROR];
    if let Ok(m) = Message::encode(&WireError::from_error(e), Vec::new()) {
        head.extend_from_slice(&m.header);
    }
    head
}

/// An answer on the channel: the unit's response and its frames and descriptors, or the
/// error the unit answered.
pub(crate) type ShmAnswer = Result<(Message, Vec<OwnedFd>)>;

/// A client's link to one unit's shared-memory channel.
pub(crate) struct ShmLink {
    unit: String,
    path: PathBuf,
    secret: Vec<u8>,
    idle: Mutex<Vec<UnixStream>>,
}

impl ShmLink {
    /// Connects to `offer` if it is on this host; the error says why not.
    pub(crate) async fn connect(unit: &str, offer: ShmOffer) -> Result<ShmLink> {
        let here = super::host_id();
        if offer.host.is_empty() || offer.host != here {
            return Err(Error::unavailable(format!(
                "storage unit `{unit}` runs on another host (boot id {} here, {} there)",
                here, offer.host
            )));
        }
        let link = ShmLink {
            unit: unit.to_owned(),
            path: PathBuf::from(&offer.path),
            secret: offer.secret,
            idle: Mutex::new(Vec::new()),
        };
        let first = link.open().await?;
        link.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(first);
        Ok(link)
    }

    async fn open(&self) -> Result<UnixStream> {
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            Error::unavailable(format!(
                "storage unit `{}`: shared-memory channel {}: {what}: {e}",
                self.unit,
                self.path.display()
            ))
        };
        let stream = connect(&self.path).map_err(|e| fail("connect", &e))?;
        fdpass::send(&stream, &self.secret, &[], &[])
            .await
            .map_err(|e| fail("hello", &e))?;
        match fdpass::recv(&stream).await {
            Ok(Some(r)) if &r.header[..] == HELLO_OK => Ok(stream),
            Ok(Some(r)) => Err(decode_answer(r.header, r.frames)
                .err()
                .unwrap_or_else(|| fail("hello", &"unexpected answer"))),
            Ok(None) => Err(fail("hello", &"closed")),
            Err(e) => Err(fail("hello", &e)),
        }
    }

    /// Sends one request and waits at most `timeout` for its answer. The outer error is the
    /// channel's (the caller falls back to the network); the inner result is the unit's answer.
    pub(crate) async fn call(
        &self,
        request: Message,
        fds: &[RawFd],
        timeout: std::time::Duration,
    ) -> Result<ShmAnswer> {
        let stream = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let stream = match stream {
            Some(s) => s,
            None => self.open().await?,
        };
        let io = |e: std::io::Error| {
            Error::unavailable(format!(
                "storage unit `{}`: shared-memory channel {}: {e}",
                self.unit,
                self.path.display()
            ))
        };
        let exchange = async {
            fdpass::send(&stream, &request.header, &request.frames, fds).await?;
            fdpass::recv(&stream).await
        };
        // A unit that stops answering must not hang the caller: past the deadline the
        // connection is dropped (never reused) and the caller goes over the network.
        let reply = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| {
                io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {timeout:?}"),
                ))
            })?
            .map_err(io)?;
        let Some(reply) = reply else {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the unit closed the channel",
            )));
        };
        {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < IDLE_CONNECTIONS {
                idle.push(stream);
            }
        }
        Ok(decode_answer(reply.header, reply.frames).map(|m| (m, reply.fds)))
    }
}

fn decode_answer(header: Bytes, frames: Vec<Bytes>) -> Result<Message> {
    match header.first() {
        Some(&STATUS_OK) => Ok(Message::new(header.slice(1..), frames)),
        Some(&STATUS_ERROR) => Err(Message::new(header.slice(1..), Vec::new())
            .decode::<WireError>()
            .map(WireError::into_error)
            .unwrap_or_else(|e| e)),
        _ => Err(Error::corrupted("empty shared-memory answer")),
    }
}

fn bind_abstract(name: &str) -> std::io::Result<UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    listener.set_nonblocking(true)?;
    UnixListener::from_std(listener)
}

/// Connects to `path`: `@name` is an abstract socket, anything else a file. A local connect
/// completes at once, so the blocking call does not stall the runtime.
fn connect(path: &std::path::Path) -> std::io::Result<UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let text = path.to_string_lossy();
    let stream = match text.strip_prefix('@') {
        Some(name) => {
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            std::os::unix::net::UnixStream::connect_addr(&addr)?
        }
        None => std::os::unix::net::UnixStream::connect(path)?,
    };
    stream.set_nonblocking(true)?;
    UnixStream::from_std(stream)
}

fn random_secret() -> Result<Vec<u8>> {
    let mut secret = vec![0u8; 16];
    let n = unsafe { libc::getrandom(secret.as_mut_ptr() as *mut libc::c_void, 16, 0) };
    if n != 16 {
        return Err(Error::unavailable(format!(
            "no randomness for a shared-memory secret: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(secret)
}

/// A unit keeps one descriptor per segment that holds live cells: raise the soft limit to
/// the hard one, as servers do.
fn raise_descriptor_limit() {
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::net::wire::{UnitEnvelope, UnitRequest};
    use crate::MemoryUnit;
    use std::sync::Arc;
    use tq_core::{ErrorKind, SampleId};
    use tq_net::Handler;

    fn served() -> Arc<UnitServer> {
        let server = Arc::new(UnitServer::new(Arc::new(MemoryUnit::new("u"))));
        server.offer_shared_memory().unwrap();
        server
    }

    fn offer_of(server: &UnitServer) -> ShmOffer {
        server.shm_offer().expect("offered")
    }

    fn get_shared() -> Message {
        let req = UnitEnvelope {
            epoch: 0,
            registration: 0,
            request: UnitRequest::GetShared {
                fields: vec!["x".into()],
                samples: vec![SampleId::new(0, 0)],
            },
        };
        Message::encode(&req, Vec::new()).unwrap()
    }

    #[tokio::test]
    async fn a_wrong_secret_or_another_host_is_refused() {
        let server = served();
        let mut offer = offer_of(&server);
        offer.secret[0] ^= 1;
        let e = ShmLink::connect("u", offer).await.err().expect("refused");
        assert_eq!(e.kind(), &ErrorKind::PermissionDenied, "{e}");

        let mut offer = offer_of(&server);
        offer.host = "another-machine".into();
        let e = ShmLink::connect("u", offer).await.err().expect("refused");
        assert!(e.to_string().contains("another host"), "{e}");

        // The right offer connects, and a request on it gets the unit's answer.
        let link = ShmLink::connect("u", offer_of(&server)).await.unwrap();
        let answer = link
            .call(get_shared(), &[], std::time::Duration::from_secs(5))
            .await
            .expect("the channel works");
        let Err(e) = answer else {
            panic!("a get of nothing stored answered")
        };
        assert_eq!(e.kind(), &ErrorKind::NotFound, "{e}");
    }

    #[tokio::test]
    async fn shared_memory_requests_over_the_network_are_refused() {
        let server = served();
        let Err(e) = server.handle(get_shared()).await else {
            panic!("served over the network")
        };
        assert_eq!(e.kind(), &ErrorKind::Invalid, "{e}");
        assert!(e.to_string().contains("shared-memory channel"), "{e}");
    }

    #[tokio::test]
    async fn an_unsealed_descriptor_is_refused_without_touching_the_unit() {
        let server = served();
        let link = ShmLink::connect("u", offer_of(&server)).await.unwrap();
        // A memfd the sender could still write to.
        let name = c"tq-test-unsealed";
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        assert_eq!(
            unsafe { libc::ftruncate(std::os::fd::AsRawFd::as_raw_fd(&fd), 4096) },
            0
        );
        let answer = link
            .call(
                get_shared(),
                &[std::os::fd::AsRawFd::as_raw_fd(&fd)],
                std::time::Duration::from_secs(5),
            )
            .await
            .expect("the channel works");
        let Err(e) = answer else {
            panic!("an unsealed segment was accepted")
        };
        assert!(e.to_string().contains("seal"), "{e}");
    }
}
