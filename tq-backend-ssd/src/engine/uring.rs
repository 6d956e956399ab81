//! The io_uring engine: one ring on a dedicated thread.
//!
//! Requests are queued to the thread. For each request it keeps up to [`QUEUE_DEPTH`]
//! operations in flight: it opens a file, submits its read or write, and as completions arrive
//! closes finished files, resubmits the rest of short transfers and submits the next
//! operations. Opening and closing files are ordinary syscalls on the ring thread.

use super::{IoEngine, ReadBuf, ReadOp, WriteOp};
use async_trait::async_trait;
use bytes::Bytes;
use io_uring::{opcode, types, IoUring};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{mpsc, Mutex};
use std::thread::JoinHandle;
use tokio::sync::oneshot;

/// Operations in flight per request.
const QUEUE_DEPTH: usize = 32;
/// Submission queue entries of the ring.
const RING_ENTRIES: u32 = 64;
/// Largest transfer of one submission (a longer transfer continues in the next one).
const MAX_CHUNK: usize = 1 << 30;

/// Creates a small ring to learn whether the kernel (and any seccomp policy) allows io_uring.
pub(crate) fn probe() -> io::Result<()> {
    IoUring::new(4).map(drop)
}

enum Job {
    Write(Vec<WriteOp>, oneshot::Sender<Vec<io::Result<()>>>),
    Read(Vec<ReadOp>, oneshot::Sender<Vec<io::Result<Bytes>>>),
}

/// io_uring on a dedicated thread (see the module docs).
pub struct UringEngine {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEngine").finish_non_exhaustive()
    }
}

impl UringEngine {
    /// Creates the ring and starts its thread. Fails where io_uring is not allowed.
    pub fn new() -> io::Result<Self> {
        let ring = IoUring::new(RING_ENTRIES)?;
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("tq-ssd-uring".into())
            .spawn(move || ring_thread(ring, rx))?;
        Ok(UringEngine {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    fn send(&self, job: Job) -> bool {
        let guard = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        guard.as_ref().is_some_and(|tx| tx.send(job).is_ok())
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it has finished the queued requests.
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

fn stopped() -> io::Error {
    io::Error::other("the io_uring thread has stopped")
}

#[async_trait]
impl IoEngine for UringEngine {
    fn name(&self) -> &'static str {
        "uring"
    }

    async fn write_files(&self, ops: Vec<WriteOp>) -> Vec<io::Result<()>> {
        let n = ops.len();
        if n == 0 {
            return Vec::new();
        }
        let (reply, rx) = oneshot::channel();
        if !self.send(Job::Write(ops, reply)) {
            return (0..n).map(|_| Err(stopped())).collect();
        }
        rx.await
            .unwrap_or_else(|_| (0..n).map(|_| Err(stopped())).collect())
    }

    async fn read_files(&self, ops: Vec<ReadOp>) -> Vec<io::Result<Bytes>> {
        let n = ops.len();
        if n == 0 {
            return Vec::new();
        }
        let (reply, rx) = oneshot::channel();
        if !self.send(Job::Read(ops, reply)) {
            return (0..n).map(|_| Err(stopped())).collect();
        }
        rx.await
            .unwrap_or_else(|_| (0..n).map(|_| Err(stopped())).collect())
    }
}

fn ring_thread(mut ring: IoUring, rx: mpsc::Receiver<Job>) {
    let mut broken: Option<String> = None;
    while let Ok(job) = rx.recv() {
        match job {
            Job::Write(ops, reply) => {
                let out = match &broken {
                    Some(why) => ops
                        .iter()
                        .map(|_| Err(io::Error::other(why.clone())))
                        .collect(),
                    None => run_batch(&mut ring, &mut WriteBatch { ops: &ops }, &mut broken),
                };
                let _ = reply.send(out);
            }
            Job::Read(ops, reply) => {
                let out = match &broken {
                    Some(why) => ops
                        .iter()
                        .map(|_| Err(io::Error::other(why.clone())))
                        .collect(),
                    None => {
                        let mut batch = ReadBatch {
                            ops: &ops,
                            bufs: (0..ops.len()).map(|_| None).collect(),
                        };
                        let status = run_batch(&mut ring, &mut batch, &mut broken);
                        status
                            .into_iter()
                            .zip(batch.bufs)
                            .map(|(st, buf)| {
                                // SAFETY: an Ok status means every byte was read.
                                st.and_then(|()| {
                                    buf.map(|b| unsafe { b.assume_filled() })
                                        .ok_or_else(stopped)
                                })
                            })
                            .collect()
                    }
                };
                let _ = reply.send(out);
            }
        }
    }
}

/// One kind of batch: how to open an operation's file and where its bytes are.
trait Batch {
    const WRITE: bool;
    fn len(&self) -> usize;
    /// Opens op `i`'s file and returns it with the address and length of its bytes.
    fn open(&mut self, i: usize) -> io::Result<(File, *mut u8, usize)>;
    /// Gives up on op `i` without freeing memory the kernel may still use.
    fn leak(&mut self, i: usize);
}

struct WriteBatch<'a> {
    ops: &'a [WriteOp],
}

impl Batch for WriteBatch<'_> {
    const WRITE: bool = true;
    fn len(&self) -> usize {
        self.ops.len()
    }
    fn open(&mut self, i: usize) -> io::Result<(File, *mut u8, usize)> {
        let op = &self.ops[i];
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&op.path)?;
        Ok((file, op.data.as_ptr() as *mut u8, op.data.len()))
    }
    fn leak(&mut self, i: usize) {
        std::mem::forget(self.ops[i].data.clone());
    }
}

struct ReadBatch<'a> {
    ops: &'a [ReadOp],
    bufs: Vec<Option<ReadBuf>>,
}

impl Batch for ReadBatch<'_> {
    const WRITE: bool = false;
    fn len(&self) -> usize {
        self.ops.len()
    }
    fn open(&mut self, i: usize) -> io::Result<(File, *mut u8, usize)> {
        let op = &self.ops[i];
        let file = File::open(&op.path)?;
        let buf = self.bufs[i].insert(ReadBuf::new(op.len)?);
        Ok((file, buf.as_mut_ptr(), buf.len()))
    }
    fn leak(&mut self, i: usize) {
        if let Some(b) = self.bufs[i].take() {
            std::mem::forget(b);
        }
    }
}

/// An operation in flight.
struct Slot {
    op: usize,
    file: File,
    ptr: *mut u8,
    len: usize,
    done: usize,
}

fn sqe_for<B: Batch>(slot: &Slot, key: usize) -> io_uring::squeue::Entry {
    let n = (slot.len - slot.done).min(MAX_CHUNK) as u32;
    let fd = types::Fd(slot.file.as_raw_fd());
    // SAFETY (of the pointer arithmetic): done < len, inside the op's buffer.
    let ptr = unsafe { slot.ptr.add(slot.done) };
    let entry = if B::WRITE {
        // Buffered writes would otherwise complete inline on this one ring thread, copying
        // every byte into the page cache on a single core; ASYNC hands them to the kernel's
        // io-wq workers, which copy in parallel (psync gets the same from blocking threads).
        opcode::Write::new(fd, ptr, n)
            .offset(slot.done as u64)
            .build()
            .flags(io_uring::squeue::Flags::ASYNC)
    } else {
        opcode::Read::new(fd, ptr, n)
            .offset(slot.done as u64)
            .build()
    };
    entry.user_data(key as u64)
}

/// Runs every op of `batch` with up to [`QUEUE_DEPTH`] in flight. Returns one status per op.
/// On a ring failure the ring is marked broken (`broken`) and the memory of ops still in
/// flight is leaked rather than freed under the kernel.
fn run_batch<B: Batch>(
    ring: &mut IoUring,
    batch: &mut B,
    broken: &mut Option<String>,
) -> Vec<io::Result<()>> {
    let n = batch.len();
    let mut status: Vec<Option<io::Result<()>>> = (0..n).map(|_| None).collect();
    let mut slots: Vec<Option<Slot>> = (0..QUEUE_DEPTH).map(|_| None).collect();
    let mut free: Vec<usize> = (0..QUEUE_DEPTH).rev().collect();
    let mut in_flight = 0usize;
    let mut next = 0usize;
    loop {
        // Fill the queue.
        while next < n && !free.is_empty() {
            let i = next;
            next += 1;
            match batch.open(i) {
                Err(e) => status[i] = Some(Err(e)),
                Ok((_, _, 0)) => status[i] = Some(Ok(())),
                Ok((file, ptr, len)) => {
                    #[allow(clippy::expect_used)] // the loop runs only while slots are free
                    let key = free.pop().expect("checked non-empty");
                    let slot = Slot {
                        op: i,
                        file,
                        ptr,
                        len,
                        done: 0,
                    };
                    let sqe = sqe_for::<B>(&slot, key);
                    slots[key] = Some(slot);
                    // SAFETY: the buffer outlives the operation: it belongs to the batch, which
                    // is only dropped after every slot completed (or is leaked on failure).
                    if unsafe { ring.submission().push(&sqe) }.is_err() {
                        // Cannot happen: the ring has more entries than the queue depth.
                        slots[key] = None;
                        free.push(key);
                        status[i] = Some(Err(io::Error::other("io_uring submission queue full")));
                        continue;
                    }
                    in_flight += 1;
                }
            }
        }
        if in_flight == 0 {
            break;
        }
        if let Err(e) = submit_and_wait(ring) {
            let why = format!("io_uring failed: {e}");
            tracing::error!(error = %e, "io_uring submission failed; the engine stops serving");
            for slot in slots.iter_mut().filter_map(Option::take) {
                batch.leak(slot.op);
                status[slot.op] = Some(Err(io::Error::other(why.clone())));
            }
            *broken = Some(why);
            break;
        }
        let completions: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (key, res) in completions {
            let Some(mut slot) = slots[key].take() else {
                continue;
            };
            let outcome = if res < 0 {
                Some(Err(io::Error::from_raw_os_error(-res)))
            } else if res == 0 {
                Some(Err(if B::WRITE {
                    io::Error::new(io::ErrorKind::WriteZero, "write made no progress")
                } else {
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("file ends after {} of {} bytes", slot.done, slot.len),
                    )
                }))
            } else {
                slot.done += res as usize;
                (slot.done >= slot.len).then_some(Ok(()))
            };
            match outcome {
                Some(result) => {
                    status[slot.op] = Some(result);
                    in_flight -= 1;
                    free.push(key);
                    // The file is closed here.
                }
                None => {
                    // Short transfer: continue where it stopped.
                    let sqe = sqe_for::<B>(&slot, key);
                    slots[key] = Some(slot);
                    // SAFETY: as above.
                    if unsafe { ring.submission().push(&sqe) }.is_err() {
                        #[allow(clippy::expect_used)] // stored into this slot just above
                        let slot = slots[key].take().expect("just stored");
                        status[slot.op] =
                            Some(Err(io::Error::other("io_uring submission queue full")));
                        in_flight -= 1;
                        free.push(key);
                    }
                }
            }
        }
    }
    status
        .into_iter()
        .map(|s| s.unwrap_or_else(|| Err(io::Error::other("operation not run"))))
        .collect()
}

fn submit_and_wait(ring: &mut IoUring) -> io::Result<()> {
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => return Ok(()),
            Err(e)
                if e.kind() == io::ErrorKind::Interrupted
                    || e.raw_os_error() == Some(libc::EAGAIN)
                    || e.raw_os_error() == Some(libc::EBUSY) =>
            {
                // EBUSY: completions must be reaped first; the caller does that next.
                if e.raw_os_error() == Some(libc::EBUSY) {
                    return Ok(());
                }
            }
            Err(e) => return Err(e),
        }
    }
}
