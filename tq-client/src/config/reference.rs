//! The configuration reference (docs/configuration.md, `tq config reference`): every key with
//! its default, its environment variable and what it does.
//!
//! The page is generated, so that it cannot drift from the types: the defaults are read from
//! `Config::default()`, the environment names follow from the one rule (`env.rs`), and tests
//! check that every key `Config::default()` serializes is described here, that every key
//! described here is one the types accept (its example parses and changes the configuration),
//! and that docs/configuration.md is this page.

use super::Config;

/// One key of the reference.
pub struct KeyDoc {
    /// The key's path (`net.request_timeout_ms`; `[]` marks an entry of a list of tables,
    /// `<name>` a key the user chooses).
    pub key: &'static str,
    /// A TOML document that sets the key (to a value other than its default).
    pub example: &'static str,
    pub doc: &'static str,
}

/// Every key, by section, in the order of the page.
pub const KEYS: &[KeyDoc] = &[
    // [controller]
    KeyDoc {
        key: "controller.default_sampler",
        example: "[controller]\ndefault_sampler = \"grpo:4\"",
        doc: "The sampler of fetches that name none: `sequential`, `grpo:<n>` (whole groups of \
              n responses), `rank-aware` (one answer per data-parallel group), \
              `seqlen-balanced:<dp_size>` or `seqlen-balanced:<dp_size>:<n>`.",
    },
    KeyDoc {
        key: "controller.fetch_timeout_ms",
        example: "[controller]\nfetch_timeout_ms = 500",
        doc: "How long a fetch waits for enough ready samples, in milliseconds.",
    },
    KeyDoc {
        key: "controller.max_samples",
        example: "[controller]\nmax_samples = 4096",
        doc: "Samples the controller holds at once over all partitions; unset: no limit. \
              An insert or a put of new keys beyond it fails with `CapacityExceeded` before \
              anything is written. Unlike `storage.capacity_per_unit`, it does not depend on \
              how samples spread over units.",
    },
    KeyDoc {
        key: "controller.samplers.<name>",
        example: "[controller.samplers]\ngrpo = \"grpo:4\"",
        doc: "Extra samplers a fetch can name (`GetMetaRequest::with_sampler`): any form \
              `default_sampler` takes. The environment adds one with \
              `TQ_CONTROLLER_SAMPLERS_<NAME>`.",
    },
    // [storage]
    KeyDoc {
        key: "storage.backend",
        example: "[storage]\nbackend = \"kv\"",
        doc: "Where payloads live: `simple` (in-memory storage units, optionally offloading \
              to SSD), `kv` (the key-value adapter: memory, Redis, Redis Cluster, object \
              storage; `[storage.kv]`), or the name of a backend a program registered with \
              `ClientBuilder::backend`. A controller refuses a name its build does not have.",
    },
    KeyDoc {
        key: "storage.num_units",
        example: "[storage]\nnum_units = 4",
        doc: "Storage units of the `simple` backend; sample index i lives on unit \
              (i / 16) % num_units (runs of 16 consecutive indexes share a unit). An error \
              with any other backend (it has no units).",
    },
    KeyDoc {
        key: "storage.capacity_per_unit",
        example: "[storage]\ncapacity_per_unit = 100000",
        doc: "Samples one unit of the `simple` backend holds at most; unset: unlimited. A \
              put beyond it fails with `CapacityExceeded`. A partition's rows lie on units in \
              runs of 16, so one unit may hold up to 16 more of them than another: to bound \
              the total, use `controller.max_samples`.",
    },
    KeyDoc {
        key: "storage.compaction_threshold",
        example: "[storage]\ncompaction_threshold = 0.25",
        doc: "A dense put's allocation in a unit is compacted once less than this fraction \
              of its rows is live (between 0 and 1).",
    },
    // [storage.kv]
    KeyDoc {
        key: "storage.kv.namespace",
        example: "[storage.kv]\nnamespace = \"job-7\"",
        doc: "First component of every key, so that several deployments can share one store.",
    },
    KeyDoc {
        key: "storage.kv.data_ttl_ms",
        example: "[storage.kv]\ndata_ttl_ms = 3600000",
        doc: "Unset: no deadline, and a clear deletes. Set: every write gives its keys this \
              deadline (re-armed by each write, not by reads; it must outlast any batch), and \
              a clear marks keys to disappear after `clear_expire_after_ms`.",
    },
    KeyDoc {
        key: "storage.kv.clear_expire_after_ms",
        example: "[storage.kv]\nclear_expire_after_ms = 5000",
        doc: "With `data_ttl_ms`: how long cleared keys stay before the store drops them.",
    },
    KeyDoc {
        key: "storage.kv.op_timeout_ms",
        example: "[storage.kv]\nop_timeout_ms = 2000",
        doc: "Deadline of one store call (Redis), in milliseconds.",
    },
    KeyDoc {
        key: "storage.kv.stores[].url",
        example: "[[storage.kv.stores]]\nurl = \"redis://127.0.0.1:6379\"",
        doc: "A store: `memory://`, `redis://host:port[/db]`, `rediss://…` (feature \
              `redis-tls`), `redis+cluster://h1:p1,h2:p2,…`, `file:///absolute/dir`, \
              `object-memory://`. A password in the URL is never shown in messages. The environment sets the \
              whole list: `TQ_STORAGE_KV_STORES='[{ url = \"memory://\" }]'`.",
    },
    KeyDoc {
        key: "storage.kv.stores[].name",
        example: "[[storage.kv.stores]]\nname = \"small\"\nurl = \"memory://\"",
        doc: "The store's name, which routing rules and checkpoints refer to; default: the \
              URL's scheme.",
    },
    KeyDoc {
        key: "storage.kv.routing.kind",
        example: "[storage.kv.routing]\nkind = \"by-size\"\nthreshold = 65536\nsmall = \"a\"\nlarge = \"b\"",
        doc: "Which store a cell goes to: `first` (the first store), `by-size` (cells below \
              `threshold` bytes to `small`, others to `large`) or `by-field` (per field, by \
              `fields`, else `default`). Store names as in `stores[].name`.",
    },
    KeyDoc {
        key: "storage.kv.routing.threshold",
        example: "[storage.kv.routing]\nkind = \"by-size\"\nthreshold = 1024\nsmall = \"a\"\nlarge = \"b\"",
        doc: "`by-size`: the size in bytes from which a cell goes to the `large` store.",
    },
    KeyDoc {
        key: "storage.kv.routing.small",
        example: "[storage.kv.routing]\nkind = \"by-size\"\nthreshold = 65536\nsmall = \"redis\"\nlarge = \"b\"",
        doc: "`by-size`: the store of cells below the threshold.",
    },
    KeyDoc {
        key: "storage.kv.routing.large",
        example: "[storage.kv.routing]\nkind = \"by-size\"\nthreshold = 65536\nsmall = \"a\"\nlarge = \"file\"",
        doc: "`by-size`: the store of cells at or above the threshold.",
    },
    KeyDoc {
        key: "storage.kv.routing.default",
        example: "[storage.kv.routing]\nkind = \"by-field\"\ndefault = \"a\"\nfields = {}",
        doc: "`by-field`: the store of the fields `fields` does not name.",
    },
    KeyDoc {
        key: "storage.kv.routing.fields.<field>",
        example: "[storage.kv.routing]\nkind = \"by-field\"\ndefault = \"a\"\nfields = { images = \"b\" }",
        doc: "`by-field`: the store of one field's cells.",
    },
    KeyDoc {
        key: "storage.kv.redis.delete",
        example: "[storage.kv.redis]\ndelete = \"del\"",
        doc: "How Redis stores remove keys: `unlink` (memory freed in the server's \
              background) or `del` (synchronous).",
    },
    KeyDoc {
        key: "storage.kv.redis.expire",
        example: "[storage.kv.redis]\nexpire = \"script\"",
        doc: "How Redis stores set deadlines: `pipeline` (one pipelined PEXPIRE per key) or \
              `script` (one EVAL per call: less client CPU, more server CPU).",
    },
    KeyDoc {
        key: "storage.kv.redis.wait_replicas",
        example: "[storage.kv.redis]\nwait_replicas = 1",
        doc: "Replicas that must confirm each write before it is acknowledged (`WAIT`); `0`: \
              none. Costs one replication round trip per write call.",
    },
    KeyDoc {
        key: "storage.kv.redis.wait_timeout_ms",
        example: "[storage.kv.redis]\nwait_timeout_ms = 250",
        doc: "How long a write waits for those confirmations before it fails, in milliseconds.",
    },
    // [storage.ssd]
    KeyDoc {
        key: "storage.ssd.enabled",
        example: "[storage.ssd]\nenabled = true\npath = \"/mnt/nvme/tq\"",
        doc: "Offload large cells of the `simple` backend's units to a local disk.",
    },
    KeyDoc {
        key: "storage.ssd.path",
        example: "[storage.ssd]\nenabled = true\npath = \"/var/tmp/tq\"",
        doc: "Directory on a local disk (required when enabled; created with its parents); \
              each run keeps its files below it, and a unit locks its directory.",
    },
    KeyDoc {
        key: "storage.ssd.threshold_bytes",
        example: "[storage.ssd]\nenabled = true\npath = \"/tmp/x\"\nthreshold_bytes = 4096",
        doc: "A cell whose payload is at least this many bytes goes to disk.",
    },
    KeyDoc {
        key: "storage.ssd.engine",
        example: "[storage.ssd]\nenabled = true\npath = \"/tmp/x\"\nengine = \"psync\"",
        doc: "The I/O engine: `auto` (io_uring when the kernel allows a ring, else psync), \
              `uring` (an error where unavailable) or `psync` (pread/pwrite).",
    },
    KeyDoc {
        key: "storage.ssd.memory_fallback",
        example: "[storage.ssd]\nenabled = true\npath = \"/tmp/x\"\nmemory_fallback = true",
        doc: "Keep a value in memory when its disk write fails, instead of failing the put.",
    },
    KeyDoc {
        key: "storage.ssd.trim_after_clear",
        example: "[storage.ssd]\nenabled = true\npath = \"/tmp/x\"\ntrim_after_clear = false",
        doc: "Ask the C allocator to return free memory to the OS after a clear (glibc \
              `malloc_trim`).",
    },
    // [net]
    KeyDoc {
        key: "net.token",
        example: "[net]\ntoken = \"s3cret\"",
        doc: "Shared secret every peer presents in its handshake; servers on a non-loopback \
              address require one. Prefer `TQ_NET_TOKEN` (or `--token`) to a file.",
    },
    KeyDoc {
        key: "net.request_timeout_ms",
        example: "[net]\nrequest_timeout_ms = 5000",
        doc: "Deadline of one request, in milliseconds (a waiting fetch gets its wait on top).",
    },
    KeyDoc {
        key: "net.connect_timeout_ms",
        example: "[net]\nconnect_timeout_ms = 1000",
        doc: "Deadline of connecting to a peer, and of waiting for every storage unit to \
              register when a client connects, in milliseconds.",
    },
    KeyDoc {
        key: "net.key_cache_entries",
        example: "[net]\nkey_cache_entries = 0",
        doc: "Keys whose metadata a remote client remembers, so that small gets overlap the \
              storage read with the key lookup; `0` turns it off.",
    },
    KeyDoc {
        key: "net.retry_max_elapsed_ms",
        example: "[net]\nretry_max_elapsed_ms = 30000",
        doc: "How long a request that failed in transport and is safe to repeat keeps being \
              retried (backoff with jitter, never past its own deadline): rides out a \
              controller or unit restart. `0`: only the one retry an idempotent request \
              always gets. Counted in `tq_net_retries_total`.",
    },
    KeyDoc {
        key: "net.shared_memory",
        example: "[net]\nshared_memory = true",
        doc: "Remote clients: move payloads of 256 KiB and more through shared memory when a \
              storage unit runs on the same machine and offers it (sealed memfd segments \
              passed over a Unix socket; a get maps them instead of reading TCP; a get whose \
              cells are known to total less stays on TCP). Falls back to TCP with one log line \
              saying why. A writing process keeps up to 64 MiB of segments allocated ahead for \
              the segment lengths it puts again and again (decision 0042). Linux only.",
    },
    KeyDoc {
        key: "net.server_stay_awake_us",
        example: "[net]\nserver_stay_awake_us = 0",
        doc: "Servers (controller, storage units): how long a connection stays awake after \
              each request for the next one before its thread sleeps, in microseconds. Waking \
              a sleeping thread costs 40–120 µs on a VM, more than the gap between a put's \
              write and its notice; a connection costs at most this much CPU per request. \
              `0`: sleep at once (a machine short of cores for other work).",
    },
    KeyDoc {
        key: "net.server_threads",
        example: "[net]\nserver_threads = 4",
        doc: "Servers (`tq serve`, `tq controller`, `tq storage-unit`, and the servers the \
              Python package hosts, e.g. tq.compat's Ray actors): worker threads of their \
              runtime, 1 to 1024. One by default: a request costs a server microseconds, and \
              with several workers each message wakes a second thread to run it. Raise it for \
              a controller or unit serving many clients at once on a machine with cores to \
              spare (decision 0051). A Rust program that hosts servers itself sizes its own \
              runtime.",
    },
];

/// The environment variable of `key` (the rule of `env.rs`), or `None` for keys inside a
/// list of tables, which only the whole list's variable sets.
pub fn env_name(key: &str) -> Option<String> {
    if key.contains("[]") {
        return None;
    }
    Some(format!("TQ_{}", key.replace('.', "_").to_uppercase()))
}

/// The default of `key` as TOML, from `Config::default()` (`None`: unset).
fn default_of(defaults: &toml::Table, key: &str) -> Option<String> {
    let mut at = defaults;
    let parts: Vec<&str> = key.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let value = at.get(part.trim_end_matches("[]"))?;
        if last {
            return Some(value.to_string());
        }
        at = match value {
            toml::Value::Table(t) => t,
            toml::Value::Array(items) => items.first()?.as_table()?,
            _ => return None,
        };
    }
    None
}

/// The reference page (Markdown).
pub fn reference_markdown() -> String {
    let defaults = toml::Table::try_from(Config::default()).unwrap_or_default();
    let mut out = String::from(
        "# Configuration reference\n\n\
         <!-- Generated by `tq config reference` from tq-client/src/config/reference.rs and \
         `Config::default()`; a test fails when this file differs. Do not edit by hand. -->\n\n\
         Servers and clients read the same TOML file (`--config FILE`). Every key can be \
         overridden by an environment variable: `TQ_` and the key's path in upper case with `_` \
         between the parts; flags override both. An unknown key, in the file or in a \
         `TQ_CONTROLLER_*` / `TQ_STORAGE_*` / `TQ_NET_*` variable, is an error, and so is a \
         setting the chosen backend would ignore. `tq config check FILE` checks a file (with \
         the environment applied) as a controller would at start.\n",
    );
    let mut section = "";
    for k in KEYS {
        let (table, name) = k.key.rsplit_once('.').unwrap_or(("", k.key));
        if table != section {
            section = table;
            let header = match table.strip_suffix("[]") {
                Some(list) => format!("[[{list}]]"),
                None => format!("[{table}]"),
            };
            out.push_str(&format!(
                "\n## `{header}`\n\n| key | default | environment | meaning |\n|---|---|---|---|\n"
            ));
        }
        let default =
            default_of(&defaults, k.key).map_or("unset".to_string(), |d| format!("`{d}`"));
        let env = env_name(k.key).map_or("—".to_string(), |e| format!("`{e}`"));
        let doc = k.doc.split_whitespace().collect::<Vec<_>>().join(" ");
        out.push_str(&format!("| `{name}` | {default} | {env} | {doc} |\n"));
    }
    out
}
