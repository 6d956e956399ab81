//! The socket under a connection (TCP or Unix), and the [`Writer`] both sides write through.

use crate::frame::Encoded;
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, BufReader, ReadBuf};
use tokio::net::{tcp, unix, TcpStream, UnixStream};
use tokio::sync::{Notify, OwnedSemaphorePermit};

/// Read-buffer size per connection. Prefixes and small messages are read from it in few
/// syscalls; large bodies bypass it (tokio's `BufReader` reads big requests straight into the
/// destination), so it never costs a payload copy beyond its own size.
const READ_BUFFER: usize = 64 << 10;

/// Messages queued for one connection's writer task are written in batches of at most this many,
/// so that many small answers ready at once leave in one vectored write.
const WRITE_BATCH: usize = 64;

/// Most slices handed to one vectored write (Linux's `IOV_MAX`).
const MAX_IO_SLICES: usize = crate::frame::MAX_IO_SLICES;

pub(crate) type BoxRead = BufReader<Box<dyn AsyncRead + Send + Unpin>>;

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
    pub(crate) fn into_split(self) -> (BoxRead, WriteHalf) {
        let (r, w): (Box<dyn AsyncRead + Send + Unpin>, WriteHalf) = match self {
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), WriteHalf::Tcp(w))
            }
            Stream::Unix(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), WriteHalf::Unix(w))
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

/// The write half of a connection. Both families write without waiting through `&self`, so the
/// task that has a message ready can write it itself instead of handing it to another task.
/// Dropping it shuts the write direction down (the peer sees an orderly end of stream).
pub(crate) enum WriteHalf {
    Tcp(tcp::OwnedWriteHalf),
    Unix(unix::OwnedWriteHalf),
}

impl WriteHalf {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            WriteHalf::Tcp(w) => w.try_write_vectored(bufs),
            WriteHalf::Unix(w) => w.try_write_vectored(bufs),
        }
    }

    async fn writable(&self) -> io::Result<()> {
        match self {
            WriteHalf::Tcp(w) => w.writable().await,
            WriteHalf::Unix(w) => w.writable().await,
        }
    }
}

/// One message to write. The permit (server side) is released once the message has been written,
/// so a connection's in-flight bound also covers answers waiting to go out.
pub(crate) struct Outgoing {
    pub(crate) encoded: Encoded,
    /// Held, never read: dropping it (with the message) releases the slot.
    #[allow(dead_code)]
    pub(crate) permit: Option<OwnedSemaphorePermit>,
}

/// Who may write to the socket at the moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// Nobody: the next sender writes directly.
    Idle,
    /// A sender is writing its message directly; others queue behind it.
    Sender,
    /// The writer task is draining the queue; senders queue behind it.
    Task,
}

struct Lane {
    owner: Owner,
    /// Messages waiting for the writer task, in wire order.
    queue: VecDeque<Outgoing>,
    /// Bytes of `queue[0]` already written (a direct write the socket could not take whole).
    head_written: usize,
    /// Set when a write failed: nothing more is written, the writer task ends with this error.
    failed: Option<(io::ErrorKind, String)>,
    /// Set when no more messages will come: the writer task ends once everything is written.
    closing: bool,
}

/// Serializes all writes of one connection, so messages never interleave.
///
/// A small round trip is dominated by hand-offs between tasks (and, on a multi-thread runtime,
/// wake-ups of other threads), not by the bytes. So the sender of a message writes it itself,
/// with non-blocking vectored writes, whenever nobody else is writing: the common case of one
/// request or answer at a time costs one `writev` and no hand-off. Only what the socket does not
/// take at once (large messages, a slow peer) or what arrives while someone is writing goes to the
/// connection's writer task ([`Writer::run`]), which waits for the socket and writes the queue in
/// order, batching messages queued at the same moment into one vectored write.
///
/// Direct writes happen in a synchronous function, so a caller that gives up (deadline,
/// cancellation) can never leave half a message on the socket: a message is either written whole
/// by its sender or handed, with the count of bytes already written, to the writer task.
pub(crate) struct Writer {
    socket: WriteHalf,
    lane: Mutex<Lane>,
    wake: Notify,
}

/// The writer has stopped (a write failed or the connection is closing): nothing was written.
#[derive(Debug)]
pub(crate) struct WriterStopped;

impl Writer {
    pub(crate) fn new(socket: WriteHalf) -> Arc<Writer> {
        Arc::new(Writer {
            socket,
            lane: Mutex::new(Lane {
                owner: Owner::Idle,
                queue: VecDeque::new(),
                head_written: 0,
                failed: None,
                closing: false,
            }),
            wake: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Lane> {
        // Nothing panics while holding this lock; recover the state anyway.
        self.lane.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `out` now if the socket is free and takes it whole, otherwise queues it (after
    /// whatever part the socket took) for the writer task. Never waits.
    ///
    /// `Err` when the writer has stopped before this message: none of it was written. A write
    /// that fails here is reported by the writer task (which ends with the error); the message is
    /// then lost like any other queued one.
    pub(crate) fn send(&self, out: Outgoing) -> Result<(), WriterStopped> {
        {
            let mut lane = self.lock();
            if lane.failed.is_some() || lane.closing {
                return Err(WriterStopped);
            }
            if lane.owner != Owner::Idle {
                lane.queue.push_back(out);
                return Ok(());
            }
            lane.owner = Owner::Sender;
        }
        // We own the socket. Write outside the lock, so that concurrent senders only queue and
        // never wait for a syscall.
        let (result, done, written) = {
            let pieces = out.encoded.pieces_vec();
            let mut cursor = Cursor::new(&pieces, 0);
            let result = write_available(&self.socket, &mut cursor);
            (result, cursor.is_done(), cursor.consumed)
        };
        let mut lane = self.lock();
        match result {
            Ok(()) if done => {
                drop(out); // releases the permit
                if lane.queue.is_empty() {
                    lane.owner = Owner::Idle;
                    let closing = lane.closing;
                    drop(lane);
                    if closing {
                        // The writer task waits to see the writer idle before it ends.
                        self.wake.notify_one();
                    }
                    return Ok(());
                }
            }
            Ok(()) => {
                lane.queue.push_front(out);
                lane.head_written = written;
            }
            Err(e) => {
                lane.failed = Some((e.kind(), e.to_string()));
                lane.queue.clear();
            }
        }
        lane.owner = Owner::Task;
        drop(lane);
        self.wake.notify_one();
        Ok(())
    }

    /// No more messages: the writer task ends once what is queued is written.
    pub(crate) fn close(&self) {
        self.lock().closing = true;
        self.wake.notify_one();
    }

    /// The writer task: writes what senders hand over, waiting for the socket as needed. Ends
    /// with `Ok` after [`Writer::close`] once everything is written, or with the first write
    /// error (queued messages are then dropped, releasing their permits).
    pub(crate) async fn run(self: Arc<Self>) -> io::Result<()> {
        let mut batch: Vec<Outgoing> = Vec::with_capacity(WRITE_BATCH);
        loop {
            let skip = {
                let mut lane = self.lock();
                if let Some((kind, message)) = &lane.failed {
                    return Err(io::Error::new(*kind, message.clone()));
                }
                if lane.owner == Owner::Task && lane.queue.is_empty() {
                    lane.owner = Owner::Idle;
                }
                match lane.owner {
                    Owner::Task => {
                        let n = lane.queue.len().min(WRITE_BATCH);
                        batch.extend(lane.queue.drain(..n));
                        Some(std::mem::take(&mut lane.head_written))
                    }
                    Owner::Idle if lane.closing => return Ok(()),
                    Owner::Idle | Owner::Sender => None,
                }
            };
            let Some(skip) = skip else {
                // Notify keeps one wake-up for a waiter that is not there yet, so a hand-off
                // between the check above and this wait is not lost.
                self.wake.notified().await;
                continue;
            };
            if let Err(e) = self.write_batch(&batch, skip).await {
                let mut lane = self.lock();
                lane.failed = Some((e.kind(), e.to_string()));
                lane.queue.clear();
                return Err(e);
            }
            batch.clear(); // releases the permits
        }
    }

    /// Writes `batch` (the first message from `skip` bytes in), waiting for the socket.
    async fn write_batch(&self, batch: &[Outgoing], skip: usize) -> io::Result<()> {
        let mut pieces: Vec<&[u8]> = Vec::new();
        for out in batch {
            out.encoded.pieces(&mut pieces);
        }
        let mut cursor = Cursor::new(&pieces, skip);
        loop {
            write_available(&self.socket, &mut cursor)?;
            if cursor.is_done() {
                return Ok(());
            }
            self.socket.writable().await?;
        }
    }
}

/// Position in a list of byte slices being written in order.
struct Cursor<'a> {
    pieces: &'a [&'a [u8]],
    /// First piece not fully written.
    index: usize,
    /// Bytes of `pieces[index]` already written.
    offset: usize,
    /// Bytes written through this cursor (including the initial skip).
    consumed: usize,
}

impl<'a> Cursor<'a> {
    fn new(pieces: &'a [&'a [u8]], skip: usize) -> Cursor<'a> {
        let mut cursor = Cursor {
            pieces,
            index: 0,
            offset: 0,
            consumed: 0,
        };
        cursor.advance(skip);
        cursor
    }

    fn advance(&mut self, mut n: usize) {
        self.consumed += n;
        while self.index < self.pieces.len() {
            let left = self.pieces[self.index].len() - self.offset;
            if n < left {
                self.offset += n;
                return;
            }
            n -= left;
            self.index += 1;
            self.offset = 0;
        }
    }

    fn is_done(&self) -> bool {
        self.index == self.pieces.len()
    }

    /// The slices still to write (at most [`MAX_IO_SLICES`]).
    fn fill(&self, slices: &mut Vec<IoSlice<'a>>) {
        let pieces: &'a [&'a [u8]] = self.pieces;
        slices.clear();
        let mut rest = pieces[self.index..].iter();
        if let Some(first) = rest.next() {
            slices.push(IoSlice::new(&first[self.offset..]));
        }
        slices.extend(rest.take(MAX_IO_SLICES - 1).map(|p| IoSlice::new(p)));
    }
}

/// Writes from `cursor` until everything is written or the socket would block (the cursor then
/// says how far it got). Never waits.
fn write_available<'a>(socket: &WriteHalf, cursor: &mut Cursor<'a>) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'a>> = Vec::new();
    while !cursor.is_done() {
        cursor.fill(&mut slices);
        let written = match socket.try_write_vectored(&slices) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "socket accepted no bytes",
                ))
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        cursor.advance(written);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{read_message, Limits, Message, MessageKind};
    use bytes::Bytes;

    const SENDERS: u64 = 8;
    const PER_SENDER: u64 = 20;

    fn message(id: u64) -> Message {
        let len = ((id * 7919) % (1 << 20)) as usize;
        Message::new(
            Bytes::from(id.to_le_bytes().to_vec()),
            vec![Bytes::from(vec![(id % 251) as u8; len])],
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_senders_never_interleave_and_partial_writes_are_finished_in_order() {
        let (a, b) = UnixStream::pair().expect("socket pair");
        let (_read_a, write_a) = Stream::Unix(a).into_split();
        let (mut read_b, _write_b) = Stream::Unix(b).into_split();
        let writer = Writer::new(write_a);
        let task = tokio::spawn(writer.clone().run());
        // Messages of up to 1 MiB against a socket buffer far smaller: most direct writes are
        // partial and finished by the writer task while other senders queue behind it.
        let mut senders = Vec::new();
        for s in 0..SENDERS {
            let writer = writer.clone();
            senders.push(tokio::spawn(async move {
                for i in 0..PER_SENDER {
                    let id = s * 1000 + i;
                    let encoded =
                        Encoded::new(id, MessageKind::Request, message(id), None).expect("encode");
                    writer
                        .send(Outgoing {
                            encoded,
                            permit: None,
                        })
                        .expect("writer running");
                    tokio::task::yield_now().await;
                }
            }));
        }
        let mut next = vec![0u64; SENDERS as usize];
        for _ in 0..SENDERS * PER_SENDER {
            let (id, kind, got) = read_message(&mut read_b, &Limits::default())
                .await
                .expect("read")
                .expect("message");
            assert_eq!(kind, MessageKind::Request);
            assert_eq!(got, message(id), "message {id} arrived whole");
            let (s, i) = ((id / 1000) as usize, id % 1000);
            assert_eq!(
                i, next[s],
                "messages of sender {s} arrive in the order sent"
            );
            next[s] += 1;
        }
        for s in senders {
            s.await.expect("sender");
        }
        writer.close();
        assert!(writer
            .send(Outgoing {
                encoded: Encoded::new(0, MessageKind::Request, Message::default(), None)
                    .expect("encode"),
                permit: None,
            })
            .is_err());
        task.await.expect("task").expect("writer task ends cleanly");
        drop(writer);
        // The last handle is gone: the write direction is shut down.
        assert!(read_message(&mut read_b, &Limits::default())
            .await
            .expect("end of stream")
            .is_none());
    }
}
