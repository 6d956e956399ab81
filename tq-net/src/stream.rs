//! The socket under a connection (TCP or Unix), and the writer task both sides use.

use crate::frame::{write_encoded, Encoded};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// Read-buffer size per connection. Prefixes and small messages are read from it in few
/// syscalls; large bodies bypass it (tokio's `BufReader` reads big requests straight into the
/// destination), so it never costs a payload copy beyond its own size.
const READ_BUFFER: usize = 64 << 10;

/// Messages queued for one connection's writer are written in batches of at most this many, so
/// that many small answers ready at once leave in one vectored write.
const WRITE_BATCH: usize = 64;

pub(crate) type BoxRead = BufReader<Box<dyn AsyncRead + Send + Unpin>>;
pub(crate) type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// A connected socket of either family.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// Wraps a TCP socket, turning Nagle's algorithm off: requests and answers are complete
    /// messages written at once, and waiting to coalesce them only adds latency.
    pub(crate) fn tcp(stream: TcpStream) -> io::Result<Stream> {
        stream.set_nodelay(true)?;
        Ok(Stream::Tcp(stream))
    }

    /// Splits into a buffered read half and a write half that can live in different tasks.
    pub(crate) fn into_split(self) -> (BoxRead, BoxWrite) {
        let (r, w): (Box<dyn AsyncRead + Send + Unpin>, BoxWrite) = match self {
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            Stream::Unix(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
        };
        (BufReader::with_capacity(READ_BUFFER, r), w)
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// One message for a connection's writer task. The permit (server side) is released once the
/// message has been written, so a connection's in-flight bound also covers answers waiting to go
/// out.
pub(crate) struct Outgoing {
    pub(crate) encoded: Encoded,
    pub(crate) permit: Option<OwnedSemaphorePermit>,
}

/// Writes queued messages until every sender is gone (then half-closes) or a write fails.
///
/// All writes of a connection go through this one task, so messages never interleave, and a
/// caller that gives up (timeout, cancellation) can never leave half a message on the socket.
pub(crate) async fn writer_loop(
    mut writer: BoxWrite,
    mut queue: mpsc::UnboundedReceiver<Outgoing>,
) -> io::Result<()> {
    let mut batch: Vec<Encoded> = Vec::with_capacity(WRITE_BATCH);
    let mut permits: Vec<OwnedSemaphorePermit> = Vec::new();
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        while let Some(o) = next.take() {
            batch.push(o.encoded);
            permits.extend(o.permit);
            if batch.len() < WRITE_BATCH {
                next = queue.try_recv().ok();
            }
        }
        write_encoded(&mut writer, &batch).await?;
        batch.clear();
        permits.clear();
    }
    // Best effort: the peer sees an orderly end of stream.
    let _ = writer.shutdown().await;
    Ok(())
}
