//! The soak's own deployment on loopback, and the faults it suffers.
//!
//! - `units`: a controller and in-memory storage-unit processes. Faults: a unit killed with
//!   SIGKILL and started again on its endpoint (its cells are gone: those samples must read as
//!   lost, never as data), and a unit paused with SIGSTOP for longer than a request's deadline.
//! - `redis`: a controller whose storage is a `redis-server` of the soak's own, with an
//!   append-only file synced on every write. Faults: Redis killed with SIGKILL and restarted
//!   from its file (nothing acknowledged may be lost), and Redis paused with SIGSTOP.
//!
//! Either way, the controller runs with a `--state-dir` and is killed with SIGKILL and started
//! again on it and on its address (nothing acknowledged may be lost; clients ride it out with
//! their retry policy), and a worker process killed with SIGKILL is a fault too (see [`super`]).

use crate::servers::{spawn_server, start_controller_and_units, Servers};
use clap::ValueEnum;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tq_core::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Storage {
    /// Storage-unit processes (in memory).
    Units,
    /// A redis-server the soak starts (needs `redis-server` on PATH and the `redis` feature).
    Redis,
}

/// A fault the deployment can suffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    KillUnit,
    PauseUnit,
    KillRedis,
    PauseRedis,
    KillController,
    KillWorker,
}

impl Fault {
    /// The faults of a storage kind, in the order they take turns.
    pub fn rotation(storage: Storage) -> &'static [Fault] {
        match storage {
            Storage::Units => &[
                Fault::KillUnit,
                Fault::PauseUnit,
                Fault::KillController,
                Fault::KillWorker,
            ],
            Storage::Redis => &[
                Fault::KillRedis,
                Fault::PauseRedis,
                Fault::KillController,
                Fault::KillWorker,
            ],
        }
    }
}

struct Redis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Redis {
    fn start(port: u16, dir: &Path) -> Result<Redis> {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                Error::unavailable("cannot start redis-server (is it on PATH?)").with_source(e)
            })?;
        let mut redis = Redis {
            child,
            port,
            dir: dir.to_path_buf(),
        };
        redis.await_ready()?;
        Ok(redis)
    }

    /// Waits until the server answers `PING` (it loads its append-only file first).
    fn await_ready(&mut self) -> Result<()> {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if self.command("PING").is_ok_and(|r| r.starts_with("+PONG")) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(Error::unavailable(format!(
                    "redis-server on port {} exited ({status})",
                    self.port
                )));
            }
            if Instant::now() > until {
                return Err(Error::timeout(format!(
                    "redis-server on port {} did not answer within 30 s",
                    self.port
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends one inline command and returns the first line of the answer.
    fn command(&self, command: &str) -> std::io::Result<String> {
        let mut conn = TcpStream::connect(("127.0.0.1", self.port))?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        conn.write_all(format!("{command}\r\n").as_bytes())?;
        let mut answer = [0u8; 256];
        let n = conn.read(&mut answer)?;
        Ok(String::from_utf8_lossy(&answer[..n])
            .lines()
            .next()
            .unwrap_or_default()
            .to_string())
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Counts the keys without a deadline (`PTTL` -1), scanning the whole keyspace in one script
/// call (an inline command: Redis splits it like a shell, quotes included).
const COUNT_PERSISTENT_KEYS: &str = "EVAL \"local n = 0 local c = '0' repeat \
    local r = redis.call('SCAN', c, 'COUNT', 1000) c = r[1] \
    for _, k in ipairs(r[2]) do if redis.call('PTTL', k) == -1 then n = n + 1 end end \
    until c == '0' return n\" 0";

/// The controller's state directory under the soak's directory.
fn state_dir(dir: &Path) -> Result<String> {
    let state = dir.join("controller-state");
    std::fs::create_dir_all(&state)
        .map_err(|e| Error::internal("cannot create the controller's state dir").with_source(e))?;
    Ok(state.to_string_lossy().to_string())
}

/// A free loopback port (bound and released; the server binds it again right after).
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::unavailable("cannot find a free port").with_source(e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::unavailable("cannot find a free port").with_source(e))
}

fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status();
}

pub struct Deployment {
    /// `children[0]` is the controller, then the units (by unit number).
    servers: Servers,
    unit_endpoints: Vec<String>,
    redis: Option<Redis>,
    /// A process stopped with SIGSTOP, and when to let it go on.
    paused: Option<(u32, Instant)>,
    next_unit: usize,
    /// How the controller was started, but for its address: it is started again so, on the
    /// address it had.
    controller_args: Vec<String>,
}

impl Deployment {
    pub fn start(storage: Storage, units: u32, dir: &Path) -> Result<Deployment> {
        match storage {
            Storage::Units => {
                let state = state_dir(dir)?;
                let extra = ["--state-dir", &state];
                let (servers, unit_endpoints) = start_controller_and_units(units, &extra)?;
                let n = units.to_string();
                Ok(Deployment {
                    servers,
                    unit_endpoints,
                    redis: None,
                    paused: None,
                    next_unit: 0,
                    controller_args: ["controller", "--units", &n, "--state-dir", &state]
                        .map(String::from)
                        .to_vec(),
                })
            }
            Storage::Redis => {
                let redis_dir = dir.join("redis");
                std::fs::create_dir_all(&redis_dir).map_err(|e| {
                    Error::internal("cannot create the soak's Redis directory").with_source(e)
                })?;
                let redis = Redis::start(free_port()?, &redis_dir)?;
                let config = dir.join("tq.toml");
                std::fs::write(
                    &config,
                    format!(
                        "[storage]\nbackend = \"kv\"\n[storage.kv]\nstores = [{{ url = \"{}\" }}]\n",
                        redis.url()
                    ),
                )
                .map_err(|e| {
                    Error::internal("cannot write the soak's configuration").with_source(e)
                })?;
                let state = state_dir(dir)?;
                let config = config.to_string_lossy().to_string();
                let args = ["controller", "--config", &config, "--state-dir", &state];
                let (c, controller) =
                    spawn_server(&[&args[..], &["--listen", "tcp://127.0.0.1:0"]].concat())?;
                Ok(Deployment {
                    servers: Servers {
                        children: vec![c],
                        controller,
                    },
                    unit_endpoints: Vec::new(),
                    redis: Some(redis),
                    paused: None,
                    next_unit: 0,
                    controller_args: args.map(String::from).to_vec(),
                })
            }
        }
    }

    pub fn url(&self) -> &str {
        &self.servers.controller
    }

    /// The server processes to watch the memory of: name and pid.
    pub fn processes(&self) -> Vec<(String, u32)> {
        let mut out = vec![("controller".to_string(), self.servers.children[0].id())];
        for (i, c) in self.servers.children.iter().enumerate().skip(1) {
            out.push((format!("unit-{}", i - 1), c.id()));
        }
        if let Some(redis) = &self.redis {
            out.push(("redis-server".to_string(), redis.child.id()));
        }
        out
    }

    /// Inflicts `fault` (not [`Fault::KillWorker`], which the soak does itself).
    pub fn inflict(&mut self, fault: Fault, pause: Duration) -> Result<()> {
        match fault {
            Fault::KillUnit => {
                let unit = self.take_unit();
                let slot = 1 + unit;
                let _ = self.servers.children[slot].kill();
                let _ = self.servers.children[slot].wait();
                // Same id, same endpoint: a unit that comes back where it was, without its cells.
                let (u, _) = spawn_server(&[
                    "storage-unit",
                    "--controller",
                    &self.servers.controller.clone(),
                    "--id",
                    &format!("unit-{unit}"),
                    "--listen",
                    &self.unit_endpoints[unit],
                ])?;
                self.servers.children[slot] = u;
            }
            Fault::PauseUnit => {
                let unit = self.take_unit();
                let pid = self.servers.children[1 + unit].id();
                signal(pid, "-STOP");
                self.paused = Some((pid, Instant::now() + pause));
            }
            Fault::KillRedis => {
                if let Some(old) = self.redis.take() {
                    let (port, dir) = (old.port, old.dir.clone());
                    drop(old);
                    self.redis = Some(Redis::start(port, &dir)?);
                }
            }
            Fault::PauseRedis => {
                if let Some(redis) = &self.redis {
                    let pid = redis.child.id();
                    signal(pid, "-STOP");
                    self.paused = Some((pid, Instant::now() + pause));
                }
            }
            Fault::KillController => {
                let _ = self.servers.children[0].kill();
                let _ = self.servers.children[0].wait();
                let listen = self.servers.controller.clone();
                let mut args: Vec<&str> = self.controller_args.iter().map(String::as_str).collect();
                args.extend(["--listen", &listen]);
                let (c, _) = spawn_server(&args)?;
                self.servers.children[0] = c;
            }
            Fault::KillWorker => {}
        }
        Ok(())
    }

    fn take_unit(&mut self) -> usize {
        let unit = self.next_unit % self.unit_endpoints.len().max(1);
        self.next_unit += 1;
        unit
    }

    /// Lets a paused process go on once its pause is over (`now`: whatever the time).
    pub fn resume_paused(&mut self, now: bool) {
        if let Some((pid, until)) = self.paused {
            if now || Instant::now() >= until {
                signal(pid, "-CONT");
                self.paused = None;
            }
        }
    }

    /// Keys left in Redis that do not expire (`None` without Redis or when it does not
    /// answer). Keys marked to expire are not counted: cells retired by an overwrite and
    /// cleared cells expire `clear_expire_after` later by design, so a final clear right after
    /// an overwrite still finds some (`DBSIZE` would count them, even once expired).
    pub fn redis_keys(&self) -> Option<u64> {
        let answer = self.redis.as_ref()?.command(COUNT_PERSISTENT_KEYS).ok()?;
        answer.strip_prefix(':')?.trim().parse().ok()
    }

    /// Up to ten of the keys left in Redis, to say what leaked (needs `redis-cli`; empty
    /// without it).
    pub fn some_redis_keys(&self) -> Vec<String> {
        let Some(redis) = &self.redis else {
            return Vec::new();
        };
        let out = Command::new("redis-cli")
            .args(["-p", &redis.port.to_string(), "--scan"])
            .output();
        match out {
            Ok(out) => String::from_utf8_lossy(&out.stdout)
                .lines()
                .take(10)
                .map(str::to_string)
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        self.resume_paused(true);
    }
}
