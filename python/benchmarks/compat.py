"""The standard KV workloads through ``tq.compat``, next to TransferQueue 0.1.11 running the
very same code with the other import, measured in the same run.

    pip install ./python "transferqueue==0.1.11"      # both in one environment (with torch, ray)
    python python/benchmarks/compat.py --reps 5
    python python/benchmarks/compat.py --reps 5 --units 1   # one storage unit for both (default 2)
    python python/benchmarks/compat.py --reps 5 --rounds 5  # ratios paired per round (to quote)

Each implementation runs in a process of its own (``--worker``), which imports it as
``tq_api`` (``import tq.compat as tq_api`` or ``import transfer_queue as tq_api``) and runs:

- ``put 4 KiB`` / ``get 4 KiB``: ``kv_batch_put`` of 1024 keys x one 4 KiB uint8 field (a
  TensorDict), then ``kv_batch_get`` of them, then ``kv_clear``;
- ``put 1 MiB`` / ``get 1 MiB``: the same with 32 keys x 1 MiB;
- ``round trip``: ``kv_put`` of one 4 KiB sample and ``kv_batch_get`` of it (median of 200).

Each row also shows its floor. For the data rows that is ``memcpy``: one ``numpy.copyto`` of
the same bytes. For the round trip it is the four request/answer exchanges a tq round trip
makes (put: reserve, write, notice; get: read, with the key cache), with the same sizes (the
4 KiB going out in the second and back in the fourth), over loopback TCP to a plain echo thread
that sleeps between messages, in a Ray actor's process (where tq.compat's controller and units
are). tq's round trip under Ray cannot take less than that; on VMs whose idle cores halt, most
of it is waking the other side. In process there is no such floor to print: tq.compat's servers
are then native threads of the worker's process that never take the GIL, while a Python echo
thread there must, on every message (it took 0.33-0.39 ms for the four exchanges, against
0.03-0.04 ms for tq's whole round trip), so that cell shows a dash.

Deployments: ``tq.compat`` in process (no Ray: the controller and its 2 storage units serve
over loopback from the driver's process), ``tq.compat`` under Ray (controller and units in
actors, other processes), and TransferQueue under Ray (its only deployment). It prints medians
(min-max) in ms, the floors, and the TransferQueue / tq.compat ratios; figures and the command
go in a dated file of docs/benchmarks/log/ and the table in docs/benchmarks.md.

``--rounds N`` runs the three deployments N times, one after the other in each round, so that
a slow minute of the VM hits both implementations of a round alike. The table then shows the
medians over the rounds, each ratio is the median of the rounds' own ratios (TransferQueue
against tq.compat of the same round), and a last block gives every round's ratio under Ray
with how many rounds met the issue's goal (:data:`GOALS`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List

WORKLOADS = [("4 KiB", 1024, 4 * 1024), ("1 MiB", 32, 1024 * 1024)]
ROUND_TRIPS = 200
DEPLOYMENTS = [("tq.compat", False), ("tq.compat", True), ("transfer_queue", True)]

#: The ratios (TransferQueue / tq.compat) the compatibility issue asks for: the Rust side's.
GOALS: Dict[str, float] = {
    "put 4 KiB": 6.0,
    "get 4 KiB": 20.0,
    "put 1 MiB": 2.0,
    "get 1 MiB": 2.0,
    "round trip 4 KiB": 30.0,
}


#: ``ray.init`` as every benchmark here starts Ray. Logical CPUs: TransferQueue reserves one per
#: actor (controller + 2 units), more than this 2-core machine has; both implementations run
#: under the same setting.
RAY_INIT: Dict[str, Any] = dict(namespace="tq-bench", num_cpus=4, include_dashboard=False, log_to_driver=False)

#: tq.compat's ``init`` under Ray: its actors serve on loopback.
TQ_COMPAT_RAY_CONF: Dict[str, Any] = {"backend": {"tq": {"host": "127.0.0.1"}}}


def _median_ms(times: List[float]) -> List[float]:
    return [statistics.median(times) * 1e3, min(times) * 1e3, max(times) * 1e3]


#: The exchanges of one tq round trip with the key cache, as (request, answer) bytes: the
#: put's reservation, its write of the 4 KiB, its production notice, then the get's read.
EXCHANGES = [(64, 64), (4096, 64), (64, 64), (64, 4096)]


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = conn.recv(n)
        if not chunk:
            raise ConnectionError("echo peer closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _serve_echo(listener: socket.socket) -> None:
    """Answers each request (8-byte header: request length, answer length) with the asked
    number of bytes; blocks in ``recv`` (the thread sleeps) between requests."""
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    answers: Dict[int, bytes] = {}
    with conn:
        while True:
            try:
                size, answer = struct.unpack("<II", _recv_exactly(conn, 8))
                _recv_exactly(conn, size)
            except ConnectionError:
                return
            conn.sendall(answers.setdefault(answer, bytes(answer)))


def start_echo() -> int:
    """A loopback echo server on a thread of this process; returns its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_serve_echo, args=(listener,), daemon=True).start()
    return listener.getsockname()[1]


class EchoActor:
    """Under Ray: the echo server in an actor's process, as tq.compat's servers are."""

    def start(self) -> int:
        return start_echo()


def raw_round_trips(port: int, rounds: int) -> List[float]:
    """Seconds per round of the four :data:`EXCHANGES` with the echo server at ``port``."""
    conn = socket.create_connection(("127.0.0.1", port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # Built once: the timed loop only sends and receives.
    requests = [(struct.pack("<II", size, answer) + bytes(size), answer) for size, answer in EXCHANGES]
    times = []
    with conn:
        for i in range(rounds + 10):
            t = time.perf_counter()
            for request, answer in requests:
                conn.sendall(request)
                _recv_exactly(conn, answer)
            if i >= 10:
                times.append(time.perf_counter() - t)
    return times


def worker(impl: str, ray_mode: bool, reps: int, units: int = 2) -> Dict[str, Any]:
    """One implementation's figures (run in its own process), with ``units`` storage units."""
    import numpy as np
    import torch
    from tensordict import TensorDict

    if ray_mode:
        import ray

        ray.init(**RAY_INIT)
    # The original's own key, which both implementations read.
    storage = {"backend": {"SimpleStorage": {"num_data_storage_units": units}}}
    if impl == "tq.compat":
        import tq.compat as tq_api

        conf = dict(storage, backend=dict(storage["backend"], **TQ_COMPAT_RAY_CONF["backend"])) if ray_mode else storage
        tq_api.init(conf)
    else:
        import transfer_queue as tq_api

        tq_api.init(storage)
    out: Dict[str, Any] = {}
    try:
        for name, n, size in WORKLOADS:
            keys = [f"k{i}" for i in range(n)]
            data = TensorDict({"x": torch.randint(0, 255, (n, size), dtype=torch.uint8)}, batch_size=[n])
            floor = np.empty((n, size), dtype=np.uint8)
            source = data["x"].numpy()
            puts, gets, copies = [], [], []
            for rep in range(reps + 1):  # the first round warms up
                t = time.perf_counter()
                tq_api.kv_batch_put(keys=keys, partition_id="bench", fields=data)
                put = time.perf_counter() - t
                t = time.perf_counter()
                back = tq_api.kv_batch_get(keys=keys, partition_id="bench")
                get = time.perf_counter() - t
                assert len(back["x"]) == n, back["x"].shape
                tq_api.kv_clear(keys=keys, partition_id="bench")
                t = time.perf_counter()
                np.copyto(floor, source)
                copy = time.perf_counter() - t
                if rep:
                    puts.append(put)
                    gets.append(get)
                    copies.append(copy)
            out[f"put {name}"] = _median_ms(puts)
            out[f"get {name}"] = _median_ms(gets)
            out[f"memcpy {name}"] = _median_ms(copies)
        one = {"x": torch.randint(0, 255, (4096,), dtype=torch.uint8)}
        trips = []
        for i in range(ROUND_TRIPS + 10):
            t = time.perf_counter()
            tq_api.kv_put(key="rt", partition_id="trip", fields=one)
            tq_api.kv_batch_get(keys=["rt"], partition_id="trip")
            if i >= 10:
                trips.append(time.perf_counter() - t)
        out["round trip 4 KiB"] = _median_ms(trips)
        if ray_mode:
            import ray

            actor = ray.remote(num_cpus=0)(EchoActor).remote()
            port = ray.get(actor.start.remote())
            out["floor round trip 4 KiB"] = _median_ms(raw_round_trips(port, ROUND_TRIPS))
    finally:
        tq_api.close()
        if ray_mode:
            import ray

            ray.shutdown()
    return out


def refuse_debug_build(allow: bool) -> None:
    """Exits with status 2 when tq's native module is a debug build, unless ``allow``.

    A debug build's figures are several times a release build's (a 4 KiB get under Ray took
    7 ms against 1.5), and one is easy to have without knowing: ``scripts/test.sh`` installs a
    debug build into the shared virtual environment these benchmarks run in. Every benchmark
    here calls this first; ``--allow-debug`` is for a smoke test."""
    from tq import _native

    if _native.debug_build and not allow:
        print(
            "tq's native module is a debug build (scripts/test.sh installs one): install a release "
            "build with `pip install --force-reinstall --no-deps ./python`, or pass --allow-debug "
            "for a smoke test",
            file=sys.stderr,
        )
        raise SystemExit(2)


def deployment_label(impl: str, ray_mode: bool) -> str:
    """A deployment's column header, e.g. ``tq.compat (Ray)``."""
    return f"{impl} ({'Ray' if ray_mode else 'in process'})"


def run_worker(impl: str, ray_mode: bool, reps: int, units: int) -> Dict[str, Any]:
    """One deployment's figures, from a worker process of its own."""
    label = deployment_label(impl, ray_mode)
    done = subprocess.run(
        [sys.executable, __file__, "--reps", str(reps), "--units", str(units), "--worker", impl, "ray" if ray_mode else "local"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    if done.returncode != 0:
        sys.exit(f"{label} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(rounds: List[Dict[str, Dict[str, Any]]], reps: int, units: int) -> None:
    """The table (medians over the rounds; each ratio the median of the rounds' ratios) and,
    under Ray, every round's ratio against :data:`GOALS`."""
    labels = list(rounds[0])
    original = labels[-1]
    figures = rounds[0][labels[0]]
    rows = [r for r in figures if not r.startswith(("memcpy", "floor"))]

    def over_rounds(label: str, key: str) -> List[float]:
        return [statistics.median(r[label][key][0] for r in rounds)] + [
            min(r[label][key][1] for r in rounds),
            max(r[label][key][2] for r in rounds),
        ]

    def ratios(label: str, row: str) -> List[float]:
        return [r[original][row][0] / r[label][row][0] for r in rounds]

    print(f"reps={reps}, units={units}, rounds={len(rounds)}, medians (min-max) in ms\n")
    print("| workload | " + " | ".join(labels) + " | floor (in process, Ray) | TransferQueue / tq.compat (in process, Ray) |")
    print("|---" * (len(labels) + 3) + "|")
    for row in rows:
        cells = []
        for label in labels:
            median, low, high = over_rounds(label, row)
            cells.append(f"{median:.3f} ({low:.3f}-{high:.3f})")
        floor_key = "floor " + row if row.startswith("round") else "memcpy " + row.split(" ", 1)[1]
        floor = ", ".join(
            f"{statistics.median(r[l][floor_key][0] for r in rounds):.3f}" if floor_key in rounds[0][l] else "-"
            for l in labels[:-1]
        )
        ratio = ", ".join(f"{statistics.median(ratios(l, row)):.1f}x" for l in labels[:-1])
        print(f"| {row} | " + " | ".join(cells) + f" | {floor} | {ratio} |")
    under_ray = next((l for l in labels[:-1] if "Ray" in l), None)
    if under_ray is None:
        return
    print(f"\nTransferQueue / {under_ray}, round by round, against the goals:\n")
    for row in rows:
        goal = GOALS.get(row)
        each = ratios(under_ray, row)
        met = "" if goal is None else f"; >= {goal:g}x in {sum(x >= goal for x in each)} of {len(each)}"
        print(f"  {row:<17} " + " ".join(f"{x:5.1f}x" for x in each) + met)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--units", type=int, default=2, help="storage units (the original's default: 2)")
    parser.add_argument("--rounds", type=int, default=1, help="times to run the three deployments, alternating")
    parser.add_argument("--allow-debug", action="store_true", help="run on a debug build (smoke test only)")
    parser.add_argument("--worker", nargs=2, metavar=("IMPL", "RAY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        impl, ray_mode = args.worker
        print(json.dumps(worker(impl, ray_mode == "ray", args.reps, args.units)))
        return
    if args.rounds < 1:
        sys.exit("--rounds must be at least 1")
    refuse_debug_build(args.allow_debug)
    rounds: List[Dict[str, Dict[str, Any]]] = []
    for _ in range(args.rounds):
        rounds.append(
            {
                deployment_label(impl, ray_mode): run_worker(impl, ray_mode, args.reps, args.units)
                for impl, ray_mode in DEPLOYMENTS
            }
        )
    report(rounds, args.reps, args.units)


if __name__ == "__main__":
    main()
