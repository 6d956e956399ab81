//! The psync engine: `pwrite`/`pread` on tokio's blocking threads.

use super::{IoEngine, ReadBuf, ReadOp, WriteOp};
use async_trait::async_trait;
use bytes::Bytes;
use std::fs::{File, OpenOptions};
use std::io;
#[cfg(unix)]
use std::os::unix::fs::{FileExt, OpenOptionsExt};

/// How many blocking threads one request's operations are spread over.
const DEFAULT_PARALLELISM: usize = 4;

/// pread/pwrite on blocking threads: a request's operations are split into up to
/// `parallelism` contiguous groups, each done by one `spawn_blocking` task.
#[derive(Debug, Clone)]
pub struct PsyncEngine {
    parallelism: usize,
}

impl Default for PsyncEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl PsyncEngine {
    pub fn new() -> Self {
        PsyncEngine {
            parallelism: DEFAULT_PARALLELISM,
        }
    }

    /// Runs `f` over `ops` in up to `parallelism` blocking tasks; results in op order.
    async fn run<T, R>(&self, ops: Vec<T>, f: fn(&T) -> io::Result<R>) -> Vec<io::Result<R>>
    where
        T: Send + 'static,
        R: Send + 'static,
    {
        if ops.is_empty() {
            return Vec::new();
        }
        let groups = self.parallelism.min(ops.len()).max(1);
        let per = ops.len().div_ceil(groups);
        let mut tasks = Vec::with_capacity(groups);
        let mut rest = ops;
        while !rest.is_empty() {
            let tail = rest.split_off(per.min(rest.len()));
            let group = std::mem::replace(&mut rest, tail);
            let n = group.len();
            tasks.push((
                n,
                tokio::task::spawn_blocking(move || group.iter().map(f).collect::<Vec<_>>()),
            ));
        }
        let mut out = Vec::new();
        for (n, task) in tasks {
            match task.await {
                Ok(results) => out.extend(results),
                Err(e) => out.extend((0..n).map(|_| Err(io::Error::other(e.to_string())))),
            }
        }
        out
    }
}

fn create(path: &std::path::Path) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    o.mode(0o600);
    o.open(path)
}

fn write_one(op: &WriteOp) -> io::Result<()> {
    let file = create(&op.path)?;
    write_all_at(&file, &op.data)
}

#[cfg(unix)]
fn write_all_at(file: &File, data: &[u8]) -> io::Result<()> {
    file.write_all_at(data, 0)
}

#[cfg(not(unix))]
fn write_all_at(mut file: &File, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    file.write_all(data)
}

fn read_one(op: &ReadOp) -> io::Result<Bytes> {
    let file = File::open(&op.path)?;
    let mut buf = ReadBuf::new(op.len)?;
    let (ptr, len) = (buf.as_mut_ptr(), buf.len());
    read_exact_at(&file, ptr, len)?;
    // SAFETY: read_exact_at filled all `len` bytes.
    Ok(unsafe { buf.assume_filled() })
}

/// Fills `len` bytes at `ptr` from the start of `file`; a shorter file is `UnexpectedEof`.
#[cfg(unix)]
fn read_exact_at(file: &File, ptr: *mut u8, len: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut done = 0usize;
    while done < len {
        // SAFETY: ptr+done..ptr+len lies within the buffer's capacity.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                ptr.add(done) as *mut libc::c_void,
                len - done,
                done as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("file ends after {done} of {len} bytes"),
            ));
        }
        done += n as usize;
    }
    Ok(())
}

#[cfg(not(unix))]
fn read_exact_at(mut file: &File, ptr: *mut u8, len: usize) -> io::Result<()> {
    use std::io::Read;
    // Zero first so that a slice over the buffer is initialised memory.
    // SAFETY: ptr..ptr+len lies within the buffer's capacity.
    let slice = unsafe {
        std::ptr::write_bytes(ptr, 0, len);
        std::slice::from_raw_parts_mut(ptr, len)
    };
    file.read_exact(slice)
}

#[async_trait]
impl IoEngine for PsyncEngine {
    fn name(&self) -> &'static str {
        "psync"
    }

    async fn write_files(&self, ops: Vec<WriteOp>) -> Vec<io::Result<()>> {
        self.run(ops, write_one).await
    }

    async fn read_files(&self, ops: Vec<ReadOp>) -> Vec<io::Result<Bytes>> {
        self.run(ops, read_one).await
    }
}
