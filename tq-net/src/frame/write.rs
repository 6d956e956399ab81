//! Writing messages: the prefix and length table encoded once ([`Encoded`]), the payloads
//! written from the caller's `Bytes` with vectored writes (not copied).

use super::*;

/// A message ready to be written: prefix and length table encoded, payloads still the caller's
/// `Bytes` (not copied).
#[derive(Debug)]
pub(crate) struct Encoded {
    meta: Vec<u8>,
    header: Bytes,
    frames: Vec<Bytes>,
}

impl Encoded {
    /// Encodes the prefix and length table of `message`. With `limits`, refuses a message the
    /// peer would refuse (so the caller gets a clear `Invalid` error instead of a dropped
    /// connection); without, only checks what the format itself cannot represent.
    pub(crate) fn new(
        request_id: u64,
        kind: MessageKind,
        message: Message,
        limits: Option<&Limits>,
    ) -> Result<Encoded> {
        let header_len = u32::try_from(message.header.len()).map_err(|_| {
            Error::invalid(format!(
                "message header of {} bytes exceeds the protocol maximum of 4 GiB",
                message.header.len()
            ))
        })?;
        let frame_count = u32::try_from(message.frames.len()).map_err(|_| {
            Error::invalid(format!(
                "{} frames exceed the protocol maximum of 2^32 - 1",
                message.frames.len()
            ))
        })?;
        if let Some(limits) = limits {
            if message.header.len() > limits.max_header_bytes {
                return Err(Error::invalid(format!(
                    "message header of {} bytes exceeds max_header_bytes {}",
                    message.header.len(),
                    limits.max_header_bytes
                )));
            }
            if message.frames.len() > limits.max_frames {
                return Err(Error::invalid(format!(
                    "message of {} frames exceeds max_frames {}",
                    message.frames.len(),
                    limits.max_frames
                )));
            }
            let body = message.body_len();
            if body > limits.max_body_bytes {
                return Err(Error::invalid(format!(
                    "message body of {body} bytes exceeds max_body_bytes {}",
                    limits.max_body_bytes
                )));
            }
        }
        let prefix = Prefix {
            request_id,
            kind: kind as u8,
            header_len,
            frame_count,
            trace_id: 0,
        };
        let mut meta = Vec::with_capacity(PREFIX_LEN + 8 * message.frames.len());
        meta.extend_from_slice(&prefix.to_bytes());
        for frame in &message.frames {
            meta.extend_from_slice(&(frame.len() as u64).to_le_bytes());
        }
        Ok(Encoded {
            meta,
            header: message.header,
            frames: message.frames,
        })
    }

    /// A frameless message whose header is known to be small (an error response).
    pub(crate) fn small(request_id: u64, kind: MessageKind, header: Bytes) -> Encoded {
        let prefix = Prefix {
            request_id,
            kind: kind as u8,
            header_len: u32::try_from(header.len()).unwrap_or(u32::MAX),
            frame_count: 0,
            trace_id: 0,
        };
        Encoded {
            meta: prefix.to_bytes().to_vec(),
            header,
            frames: Vec::new(),
        }
    }

    /// The same message carrying request id `trace_id` in its prefix.
    pub(crate) fn with_trace(mut self, trace_id: u32) -> Encoded {
        self.meta[20..24].copy_from_slice(&trace_id.to_le_bytes());
        self
    }

    /// This message's non-empty pieces, in wire order.
    pub(crate) fn pieces_vec(&self) -> Vec<&[u8]> {
        let mut out = Vec::with_capacity(2 + self.frames.len());
        self.pieces(&mut out);
        out
    }

    /// Appends this message's non-empty pieces, in wire order.
    pub(crate) fn pieces<'a>(&'a self, out: &mut Vec<&'a [u8]>) {
        out.push(&self.meta);
        if !self.header.is_empty() {
            out.push(&self.header);
        }
        out.extend(self.frames.iter().filter(|f| !f.is_empty()).map(|f| &f[..]));
    }
}

/// Writes `messages` back to back with vectored writes, at most [`MAX_IO_SLICES`] slices per
/// call, resuming after partial writes. Payload bytes go from their `Bytes` to the kernel.
pub(crate) async fn write_encoded<W: AsyncWrite + Unpin + ?Sized>(
    writer: &mut W,
    messages: &[Encoded],
) -> io::Result<()> {
    let mut pieces: Vec<&[u8]> = Vec::new();
    for m in messages {
        m.pieces(&mut pieces);
    }
    write_all_vectored(writer, &pieces).await?;
    writer.flush().await
}

/// Writes every byte of `pieces` in order using `write_vectored`.
async fn write_all_vectored<W: AsyncWrite + Unpin + ?Sized>(
    writer: &mut W,
    pieces: &[&[u8]],
) -> io::Result<()> {
    let mut index = 0; // first piece not fully written
    let mut offset = 0; // bytes of pieces[index] already written
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(pieces.len().min(MAX_IO_SLICES));
    loop {
        while index < pieces.len() && offset == pieces[index].len() {
            index += 1;
            offset = 0;
        }
        if index == pieces.len() {
            return Ok(());
        }
        slices.clear();
        slices.push(IoSlice::new(&pieces[index][offset..]));
        slices.extend(
            pieces[index + 1..]
                .iter()
                .take(MAX_IO_SLICES - 1)
                .map(|p| IoSlice::new(p)),
        );
        let mut written = writer.write_vectored(&slices).await?;
        if written == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "socket accepted no bytes",
            ));
        }
        while written > 0 {
            let left = pieces[index].len() - offset;
            if written >= left {
                written -= left;
                index += 1;
                offset = 0;
            } else {
                offset += written;
                written = 0;
            }
        }
    }
}

/// Writes one message (prefix, length table, header, frames) with vectored writes.
///
/// For tools and tests that drive a raw stream; servers and the pool write through their own
/// per-connection writer task.
pub async fn write_message<W: AsyncWrite + Unpin + ?Sized>(
    writer: &mut W,
    request_id: u64,
    kind: MessageKind,
    message: Message,
) -> Result<()> {
    let encoded = Encoded::new(request_id, kind, message, None)?;
    write_encoded(writer, std::slice::from_ref(&encoded))
        .await
        .map_err(|e| Error::unavailable(format!("writing a message failed: {e}")).with_source(e))
}
