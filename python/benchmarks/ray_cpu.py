"""Where the time and the CPU of tq.compat's calls under Ray go, next to their floors from the
same run: what ``compat.py``'s Ray column measures, taken apart.

    python python/benchmarks/ray_cpu.py round-trip --seconds 6
    python python/benchmarks/ray_cpu.py get --reps 100

The controller and its 2 units run in Ray actors, as in ``compat.py``'s Ray column.

- ``round-trip``: ``kv_put`` of one 4 KiB sample and ``kv_batch_get`` of it, repeated for
  ``--seconds``; prints the median, and the CPU each process (and each thread of the driver)
  used per round and how long its threads waited for a CPU while runnable, from
  ``/proc/*/task/*/schedstat``, then all processes' CPU against the machine's cores. Then the
  floor: the same four exchanges to a plain echo thread in a Ray actor (``compat.py``'s
  ``raw_round_trips``), counted the same way. A process that spins while it waits shows here
  as CPU beyond its share of the work; when the busy cores reach the machine's, threads with
  work wait for a CPU, and that wait is part of every round.
- ``get``: a 1024 x 4 KiB read taken apart, each step timed ``--reps`` times after a warm-up:
  the key lookup alone (the native ``kv_meta``), the storage read alone with that metadata
  (``get_data``), both as one native ``kv_batch_get``, and ``tq.compat.kv_batch_get`` (the
  same plus the TensorDict); the floor is ``numpy.copyto`` of the same 4 MiB. Then the read
  alone and the whole ``tq.compat`` get, each repeated for ``--seconds``, with the CPU each
  process used per get.

Medians in ms. It prints; the figures and the command go in a dated file of
docs/benchmarks/log/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compat  # noqa: E402  (Ray's setup, and the round trip floor's echo server and exchanges)

#: Per process (and per thread of the driver): microseconds run on a CPU (from ``stat``, which
#: for a process counts its ended threads too: the floor's echo thread ends with its connection)
#: and microseconds spent runnable but waiting for a CPU (``schedstat``, summed over the threads
#: still alive at the end).
Usage = Dict[Tuple[int, str], Tuple[float, float]]


def _cpu_us(path: str) -> float:
    with open(f"{path}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") * 1e6


def _comm(path: str) -> str:
    with open(f"{path}/comm") as f:
        return f.read().strip()


def _wait_us(path: str) -> float:
    with open(f"{path}/schedstat") as f:
        return int(f.read().split()[1]) / 1e3


def _threads_wait_us(path: str) -> float:
    """The run-queue wait of the threads of the process at ``path`` that are still there."""
    wait = 0.0
    try:
        tids = os.listdir(f"{path}/task")
    except OSError:  # the process ended meanwhile
        return wait
    for tid in tids:
        try:
            wait += _wait_us(f"{path}/task/{tid}")
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile
            pass
    return wait


def cpu_usage() -> Usage:
    """CPU time and run-queue wait of every process, and of every thread of this one. Threads
    that wait for a CPU while they have work are the sign of a machine with fewer cores than
    busy threads."""
    usage: Usage = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        path = f"/proc/{pid}"
        try:
            name = _comm(path)
            with open(f"{path}/cmdline", "rb") as f:
                # Ray names its workers' processes after the actor (``ray::TransferQueueController``);
                # the comm file's name is cut at 15 characters.
                title = f.read().split(b"\0")[0].decode(errors="replace")
            cpu = _cpu_us(path)
        except (OSError, ValueError, IndexError):  # the process ended meanwhile
            continue
        usage[(int(pid), os.path.basename(title) or name)] = (cpu, _threads_wait_us(path))
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        path = f"/proc/{os.getpid()}/task/{tid}"
        try:
            usage[(int(tid), "driver thread " + _comm(path))] = (_cpu_us(path), _wait_us(path))
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile
            continue
    return usage


def print_cpu(before: Usage, after: Usage, rounds: int, seconds: float) -> None:
    """The CPU and the run-queue wait per round of each process or driver thread that used at
    least 2 us of CPU per round, then all processes' CPU against the machine's cores."""
    used = {
        key: ((after[key][0] - before[key][0]) / rounds, (after[key][1] - before[key][1]) / rounds)
        for key in after
        if key in before
    }
    for (pid, name), (cpu, wait) in sorted(used.items(), key=lambda kv: -kv[1][0]):
        if cpu >= 2:
            print(f"  {name:<40} {pid:>7}  {cpu:8.1f} us CPU per round, {wait:7.1f} us waiting for a CPU")
    total = sum(cpu for (_, name), (cpu, _) in used.items() if not name.startswith("driver thread "))
    per_round = seconds / rounds * 1e6
    print(
        f"  all processes: {total:.1f} us CPU per round of {per_round:.1f} us: "
        f"{total / per_round:.2f} of the machine's {os.cpu_count()} cores busy"
    )


def timed_for(seconds: float, call: Callable[[], None]) -> Tuple[List[float], Usage, Usage, float]:
    """Times `call` repeatedly for `seconds`, with the CPU counters before and after and the
    seconds between them."""
    times: List[float] = []
    before = cpu_usage()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    return times, before, cpu_usage(), elapsed


def ms(times: List[float]) -> str:
    return f"{statistics.median(times) * 1e3:.3f}"


def round_trip(tq_api, seconds: float) -> None:
    import ray
    import torch

    one = {"x": torch.randint(0, 255, (4096,), dtype=torch.uint8)}

    def trip() -> None:
        tq_api.kv_put(key="rt", partition_id="trip", fields=one)
        tq_api.kv_batch_get(keys=["rt"], partition_id="trip")

    for _ in range(200):
        trip()
    times, before, after, elapsed = timed_for(seconds, trip)
    print(f"tq.compat round trip {ms(times)} ms (median of {len(times)})")
    print_cpu(before, after, len(times), elapsed)

    actor = ray.remote(num_cpus=0)(compat.EchoActor).remote()
    port = ray.get(actor.start.remote())
    # The echo serves one connection; raw_round_trips warms up on it before it times.
    before, start = cpu_usage(), time.perf_counter()
    raw = compat.raw_round_trips(port, len(times))
    after, elapsed = cpu_usage(), time.perf_counter() - start
    print(f"floor: the same 4 exchanges to an echo actor {ms(raw)} ms (median of {len(raw)})")
    print_cpu(before, after, len(raw), elapsed)


def get(tq_api, reps: int, seconds: float) -> None:
    import numpy as np
    import torch
    from tensordict import TensorDict

    n, size = 1024, 4096
    keys = [f"k{i}" for i in range(n)]
    data = TensorDict({"x": torch.randint(0, 255, (n, size), dtype=torch.uint8)}, batch_size=[n])
    tq_api.kv_batch_put(keys=keys, partition_id="bench", fields=data)
    native = tq_api._native()
    meta = native.kv_meta("bench", keys)
    source, target = data["x"].numpy(), np.empty((n, size), dtype=np.uint8)
    steps = {
        "key lookup (kv_meta)": lambda: native.kv_meta("bench", keys),
        "storage read (get_data)": lambda: native.get_data(meta),
        "native kv_batch_get": lambda: native.kv_batch_get("bench", keys),
        "tq.compat kv_batch_get": lambda: tq_api.kv_batch_get(keys=keys, partition_id="bench"),
        "floor: numpy.copyto of 4 MiB": lambda: np.copyto(target, source),
    }
    times: Dict[str, List[float]] = {name: [] for name in steps}
    for rep in range(reps + 10):
        # Interleaved, so that a slow moment of the VM hits every step alike.
        for name, step in steps.items():
            t = time.perf_counter()
            out = step()
            took = time.perf_counter() - t
            del out
            if rep >= 10:
                times[name].append(took)
    for name, values in times.items():
        print(f"{name:<30} {ms(values)} ms")
    for name in ("storage read (get_data)", "tq.compat kv_batch_get"):
        looped, before, after, elapsed = timed_for(seconds, steps[name])
        print(f"{name} alone for {seconds:g} s: {ms(looped)} ms (median of {len(looped)})")
        print_cpu(before, after, len(looped), elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["round-trip", "get"])
    parser.add_argument("--seconds", type=float, default=6.0, help="how long to repeat a call while its CPU is counted")
    parser.add_argument("--reps", type=int, default=100, help="timed repetitions of each get step")
    parser.add_argument("--allow-debug", action="store_true", help="run on a debug build (smoke test only)")
    args = parser.parse_args()
    compat.refuse_debug_build(args.allow_debug)

    import ray

    ray.init(**compat.RAY_INIT)
    import tq.compat as tq_api

    tq_api.init(compat.TQ_COMPAT_RAY_CONF)
    try:
        if args.what == "round-trip":
            round_trip(tq_api, args.seconds)
        else:
            get(tq_api, args.reps, args.seconds)
    finally:
        tq_api.close()
        ray.shutdown()


if __name__ == "__main__":
    main()
