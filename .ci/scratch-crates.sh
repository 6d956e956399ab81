#!/usr/bin/env bash
# Builds throwaway crates outside the workspace that depend only on `tq` (a path dependency),
# one per feature set, and runs a put/get with each: what a downstream user does. Also checks
# that a backend's dependencies are compiled only with its feature.
#
# Usage: .ci/scratch-crates.sh [feature-set ...]   (default: simple ssd object-store redis)
# `redis` needs a running redis-server; TQ_SCRATCH_REDIS_URL says where (default: starts one on
# a free loopback port).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
sets=("$@")
[ ${#sets[@]} -eq 0 ] && sets=(simple ssd object-store redis)
work="$(mktemp -d)"
redis_pid=""
cleanup() {
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# Share the workspace's build directory and lock file so unchanged dependencies are reused.
export CARGO_TARGET_DIR="$repo/target"

for set in "${sets[@]}"; do
  dir="$work/scratch-$set"
  mkdir -p "$dir/src"
  cp "$repo/Cargo.lock" "$dir/Cargo.lock"
  cat >"$dir/Cargo.toml" <<TOML
[package]
name = "scratch-$set"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
tq = { path = "$repo/tq", default-features = false, features = ["$set"] }
tokio = { version = "1", features = ["rt-multi-thread", "macros"] }

[workspace]
TOML
  config='tq::Config::default()'
  case "$set" in
    ssd) config="tq::Config::from_toml(&format!(\"[storage.ssd]\\nenabled = true\\npath = \\\"{}\\\"\\nthreshold_bytes = 8\\n\", std::env::temp_dir().join(\"tq-scratch-ssd\").display()))?" ;;
    object-store) config="tq::Config::from_toml(&format!(\"[storage]\\nbackend = \\\"kv\\\"\\n[storage.kv]\\nstores = [{{ url = \\\"file://{}\\\" }}]\\n\", std::env::temp_dir().join(\"tq-scratch-objects\").display()))?" ;;
    redis) config="tq::Config::from_toml(&format!(\"[storage]\\nbackend = \\\"kv\\\"\\n[storage.kv]\\nstores = [{{ url = \\\"{}\\\" }}]\\n\", std::env::var(\"TQ_SCRATCH_REDIS_URL\").unwrap()))?" ;;
  esac
  cat >"$dir/src/main.rs" <<RUST
use tq::{Batch, Client, Column, Tensor};

#[tokio::main]
async fn main() -> tq::Result<()> {
    let tq = Client::builder().config($config).build()?;
    let batch = Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![2, 3], &[1i64, 2, 3, 4, 5, 6])?),
    )])?;
    let p = tq.partition("scratch");
    p.kv_batch_put(&["a", "b"], &batch, None).await?;
    let back = p.kv_batch_get(&["a", "b"], Some(&["x"])).await?;
    assert_eq!(back.column("x"), batch.column("x"));
    p.kv_clear(&["a", "b"]).await?;
    println!("scratch-$set: put/get through tq on {} ok", tq.storage().name());
    // Every type a call needs is named through the facade alone.
    let _: fn(&tq::Partition) -> &str = tq::Partition::name;
    let _: fn(
        std::sync::Arc<dyn tq::control::ControlPlane>,
        std::sync::Arc<dyn tq::storage::StorageManager>,
        tq::Config,
    ) -> Client = Client::from_parts;
    let _: Option<tq::LeaseId> = tq::BatchMeta::default().lease();
    Ok(())
}
RUST
  tree="$(cd "$dir" && cargo tree -e normal --prefix none)"
  if [ "$set" != ssd ] && grep -q '^io-uring ' <<<"$tree"; then
    echo "scratch-$set: io-uring is compiled without the ssd feature" >&2; exit 1
  fi
  if [ "$set" != redis ] && grep -q '^redis ' <<<"$tree"; then
    echo "scratch-$set: redis is compiled without the redis feature" >&2; exit 1
  fi
  if [ "$set" = redis ] && [ -z "${TQ_SCRATCH_REDIS_URL:-}" ]; then
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
    redis_pid=$!
    for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    export TQ_SCRATCH_REDIS_URL="redis://127.0.0.1:$port"
  fi
  (cd "$dir" && cargo run -q)
done
