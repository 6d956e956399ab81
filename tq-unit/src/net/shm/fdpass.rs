//! Messages with file descriptors over a Unix stream (`SCM_RIGHTS`), for the shared-memory
//! channel.
//!
//! A message is a 16-byte prefix (`TQSM`, descriptor count, header length, frame count), the
//! frames' lengths (u64 each), the header and the frames. Its descriptors travel with its first
//! bytes, so they are received while the prefix is read; a message that announces more
//! descriptors than arrived is refused.

use bytes::Bytes;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use tokio::io::Interest;
use tokio::net::UnixStream;

const MAGIC: &[u8; 4] = b"TQSM";
const PREFIX: usize = 16;
/// The kernel's limit of descriptors per message (`SCM_MAX_FD`).
pub(crate) const MAX_FDS: usize = 253;
const MAX_HEADER: usize = 64 << 20;
const MAX_FRAMES: usize = 1 << 20;
const MAX_BODY: u64 = 16 << 30;
const IOV_MAX: usize = 1024;

/// A received message.
pub(crate) struct Received {
    pub(crate) header: Bytes,
    pub(crate) frames: Vec<Bytes>,
    pub(crate) fds: Vec<OwnedFd>,
}

fn malformed(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Sends `header`, `frames` and `fds` as one message.
pub(crate) async fn send(
    stream: &UnixStream,
    header: &[u8],
    frames: &[Bytes],
    fds: &[RawFd],
) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(malformed(format!(
            "{} descriptors in one message",
            fds.len()
        )));
    }
    let mut head = Vec::with_capacity(PREFIX + 8 * frames.len() + header.len());
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&(fds.len() as u32).to_le_bytes());
    head.extend_from_slice(&(header.len() as u32).to_le_bytes());
    head.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    for f in frames {
        head.extend_from_slice(&(f.len() as u64).to_le_bytes());
    }
    head.extend_from_slice(header);
    let mut pieces: Vec<&[u8]> = Vec::with_capacity(1 + frames.len());
    pieces.push(&head);
    pieces.extend(frames.iter().filter(|f| !f.is_empty()).map(|f| &f[..]));
    let mut piece = 0;
    let mut within = 0;
    let mut fds_pending = fds;
    while piece < pieces.len() {
        let n = stream
            .async_io(Interest::WRITABLE, || {
                let mut iov: Vec<libc::iovec> = Vec::with_capacity(IOV_MAX.min(pieces.len()));
                for (i, p) in pieces[piece..].iter().take(IOV_MAX).enumerate() {
                    let skip = if i == 0 { within } else { 0 };
                    iov.push(libc::iovec {
                        iov_base: p[skip..].as_ptr() as *mut libc::c_void,
                        iov_len: p.len() - skip,
                    });
                }
                send_with_fds(stream.as_raw_fd(), &iov, fds_pending)
            })
            .await?;
        fds_pending = &[];
        let mut n = n;
        while n > 0 {
            let left = pieces[piece].len() - within;
            if n >= left {
                n -= left;
                piece += 1;
                within = 0;
            } else {
                within += n;
                n = 0;
            }
        }
    }
    Ok(())
}

fn send_with_fds(socket: RawFd, iov: &[libc::iovec], fds: &[RawFd]) -> io::Result<usize> {
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) } as usize;
    let mut control = vec![0u8; if fds.is_empty() { 0 } else { space }];
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cmsg) as *mut RawFd,
                fds.len(),
            );
        }
    }
    let n = unsafe { libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Receives into `buf`, taking any descriptors that arrive with the bytes. `Ok(0)`: the
/// peer closed.
fn recv_with_fds(socket: RawFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) };
    let mut control = vec![0u8; space as usize];
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    let n = unsafe { libc::recvmsg(socket, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(*data.add(i)));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(malformed(
            "descriptors were cut off (more than 253 in one message)".into(),
        ));
    }
    Ok(n as usize)
}

async fn read_exact(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<bool> {
    let mut at = 0;
    while at < buf.len() {
        let n = stream
            .async_io(Interest::READABLE, || {
                recv_with_fds(stream.as_raw_fd(), &mut buf[at..], fds)
            })
            .await?;
        if n == 0 {
            if at == 0 {
                return Ok(false);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed in the middle of a message",
            ));
        }
        at += n;
    }
    Ok(true)
}

/// The next message, `None` when the peer closed between messages.
pub(crate) async fn recv(stream: &UnixStream) -> io::Result<Option<Received>> {
    let mut fds = Vec::new();
    let mut prefix = [0u8; PREFIX];
    if !read_exact(stream, &mut prefix, &mut fds).await? {
        return Ok(None);
    }
    if &prefix[..4] != MAGIC {
        return Err(malformed("not a tq shared-memory message".into()));
    }
    let word =
        |i: usize| u32::from_le_bytes(prefix[i..i + 4].try_into().unwrap_or([0; 4])) as usize;
    let (fd_count, header_len, frame_count) = (word(4), word(8), word(12));
    if header_len > MAX_HEADER || frame_count > MAX_FRAMES || fd_count > MAX_FDS {
        return Err(malformed(format!(
            "message of {header_len} header bytes, {frame_count} frames, {fd_count} descriptors is over the limits"
        )));
    }
    let mut lens = vec![0u8; 8 * frame_count];
    read_exact_or_eof(stream, &mut lens, &mut fds).await?;
    let lens: Vec<u64> = lens
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    let body = lens.iter().try_fold(0u64, |a, l| a.checked_add(*l));
    let body = match body {
        Some(b) if b <= MAX_BODY => b as usize,
        _ => return Err(malformed("message body over 16 GiB".into())),
    };
    let mut rest = vec![0u8; header_len + body];
    read_exact_or_eof(stream, &mut rest, &mut fds).await?;
    if fds.len() != fd_count {
        return Err(malformed(format!(
            "message announced {fd_count} descriptors and carried {}",
            fds.len()
        )));
    }
    let rest = Bytes::from(rest);
    let header = rest.slice(..header_len);
    let mut at = header_len;
    let frames = lens
        .iter()
        .map(|l| {
            let f = rest.slice(at..at + *l as usize);
            at += *l as usize;
            f
        })
        .collect();
    Ok(Some(Received {
        header,
        frames,
        fds,
    }))
}

async fn read_exact_or_eof(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<()> {
    if buf.is_empty() || read_exact(stream, buf, fds).await? {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the peer closed in the middle of a message",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[tokio::test]
    async fn a_message_carries_its_frames_and_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut file = std::fs::File::from(unsafe {
            OwnedFd::from_raw_fd(libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC))
        });
        file.write_all(b"through the descriptor").unwrap();
        let big = Bytes::from(vec![7u8; 3 << 20]);
        let frames = vec![Bytes::from_static(b"one"), Bytes::new(), big.clone()];
        let sender = tokio::spawn(async move {
            send(&a, b"head", &frames, &[file.as_raw_fd()])
                .await
                .unwrap();
            send(&a, b"second", &[], &[]).await.unwrap();
            a
        });
        let got = recv(&b).await.unwrap().unwrap();
        assert_eq!(&got.header[..], b"head");
        assert_eq!(got.frames.len(), 3);
        assert_eq!(&got.frames[0][..], b"one");
        assert!(got.frames[1].is_empty());
        assert_eq!(got.frames[2], big);
        assert_eq!(got.fds.len(), 1);
        let mut received = std::fs::File::from(got.fds.into_iter().next().unwrap());
        received.rewind().unwrap();
        let mut text = String::new();
        received.read_to_string(&mut text).unwrap();
        assert_eq!(text, "through the descriptor");
        let second = recv(&b).await.unwrap().unwrap();
        assert_eq!(&second.header[..], b"second");
        assert!(second.fds.is_empty());
        drop(sender.await.unwrap());
        assert!(
            recv(&b).await.unwrap().is_none(),
            "a closed peer ends the stream"
        );
    }

    #[tokio::test]
    async fn garbage_is_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        a.try_write(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let err = recv(&b).await.err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
