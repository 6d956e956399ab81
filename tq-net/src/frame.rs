//! Messages on the wire: encoding, decoding, and the limits that are enforced before allocating.
//!
//! Layout of one message (all integers little-endian; see `docs/protocol.md`):
//!
//! ```text
//! offset  size  field
//! 0       8     request id (u64)
//! 8       1     kind: 0 request, 1 response, 2 error response
//! 9       3     zero
//! 12      4     header length (u32)
//! 16      4     frame count (u32)
//! 20      4     trace id (u32): the request id of the operation, for logs; 0 if none
//! 24      8*n   frame lengths (u64 each, n = frame count)
//! ...           header bytes
//! ...           frames, back to back
//! ```
//!
//! Reading never trusts a length before checking it against [`Limits`], and never allocates what
//! the peer merely claims: the length table and the body are read into a buffer whose capacity
//! grows (doubling) only as bytes actually arrive. The header and every frame of a received
//! message are `Bytes` slices of that one buffer, so payloads are not copied after the kernel
//! hands them over. Writing uses vectored writes straight from the message's `Bytes`, so payloads
//! are not copied on the way out either.

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::{self, IoSlice};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tq_core::{Error, Result};

/// Size of the fixed message prefix.
pub const PREFIX_LEN: usize = 24;

/// Most slices handed to one `write_vectored` call (Linux's `IOV_MAX`).
pub const MAX_IO_SLICES: usize = 1024;

/// First capacity of a receive buffer; it doubles from here as bytes arrive. Messages up to this
/// size are read with a single allocation, and a peer that claims a huge body and then sends
/// nothing costs at most this much.
const INITIAL_RECEIVE_CAPACITY: usize = 1 << 20;

/// Answers whose body is at most this large are read into one buffer of the process's
/// [`tq_core::buffer::BufferPool`] taken at once, instead of a growing `Vec` (see
/// [`BodyBuffer::Pooled`]). A peer that claims this much and then stalls holds at most this
/// per connection (a connection reads one message at a time).
pub(crate) const POOLED_BODY_MAX: usize = 16 << 20;

/// Where the body of a message that is not placed in the caller's buffers is read to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyBuffer {
    /// A fresh `Vec` grown as bytes arrive ([`read_growing`]). For requests: a storage unit
    /// keeps the cells of a put as slices of it, so it should be exactly as large as the
    /// message, and the pages it faults in are the stored data's own.
    Fresh,
    /// For answers whose frames the caller copies out and drops (a get of small cells is
    /// assembled into its columns): a buffer from the process's pool, warm memory recycled
    /// from the previous answer, when the body is between [`tq_core::buffer::POOL_MIN_BYTES`]
    /// and [`POOLED_BODY_MAX`]. A fresh `Vec` of a few MiB is new pages from the kernel every
    /// time, and faulting them in cost a tenth of a remote get's client time (profile in
    /// docs/benchmarks.md, "Where a remote request's time goes").
    Pooled,
}

/// Upper bounds on what a peer may send in one message, checked as soon as the prefix and the
/// frame-length table are read and before anything is allocated for the header or the body.
/// A message over a limit closes its connection (other connections are unaffected).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Largest header, in bytes. Default 64 MiB.
    pub max_header_bytes: usize,
    /// Most frames in one message. Default 2^20 (the length table is then at most 8 MiB).
    pub max_frames: usize,
    /// Largest sum of frame lengths (the header is limited separately). Default 16 GiB.
    pub max_body_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: 64 << 20,
            max_frames: 1 << 20,
            max_body_bytes: 16 << 30,
        }
    }
}

/// What a message is, from the prefix's kind byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageKind {
    /// A request (client → server).
    Request = 0,
    /// A successful answer (server → client).
    Response = 1,
    /// A failed answer: the header is a postcard-encoded [`WireError`](crate::WireError).
    Error = 2,
}

impl MessageKind {
    /// The kind for a wire byte, `None` for an unknown one.
    pub fn from_u8(byte: u8) -> Option<MessageKind> {
        match byte {
            0 => Some(MessageKind::Request),
            1 => Some(MessageKind::Response),
            2 => Some(MessageKind::Error),
            _ => None,
        }
    }
}

/// One message: an opaque header (callers put a postcard-encoded struct there) and any number of
/// raw payload frames that never pass through an encoder.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Message {
    /// Opaque to the transport; by convention a postcard-encoded struct (see [`Message::encode`]).
    pub header: Bytes,
    /// Raw payloads (tensor bytes, serialized objects). On receipt, slices of one buffer.
    pub frames: Vec<Bytes>,
}

impl Message {
    /// A message from a ready header and frames.
    pub fn new(header: Bytes, frames: Vec<Bytes>) -> Self {
        Message { header, frames }
    }

    /// A message whose header is `header` encoded with postcard.
    pub fn encode<T: Serialize>(header: &T, frames: Vec<Bytes>) -> Result<Message> {
        let bytes = postcard::to_allocvec(header).map_err(|e| {
            Error::invalid(format!(
                "cannot encode message header {}: {e}",
                std::any::type_name::<T>()
            ))
        })?;
        Ok(Message {
            header: Bytes::from(bytes),
            frames,
        })
    }

    /// The header decoded with postcard; `Corrupted` when the bytes are not a `T`.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        postcard::from_bytes(&self.header).map_err(|e| {
            Error::corrupted(format!(
                "cannot decode a {}-byte message header as {}: {e}",
                self.header.len(),
                std::any::type_name::<T>()
            ))
        })
    }

    /// Total length of the frames (what [`Limits::max_body_bytes`] bounds).
    pub fn body_len(&self) -> u64 {
        self.frames.iter().map(|f| f.len() as u64).sum()
    }
}

impl fmt::Debug for Message {
    // Payloads can be gigabytes: show sizes, not contents.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Message");
        d.field("header_len", &self.header.len());
        if self.frames.len() <= 16 {
            let lens: Vec<usize> = self.frames.iter().map(Bytes::len).collect();
            d.field("frame_lens", &lens);
        } else {
            d.field("frames", &self.frames.len());
            d.field("body_len", &self.body_len());
        }
        d.finish()
    }
}

/// Why a message could not be read. Every variant ends the connection it happened on.
#[derive(Debug)]
pub enum FrameError {
    /// The socket failed.
    Io(io::Error),
    /// The peer closed the connection in the middle of a message.
    Truncated {
        /// What was being read (`"prefix"`, `"frame-length table"`, `"body"`).
        part: &'static str,
        /// Bytes of that part expected.
        expected: u64,
        /// Bytes of that part received before the end of the stream.
        received: u64,
    },
    /// A length in the prefix or table is over the configured [`Limits`].
    LimitExceeded(String),
    /// The bytes do not follow the protocol (non-zero padding, unknown kind).
    Malformed(String),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Io(e) => write!(f, "i/o error: {e}"),
            FrameError::Truncated {
                part,
                expected,
                received,
            } => write!(
                f,
                "connection closed mid-message: got {received} of {expected} bytes of the {part}"
            ),
            FrameError::LimitExceeded(m) => write!(f, "limit exceeded: {m}"),
            FrameError::Malformed(m) => write!(f, "malformed message: {m}"),
        }
    }
}

impl std::error::Error for FrameError {}

impl From<io::Error> for FrameError {
    fn from(e: io::Error) -> Self {
        FrameError::Io(e)
    }
}

/// The parsed fixed prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    /// Matches a response to its request.
    pub request_id: u64,
    /// Raw kind byte (see [`MessageKind`]).
    pub kind: u8,
    /// Header length in bytes.
    pub header_len: u32,
    /// Number of frames (entries in the length table).
    pub frame_count: u32,
    /// The request id of the operation this message belongs to (see
    /// `tq_core::telemetry::with_trace_id`), so its log lines correlate across processes; 0 when
    /// the sender has none. Answers carry 0: the caller knows its own id.
    pub trace_id: u32,
}

impl Prefix {
    /// The 24 prefix bytes.
    pub fn to_bytes(&self) -> [u8; PREFIX_LEN] {
        let mut b = [0u8; PREFIX_LEN];
        b[0..8].copy_from_slice(&self.request_id.to_le_bytes());
        b[8] = self.kind;
        b[12..16].copy_from_slice(&self.header_len.to_le_bytes());
        b[16..20].copy_from_slice(&self.frame_count.to_le_bytes());
        b[20..24].copy_from_slice(&self.trace_id.to_le_bytes());
        b
    }

    /// Parses and checks the padding (must be zero: a non-zero value means garbage or a protocol
    /// extension this build does not know, and either way reading on would misinterpret the
    /// stream).
    pub fn parse(b: &[u8; PREFIX_LEN]) -> std::result::Result<Prefix, FrameError> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut id = [0u8; 8];
        id.copy_from_slice(&b[0..8]);
        if b[9..12] != [0, 0, 0] {
            return Err(FrameError::Malformed(format!(
                "non-zero padding bytes in the message prefix {b:02x?}"
            )));
        }
        Ok(Prefix {
            request_id: u64::from_le_bytes(id),
            kind: b[8],
            header_len: u32_at(12),
            frame_count: u32_at(16),
            trace_id: u32_at(20),
        })
    }
}

/// Reads exactly `buf.len()` bytes, or returns `Ok(false)` on a clean end of stream before the
/// first byte (a peer closing between messages is normal).
async fn read_prefix<R: AsyncRead + Unpin + ?Sized>(
    reader: &mut R,
    buf: &mut [u8; PREFIX_LEN],
) -> std::result::Result<bool, FrameError> {
    let mut got = 0;
    while got < PREFIX_LEN {
        let n = reader.read(&mut buf[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(false);
            }
            return Err(FrameError::Truncated {
                part: "prefix",
                expected: PREFIX_LEN as u64,
                received: got as u64,
            });
        }
        got += n;
    }
    Ok(true)
}

/// Reads one message. `Ok(None)` on a clean end of stream between messages.
///
/// Returns the request id, the kind and the message. The prefix is validated and the limits
/// checked before the length table is read, and again (body size) before the body is read.
/// Callers should pass a buffered reader: the prefix is read in small pieces.
pub async fn read_message<R: AsyncRead + Unpin + ?Sized>(
    reader: &mut R,
    limits: &Limits,
) -> std::result::Result<Option<(u64, MessageKind, Message)>, FrameError> {
    let Some(head) = read_head(reader, limits).await? else {
        return Ok(None);
    };
    let message = read_body(reader, &head, &mut [], BodyBuffer::Fresh).await?;
    Ok(Some((head.request_id, head.kind, message)))
}

/// [`read_message`], also returning the prefix's trace id (servers log a request under it).
pub(crate) async fn read_traced<R: AsyncRead + Unpin + ?Sized>(
    reader: &mut R,
    limits: &Limits,
) -> std::result::Result<Option<(u64, MessageKind, u32, Message)>, FrameError> {
    let Some(head) = read_head(reader, limits).await? else {
        return Ok(None);
    };
    let message = read_body(reader, &head, &mut [], BodyBuffer::Fresh).await?;
    Ok(Some((head.request_id, head.kind, head.trace_id, message)))
}

/// The part of a message before its header: who it answers, what it is and how long its parts
/// are, all checked against the [`Limits`].
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub(crate) request_id: u64,
    pub(crate) kind: MessageKind,
    pub(crate) trace_id: u32,
    header_len: usize,
    pub(crate) frame_lens: Vec<u64>,
}

/// Reads and checks the prefix and the frame-length table. `Ok(None)` on a clean end of stream
/// between messages.
pub(crate) async fn read_head<R: AsyncRead + Unpin + ?Sized>(
    reader: &mut R,
    limits: &Limits,
) -> std::result::Result<Option<Head>, FrameError> {
    let mut raw = [0u8; PREFIX_LEN];
    if !read_prefix(reader, &mut raw).await? {
        return Ok(None);
    }
    let prefix = Prefix::parse(&raw)?;
    let kind = MessageKind::from_u8(prefix.kind).ok_or_else(|| {
        FrameError::Malformed(format!(
            "unknown message kind {} (request id {})",
            prefix.kind, prefix.request_id
        ))
    })?;
    let header_len = prefix.header_len as usize;
    if header_len > limits.max_header_bytes {
        return Err(FrameError::LimitExceeded(format!(
            "header of {header_len} bytes exceeds max_header_bytes {}",
            limits.max_header_bytes
        )));
    }
    let frame_count = prefix.frame_count as usize;
    if frame_count > limits.max_frames {
        return Err(FrameError::LimitExceeded(format!(
            "{frame_count} frames exceed max_frames {}",
            limits.max_frames
        )));
    }

    let mut frame_lens = Vec::new();
    let mut body_len: u64 = 0;
    if frame_count > 0 {
        let table = read_growing(reader, frame_count * 8, "frame-length table").await?;
        frame_lens.reserve_exact(frame_count);
        for chunk in table.chunks_exact(8) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            let len = u64::from_le_bytes(b);
            body_len = body_len.checked_add(len).ok_or_else(|| {
                FrameError::LimitExceeded("frame lengths overflow u64".to_owned())
            })?;
            frame_lens.push(len);
        }
    }
    if body_len > limits.max_body_bytes {
        return Err(FrameError::LimitExceeded(format!(
            "body of {body_len} bytes exceeds max_body_bytes {}",
            limits.max_body_bytes
        )));
    }
    usize::try_from(body_len)
        .ok()
        .and_then(|b| b.checked_add(header_len))
        .ok_or_else(|| {
            FrameError::LimitExceeded(format!(
                "body of {body_len} bytes does not fit in this platform's address space"
            ))
        })?;
    Ok(Some(Head {
        request_id: prefix.request_id,
        kind,
        trace_id: prefix.trace_id,
        header_len,
        frame_lens,
    }))
}

/// Reads the header and frames that follow `head`.
///
/// `place[i]`, when present and exactly as long as frame `i`, receives that frame's bytes
/// straight from the socket (the caller's final buffer, so no copy follows); the frame is then
/// empty in the returned message and `place[i]` stays `Some`. A buffer of another length is
/// replaced by `None` and its frame read as usual. Everything else lands in one buffer whose
/// header and frames are `Bytes` slices of it, allocated as `body` says.
pub(crate) async fn read_body<R: AsyncRead + Unpin + ?Sized>(
    reader: &mut R,
    head: &Head,
    place: &mut [Option<BytesMut>],
    body: BodyBuffer,
) -> std::result::Result<Message, FrameError> {
    // A buffer that does not fit its frame exactly (or has no frame) comes back unused; from
    // here on, `Some` in `place` means "this frame goes there".
    for (i, p) in place.iter_mut().enumerate() {
        let fits = matches!(
            (p.as_ref(), head.frame_lens.get(i)),
            (Some(b), Some(&len)) if b.len() as u64 == len
        );
        if !fits {
            *p = None;
        }
    }
    if !place.iter().any(Option::is_some) {
        // Nothing is placed: one read of the whole body.
        let total = head.header_len + head.frame_lens.iter().sum::<u64>() as usize;
        let pooled = body == BodyBuffer::Pooled
            && (tq_core::buffer::POOL_MIN_BYTES..=POOLED_BODY_MAX).contains(&total);
        let buf = if total == 0 {
            Bytes::new()
        } else if pooled {
            let mut buf = tq_core::buffer::BufferPool::global().buffer(total);
            read_into(reader, &mut buf, "body").await?;
            buf.freeze()
        } else {
            Bytes::from(read_growing(reader, total, "body").await?)
        };
        let header = buf.slice(0..head.header_len);
        let mut frames = Vec::with_capacity(head.frame_lens.len());
        let mut at = head.header_len;
        for &len in &head.frame_lens {
            let end = at + len as usize;
            frames.push(buf.slice(at..end));
            at = end;
        }
        return Ok(Message { header, frames });
    }
    // Sums were checked in `read_head` to fit in usize.
    let own_total = head.header_len
        + head
            .frame_lens
            .iter()
            .enumerate()
            .filter(|&(i, _)| !place.get(i).is_some_and(Option::is_some))
            .map(|(_, &len)| len as usize)
            .sum::<usize>();

    // Some frames go to the caller's buffers: the rest is read piece by piece into `own`.
    let mut own: Vec<u8> = Vec::new();
    let mut spans = Vec::with_capacity(head.frame_lens.len());
    append_growing(reader, &mut own, head.header_len, own_total, "body").await?;
    for (i, &len) in head.frame_lens.iter().enumerate() {
        if let Some(Some(buf)) = place.get_mut(i) {
            read_into(reader, buf, "body").await?;
            spans.push(None);
        } else {
            let at = own.len();
            append_growing(reader, &mut own, len as usize, own_total, "body").await?;
            spans.push(Some(at..own.len()));
        }
    }
    let buf = Bytes::from(own);
    let header = buf.slice(0..head.header_len);
    let frames = spans
        .into_iter()
        .map(|s| s.map_or_else(Bytes::new, |r| buf.slice(r)))
        .collect();
    Ok(Message { header, frames })
}

/// Fills `buf` from `reader` (every byte of it, or a `Truncated` error naming `part`).
async fn read_into<R: AsyncRead + Unpin + ?Sized>(
    reader: &mut R,
    buf: &mut [u8],
    part: &'static str,
) -> std::result::Result<(), FrameError> {
    let mut got = 0;
    while got < buf.len() {
        let n = reader.read(&mut buf[got..]).await?;
        if n == 0 {
            return Err(FrameError::Truncated {
                part,
                expected: buf.len() as u64,
                received: got as u64,
            });
        }
        got += n;
    }
    Ok(())
}

/// Reads exactly `total` bytes into a new `Vec` whose capacity starts at `min(total, 1 MiB)` and
/// doubles only when the bytes received so far fill it, so memory follows what actually
/// arrived, never what the peer claimed. (Large reallocations are `mremap` under glibc, so the
/// doubling costs little.) The bytes land in uninitialized capacity: no zeroing pass.
async fn read_growing<R: AsyncRead + Unpin + ?Sized>(
    reader: &mut R,
    total: usize,
    part: &'static str,
) -> std::result::Result<Vec<u8>, FrameError> {
    let mut buf: Vec<u8> = Vec::new();
    append_growing(reader, &mut buf, total, total, part).await?;
    Ok(buf)
}

/// Appends exactly `n` bytes to `buf`, growing its capacity as in [`read_growing`] (never past
/// `limit`, the most this buffer will hold).
async fn append_growing<R: AsyncRead + Unpin + ?Sized>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    n: usize,
    limit: usize,
    part: &'static str,
) -> std::result::Result<(), FrameError> {
    let end = buf.len() + n;
    let start = buf.len();
    while buf.len() < end {
        if buf.len() == buf.capacity() {
            let target = buf
                .capacity()
                .saturating_mul(2)
                .max(INITIAL_RECEIVE_CAPACITY)
                .min(limit.max(end))
                .max(buf.len() + 1);
            buf.reserve_exact(target - buf.len());
        }
        let room = (buf.capacity() - buf.len()).min(end - buf.len());
        let got = (&mut *reader).take(room as u64).read_buf(buf).await?;
        if got == 0 {
            return Err(FrameError::Truncated {
                part,
                expected: n as u64,
                received: (buf.len() - start) as u64,
            });
        }
    }
    Ok(())
}

mod write;
pub use write::write_message;
pub(crate) use write::Encoded;

#[cfg(test)]
mod tests;
