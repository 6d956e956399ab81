//! [`RedisStore`]: a [`KvStore`] on Redis, single node or Redis Cluster (feature `redis`).
//!
//! - Single node: one multiplexed [`redis::aio::ConnectionManager`], which reconnects after a
//!   server restart. A call is one command (`MSET`, `MGET`, `UNLINK`, or `EVAL` of
//!   [`EXPIRE_SCRIPT`]) or one pipeline (`SET .. PX` / `PEXPIRE` per key, see [`ExpireCommand`]);
//!   the adapter keeps several calls in flight.
//! - Cluster: [`redis::cluster_async::ClusterConnection`]. Multi-key commands may not span hash
//!   slots, so each call is split by slot (the adapter's keys put every key of a sample in one
//!   slot); the per-slot commands are grouped by the node that serves their slot (from
//!   `CLUSTER SLOTS`) and sent as one pipeline per node, the nodes in parallel. If the slot map
//!   is stale (resharding, failover), the map is dropped and that call goes per slot, routed
//!   and redirected by the cluster connection. A command that fails inside a node pipeline
//!   (e.g. a write refused at `maxmemory`) fails the call, as on a single node.
//! - Every call has a deadline ([`RedisOptions::op_timeout`]); a server that cannot be reached
//!   or does not answer is [`tq_core::ErrorKind::Unavailable`], and so is a server that says
//!   "later" (`LOADING` while a restarted server reads its file, `TRYAGAIN`, `MASTERDOWN`,
//!   `CLUSTERDOWN`). Calls are idempotent and are
//!   retried once after a dropped connection, so the first call after a restart succeeds.
//!
//! Layout: this file holds the options, the connection and how one call is sent under its
//! deadline; `commands` maps each [`KvStore`] operation to Redis commands; `cluster` holds the
//! slot map and the per-node routing (including the one cross-slot script per node of a
//! generation clear); `scripts` holds the Lua scripts.

use crate::store::{KvCapabilities, KvStore, KvValue};
use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{RedisWrite, ToRedisArgs};
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::OnceCell;
use tq_core::{Error, Result};

/// How `delete` removes keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeleteCommand {
    /// `UNLINK`: the server frees the memory in a background thread (the default).
    #[default]
    Unlink,
    /// `DEL`: synchronous.
    Del,
}

/// How `expire` sets deadlines. Redis has no multi-key expire, so either way the server runs one
/// `PEXPIRE` per key; the choice is where the per-key overhead is paid.
///
/// Measured with `kv-bench` (Redis 7.0.15, 2 shared cores, 512 and 1024 samples × 28 fields,
/// 1024 keys per call, 16 calls in flight): the pipeline is the faster default. Raw expire, single
/// node: pipeline 2.3-2.5 µs/key wall (server CPU 2.2-2.4, client 0.9) vs script 3.0-3.1 (server
/// 3.0, client 0.3); 3-node cluster: 2.0-2.1 vs 2.2-2.3. The script saves 3-4× client CPU and
/// one reply per key, but Lua's `redis.call` costs the server more per key than a pipelined
/// command, and the server is the bottleneck. Pick `Script` when the client's CPU is the scarce
/// side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExpireCommand {
    /// One `PEXPIRE` per key, pipelined: one pipeline per call, one per node on a cluster (the
    /// default).
    #[default]
    Pipeline,
    /// One `EVAL` per call (per hash slot on a cluster) of [`EXPIRE_SCRIPT`], which loops
    /// `PEXPIRE` over the call's keys on the server.
    Script,
}

/// Connection and batching settings of a [`RedisStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// Deadline of establishing one connection.
    pub connect_timeout: Duration,
    /// Deadline of one answer on an established connection.
    pub response_timeout: Duration,
    /// Deadline of one store call, retries and reconnection included.
    pub op_timeout: Duration,
    pub delete: DeleteCommand,
    pub expire: ExpireCommand,
    pub max_keys_per_call: usize,
    pub max_concurrent_calls: usize,
    /// Replicas that must confirm every write before it is acknowledged (`WAIT`), so that an
    /// acknowledged write survives the loss of its master; `0` (the default) does not wait.
    /// Each write call is followed by `WAIT wait_replicas wait_timeout` on its connection; too
    /// few confirmations within the timeout fail the write with `Unavailable` (the write may be
    /// on the master: repeating it is safe, writes are idempotent).
    pub wait_replicas: u32,
    pub wait_timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            op_timeout: Duration::from_secs(10),
            delete: DeleteCommand::Unlink,
            expire: ExpireCommand::default(),
            max_keys_per_call: 1024,
            max_concurrent_calls: 16,
            wait_replicas: 0,
            wait_timeout: Duration::from_secs(1),
        }
    }
}

// One per store: the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Conn {
    Single {
        client: redis::Client,
        cm: OnceCell<ConnectionManager>,
    },
    Cluster {
        client: ClusterClient,
        conn: OnceCell<ClusterConnection>,
    },
}

/// A [`KvStore`] on Redis. Connects on first use.
pub struct RedisStore {
    name: String,
    what: String,
    conn: Conn,
    options: RedisOptions,
    /// Cluster slot ranges → primary (host, port), fetched on first use (see `slot_map`).
    slots: std::sync::Mutex<Option<SlotMap>>,
}

/// One request: a command or a pipeline of commands.
enum Req {
    Cmd(redis::Cmd),
    Pipe(Vec<redis::Cmd>),
}

impl Req {
    /// One command as itself, several as a pipeline.
    fn from_commands(mut cmds: Vec<redis::Cmd>) -> Req {
        match cmds.len() {
            1 => Req::Cmd(cmds.remove(0)),
            _ => Req::Pipe(cmds),
        }
    }

    /// How many replies the request gets.
    fn replies(&self) -> usize {
        match self {
            Req::Cmd(_) => 1,
            Req::Pipe(cmds) => cmds.len(),
        }
    }

    /// Appends the request's commands to `pipe`.
    fn append_to(self, pipe: &mut redis::Pipeline) {
        match self {
            Req::Cmd(c) => {
                pipe.add_command(c);
            }
            Req::Pipe(cmds) => {
                for c in cmds {
                    pipe.add_command(c);
                }
            }
        }
    }
}

/// A request ready to send (and to send again on retry).
enum Packed {
    Cmd(redis::Cmd),
    Pipe(redis::Pipeline),
}

impl From<Req> for Packed {
    fn from(req: Req) -> Self {
        match req {
            Req::Cmd(c) => Packed::Cmd(c),
            Req::Pipe(cmds) => {
                let mut p = redis::Pipeline::with_capacity(cmds.len());
                Req::Pipe(cmds).append_to(&mut p);
                Packed::Pipe(p)
            }
        }
    }
}

/// Builds the request covering the keys at the given positions of a call. Requests are built
/// where they are sent (per slot, or straight into one pipeline per node), and built again for
/// the per-slot fallback, so no command is ever cloned.
type Build<'a> = dyn Fn(&[usize]) -> Req + Send + Sync + 'a;

/// A command with room for `args` arguments of `bytes` bytes in all.
fn cmd_with(name: &str, args: usize, bytes: usize) -> redis::Cmd {
    let mut c = redis::Cmd::with_capacity(args + 1, name.len() + bytes);
    c.arg(name);
    c
}

/// Writes a [`KvValue`]'s parts as one argument, straight into the command buffer.
struct ValueArg<'a>(&'a KvValue);

impl ToRedisArgs for ValueArg<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        use std::io::Write;
        let mut w = out.writer_for_next_arg();
        for p in self.0.parts() {
            #[allow(clippy::expect_used)] // writing into a Vec cannot fail
            w.write_all(p).expect("writing to memory");
        }
    }
}

fn map_err(what: &str, e: redis::RedisError) -> Error {
    let msg = format!("{what}: {e}");
    // A server that answers "not now" (LOADING after a restart, TRYAGAIN, MASTERDOWN,
    // CLUSTERDOWN) did nothing and will serve the request later: unavailable, as a refused
    // connection is, never an internal error a caller would give up on.
    let server_says_later = matches!(
        e.retry_method(),
        redis::RetryMethod::WaitAndRetry | redis::RetryMethod::RetryImmediately
    );
    if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || e.is_cluster_error()
        || e.is_unrecoverable_error()
        || server_says_later
    {
        Error::unavailable(msg).with_source(e)
    } else if msg.contains("OOM") {
        Error::capacity_exceeded(msg).with_source(e)
    } else {
        Error::internal(msg).with_source(e)
    }
}

impl RedisStore {
    /// `req` followed by a `WAIT` for the configured replicas, if any.
    fn with_wait(&self, req: Req) -> Req {
        if self.options.wait_replicas == 0 {
            return req;
        }
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.options.wait_replicas)
            .arg(self.options.wait_timeout.as_millis().max(1) as u64);
        let mut cmds = match req {
            Req::Cmd(c) => vec![c],
            Req::Pipe(cmds) => cmds,
        };
        cmds.push(wait);
        Req::Pipe(cmds)
    }

    /// Checks the `WAIT` answer that ends `reply` (see [`Self::with_wait`]) and returns the
    /// write's own replies.
    fn checked_wait(&self, reply: redis::Value) -> Result<redis::Value> {
        if self.options.wait_replicas == 0 {
            return Ok(reply);
        }
        let redis::Value::Array(mut replies) = reply else {
            return Err(Error::corrupted(format!(
                "{}: a write with WAIT answered {reply:?}",
                self.what
            )));
        };
        let confirmed = match replies.pop() {
            Some(redis::Value::Int(n)) => n,
            other => {
                return Err(Error::corrupted(format!(
                    "{}: WAIT answered {other:?}",
                    self.what
                )))
            }
        };
        if confirmed < i64::from(self.options.wait_replicas) {
            return Err(Error::unavailable(format!(
                "{}: {confirmed} of {} replicas confirmed a write within {:?} (the write may be \
                 on the master only; repeating it is safe)",
                self.what, self.options.wait_replicas, self.options.wait_timeout
            )));
        }
        Ok(match replies.len() {
            1 => replies.pop().unwrap_or(redis::Value::Nil),
            _ => redis::Value::Array(replies),
        })
    }

    /// A single-node store at `url` (`redis://host:port[/db]`, or `rediss://` with the
    /// `redis-tls` feature).
    pub fn single(url: &str, options: RedisOptions) -> Result<Self> {
        let shown = crate::config::redact_url(url);
        let client = redis::Client::open(url)
            .map_err(|e| Error::invalid(format!("redis url `{shown}`: {e}")))?;
        Ok(RedisStore {
            name: "redis".into(),
            what: format!("redis `{shown}`"),
            conn: Conn::Single {
                client,
                cm: OnceCell::new(),
            },
            options,
            slots: std::sync::Mutex::new(None),
        })
    }

    /// A Redis Cluster store seeded by `nodes` (`redis://host:port` each).
    pub fn cluster(nodes: &[String], options: RedisOptions) -> Result<Self> {
        let client = ClusterClient::builder(nodes.iter().map(String::as_str))
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.response_timeout)
            .retries(2)
            .min_retry_wait(20)
            .max_retry_wait(500)
            .build()
            .map_err(|e| {
                Error::invalid(format!(
                    "redis cluster nodes {:?}: {e}",
                    nodes
                        .iter()
                        .map(|n| crate::config::redact_url(n))
                        .collect::<Vec<_>>()
                ))
            })?;
        let shown: Vec<String> = nodes.iter().map(|n| crate::config::redact_url(n)).collect();
        Ok(RedisStore {
            name: "redis-cluster".into(),
            what: format!("redis cluster {shown:?}"),
            conn: Conn::Cluster {
                client,
                conn: OnceCell::new(),
            },
            options,
            slots: std::sync::Mutex::new(None),
        })
    }

    /// `redis://…` / `rediss://…` (single node) or `redis+cluster://h1:p1,h2:p2` (cluster).
    pub fn from_url(url: &str, options: RedisOptions) -> Result<Self> {
        if let Some(rest) = url.strip_prefix("redis+cluster://") {
            let nodes: Vec<String> = rest
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| format!("redis://{s}"))
                .collect();
            return Self::cluster(&nodes, options);
        }
        if let Some(rest) = url.strip_prefix("rediss+cluster://") {
            let nodes: Vec<String> = rest
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| format!("rediss://{s}"))
                .collect();
            return Self::cluster(&nodes, options);
        }
        Self::single(url, options)
    }

    /// Renames the store (its routing tag when it is the only one).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster { .. })
    }

    /// Sends one request with retry once after a connection failure; no deadline here.
    async fn send_on<C: ConnectionLike + Clone + Send>(
        &self,
        conn: &C,
        req: Req,
    ) -> Result<redis::Value> {
        let req = Packed::from(req);
        let mut attempt = 0;
        loop {
            let mut c = conn.clone();
            let r = match &req {
                Packed::Cmd(cmd) => cmd.query_async::<redis::Value>(&mut c).await,
                Packed::Pipe(p) => p.query_async::<redis::Value>(&mut c).await,
            };
            match r {
                Ok(v) => return Ok(v),
                Err(e) => {
                    let e = map_err(&self.what, e);
                    if attempt >= 1 || !e.is_retryable() {
                        return Err(e);
                    }
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Sends one request per group (built by `build`) on `conn`, up to `max_concurrent_calls`
    /// at once; no deadline here.
    async fn send_each<C: ConnectionLike + Clone + Send + Sync>(
        &self,
        conn: &C,
        groups: Vec<(u16, Vec<usize>)>,
        build: &Build<'_>,
    ) -> Result<Vec<(Vec<usize>, redis::Value)>> {
        futures::stream::iter(groups)
            .map(|(_, pos)| async move {
                let req = build(&pos);
                Ok((pos, self.send_on(conn, req).await?))
            })
            .buffer_unordered(self.options.max_concurrent_calls.max(1))
            .try_collect()
            .await
    }

    /// Runs one request per group of key positions (built by `build`), in parallel, under the
    /// call deadline. Returns each group's positions with its reply (a pipeline's replies as
    /// one array).
    async fn run(
        &self,
        groups: Vec<(u16, Vec<usize>)>,
        build: &Build<'_>,
    ) -> Result<Vec<(Vec<usize>, redis::Value)>> {
        self.within_deadline(self.run_untimed(groups, build)).await
    }

    /// `work` under the call deadline ([`RedisOptions::op_timeout`]).
    async fn within_deadline<T>(
        &self,
        work: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.options.op_timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(Error::unavailable(format!(
                "{}: no answer within {:?}",
                self.what, self.options.op_timeout
            ))),
        }
    }

    /// [`Self::run`] without the deadline.
    async fn run_untimed(
        &self,
        groups: Vec<(u16, Vec<usize>)>,
        build: &Build<'_>,
    ) -> Result<Vec<(Vec<usize>, redis::Value)>> {
        match &self.conn {
            Conn::Single { client, cm } => {
                let conn = cm
                    .get_or_try_init(|| async {
                        let cfg = ConnectionManagerConfig::new()
                            .set_connection_timeout(Some(self.options.connect_timeout))
                            .set_response_timeout(Some(self.options.response_timeout))
                            .set_number_of_retries(2)
                            .set_min_delay(Duration::from_millis(20))
                            .set_max_delay(Duration::from_millis(500));
                        ConnectionManager::new_with_config(client.clone(), cfg)
                            .await
                            .map_err(|e| map_err(&self.what, e))
                    })
                    .await?;
                self.send_each(conn, groups, build).await
            }
            Conn::Cluster { .. } => {
                let conn = self.cluster_conn().await?;
                if groups.len() > 1 {
                    if let Some(replies) = self.run_by_node(conn, &groups, build).await? {
                        return Ok(groups
                            .into_iter()
                            .zip(replies)
                            .map(|((_, pos), v)| (pos, v))
                            .collect());
                    }
                }
                self.send_each(conn, groups, build).await
            }
        }
    }
}

mod cluster;
mod commands;
mod scripts;

pub use cluster::key_slot;
use cluster::SlotMap;
use scripts::packed_generations;
pub use scripts::{
    CLEAR_GENERATIONS_CROSS_SLOT_SCRIPT, CLEAR_GENERATIONS_SCRIPT, EXPIRE_SCRIPT,
    RAISE_GENERATIONS_SCRIPT,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_redis_spec() {
        // Values from the Redis Cluster specification / CLUSTER KEYSLOT.
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(key_slot(b"tq/{p/1}/0/a"), key_slot(b"tq/{p/1}/gen"));
    }

    /// The error a server answers with, as the client library parses it off the wire.
    fn server_error(wire: &[u8]) -> redis::RedisError {
        match redis::parse_redis_value(wire).map(redis::Value::extract_error) {
            Ok(Err(e)) => e,
            other => panic!("{:?} did not parse as a server error: {other:?}", wire),
        }
    }

    #[test]
    fn a_server_that_says_later_is_unavailable_and_safe_to_retry() {
        // `tq soak` found a restarted Redis (loading its append-only file) read as an internal
        // error, on which every caller gave up.
        for wire in [
            &b"-LOADING Redis is loading the dataset in memory\r\n"[..],
            b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
            b"-MASTERDOWN Link with MASTER is down\r\n",
            b"-CLUSTERDOWN The cluster is down\r\n",
        ] {
            let e = map_err("get", server_error(wire));
            assert_eq!(e.kind(), &tq_core::ErrorKind::Unavailable, "{e}");
            assert_eq!(e.retry(), tq_core::Retry::Safe, "{e}");
        }
        // A command the server refuses for good stays an internal error.
        let e = map_err("get", server_error(b"-ERR unknown command 'FOO'\r\n"));
        assert_eq!(e.kind(), &tq_core::ErrorKind::Internal, "{e}");
    }
}
