#!/usr/bin/env bash
# The whole test suite: the Rust workspace, then the Python package as a user installs it
# (`pip install ./python` into a virtual environment) under pytest, against real processes.
#
#   bash scripts/test.sh
#
# Environment: TQ_VENV (where the virtual environment lives; default: the shared torch venv
# when present, else target/python-venv, made on first use and reused), TQ_REQUIRE_REDIS /
# TQ_REQUIRE_URING / TQ_REQUIRE_TORCH / TQ_REQUIRE_RAY / TQ_REQUIRE_TUTORIALS (fail instead of
# skipping the Redis, io_uring, torch, Ray and TransferQueue-tutorial tests, as CI does).
# Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

FEATURES="tq/ssd,tq/redis,tq/object-store,tq/testkit,tq/metrics,tq-cli/bench,tq-cli/soak,tq-cli/redis,tq-cli/object-store"
echo "== Rust: cargo test --workspace --features $FEATURES"
cargo test --workspace --features "$FEATURES" "$@"

echo "== Python: pip install ./python, then pytest python/tests"
# With torch: the shared venv CI keeps ($HOME/.cache/tq/venv-torch, see .ci/run) when it is
# there; torch pulls several GiB, so it is installed once per machine, not per run.
torch_venv="$HOME/.cache/tq/venv-torch"
if [ -z "${TQ_VENV:-}" ] && [ -x "$torch_venv/bin/python" ] && "$torch_venv/bin/python" -c "import torch, tensordict" 2>/dev/null; then
  TQ_VENV="$torch_venv"
fi
venv="${TQ_VENV:-$root/target/python-venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q numpy pytest
# The dev profile reuses what `cargo test` just built (a release build of the extension would
# compile everything again); `pip install ./python` on its own builds the release one.
MATURIN_PEP517_ARGS="--profile dev" "$venv/bin/python" -m pip install -q --force-reinstall --no-deps ./python
# The remote tests start the `tq` that the cargo test above built, and must not skip.
[ -x "$root/target/debug/tq" ] || cargo build -q -p tq-cli
cd "$root/python/tests"
TQ_BIN="$root/target/debug/tq" TQ_REQUIRE_SERVE=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider .
