"""The KV workloads through tq's Python API, next to the same workloads from Rust and numpy's
own copy of the same bytes, measured in the same run.

    pip install ./python              # a release build (the default)
    python python/benchmarks/kv.py --reps 5 [--tq-bin target/release/tq]

For each workload (N keys x one dense uint8 field of S bytes) and deployment (embedded, and a
`tq serve --units 2` on loopback when a tq binary is given or on PATH), each round puts the
keys, gets them back, and clears them:

- ``python``: ``Partition.kv_batch_put`` / ``kv_batch_get`` from Python (numpy in, numpy out);
  the put twice: as called by default, and with ``copy=False`` (the array handed over);
- ``rust``: the same calls on the same client from Rust, no Python in the loop
  (``tq._native.bench_kv``);
- ``numpy copy``: ``numpy.copyto`` of the same bytes (one memcpy).

It prints medians (min-max) in ms and the Python/Rust ratio. Figures and the command go in a
dated file of docs/benchmarks/log/ and the table in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from typing import List, Optional, Tuple

import numpy as np

import tq
from tq import _native

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compat  # noqa: E402  (refuse_debug_build, shared by the benchmarks here)

WORKLOADS = [("small", 1024, 4 * 1024), ("medium", 256, 64 * 1024), ("large", 32, 1024 * 1024)]


def _stats(times: List[float]) -> Tuple[float, float, float]:
    return statistics.median(times), min(times), max(times)


def _fmt(t: Tuple[float, float, float]) -> str:
    med, lo, hi = (x * 1e3 for x in t)
    return f"{med:.3f} ({lo:.3f}-{hi:.3f})"


def python_rounds(
    p: tq.Partition, keys: List[str], data: np.ndarray, reps: int, copy: Optional[bool] = None
) -> Tuple[List[float], List[float]]:
    puts, gets = [], []
    for _ in range(reps):
        t = time.perf_counter()
        p.kv_batch_put(keys, {"x": data}, copy=copy)
        puts.append(time.perf_counter() - t)
        t = time.perf_counter()
        back = p.kv_batch_get(keys, ["x"])["x"]
        gets.append(time.perf_counter() - t)
        if not np.array_equal(back, data):
            raise SystemExit("the Python get did not return what was put")
        p.kv_clear(keys)
    return puts, gets


def copy_rounds(data: np.ndarray, reps: int) -> List[float]:
    dst = np.empty_like(data)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, data)
        times.append(time.perf_counter() - t)
    return times


def measure(client: tq.Client, label: str, reps: int) -> None:
    print(f"\n## {label}\n")
    print("| workload | op | python ms | rust ms | python / rust | numpy copy ms |")
    print("|---|---|---|---|---|---|")
    for name, n, size in WORKLOADS:
        keys = [f"{name}-{i}" for i in range(n)]
        data = (np.arange(n * size, dtype=np.uint64) % 251).astype(np.uint8).reshape(n, size)
        p = client.partition(f"bench-{name}")
        # Warm-up round of each, then the measured ones, alternating Python and Rust.
        python_rounds(p, keys, data, 1)
        _native.bench_kv(client._native, p.name, keys, size, 1)
        # A second array for the handed-over puts (copy=False makes it read-only when embedded).
        given = data.copy()
        py_put, py_get, rs_put, rs_get, py_given = [], [], [], [], []
        for _ in range(reps):
            a, b = python_rounds(p, keys, data, 1)
            c, d = _native.bench_kv(client._native, p.name, keys, size, 1)
            e, _ = python_rounds(p, keys, given, 1, copy=False)
            py_put += a
            py_get += b
            rs_put += c
            rs_get += d
            py_given += e
        copy = _stats(copy_rounds(data, reps))
        for op, py_t, rs_t in (("put", py_put, rs_put), ("put, copy=False", py_given, rs_put), ("get", py_get, rs_get)):
            ps, rs = _stats(py_t), _stats(rs_t)
            print(f"| {name} ({n} x {size // 1024} KiB) | {op} | {_fmt(ps)} | {_fmt(rs)} | {ps[0] / rs[0]:.2f} | {_fmt(copy)} |")
        p.clear()


def _serve(binary: str) -> Tuple[subprocess.Popen, str]:
    env = dict(os.environ)
    env.pop("TQ_NET_TOKEN", None)
    proc = subprocess.Popen([binary, "serve", "--listen", "tcp://127.0.0.1:0", "--units", "2"], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("listening controller "):
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, line.split()[-1]
    raise SystemExit("tq serve did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tq-bin", help="the tq binary for the remote rows (default: tq on PATH)")
    parser.add_argument("--allow-debug", action="store_true", help="run on a debug build (smoke test only)")
    args = parser.parse_args()
    compat.refuse_debug_build(args.allow_debug)
    print(f"# tq Python API vs Rust, {args.reps} rounds each (python {sys.version.split()[0]}, numpy {np.__version__})")
    with tq.Client.embedded() as client:
        measure(client, "embedded (controller and 2 storage units in this process)", args.reps)
    # `--tq-bin ""` measures the embedded rows only.
    binary = shutil.which("tq") if args.tq_bin is None else args.tq_bin
    if binary:
        proc, url = _serve(binary)
        try:
            with tq.connect(url) as client:
                measure(client, f"remote: tq serve --units 2 on loopback ({url})", args.reps)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    else:
        print("\n(no tq binary: the remote rows were skipped; pass --tq-bin)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
