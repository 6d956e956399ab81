"""One tq.compat ``kv_batch_get`` of 1024 x 4 KiB under Ray, repeated, for A/B runs of two
wheels (the table of ``compat.py`` moves with TransferQueue's own noise; this does not run it).

    python python/benchmarks/get_loop.py --seconds 8            # the same keys read again and again
    python python/benchmarks/get_loop.py --rounds 40 --after-put  # a put, then a get, as compat.py

The controller and its 2 units run in Ray actors, as in ``compat.py``'s Ray column. Prints the
median get in ms (with ``--after-put``: the first get after each put, a second one straight
after it, and a third after 2 ms idle). Run it with each wheel installed in turn, alternating.

Its floor, measured between the gets of the same run: ``memcpy`` of the same 4 MiB with
``numpy.copyto`` into a buffer used before, and into a new one (as a get's answer is: the
kernel's page faults included).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compat  # noqa: E402  (how the benchmarks here start Ray and tq.compat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="how long to repeat the get")
    parser.add_argument("--after-put", action="store_true", help="put before each round of gets")
    parser.add_argument("--rounds", type=int, default=40, help="rounds with --after-put")
    parser.add_argument("--allow-debug", action="store_true", help="run on a debug build (smoke test only)")
    args = parser.parse_args()
    compat.refuse_debug_build(args.allow_debug)

    import numpy as np
    import ray
    import torch
    from tensordict import TensorDict

    ray.init(**compat.RAY_INIT)
    import tq.compat as tq_api

    tq_api.init(compat.TQ_COMPAT_RAY_CONF)
    n, size = 1024, 4096
    keys = [f"k{i}" for i in range(n)]
    data = TensorDict({"x": torch.randint(0, 255, (n, size), dtype=torch.uint8)}, batch_size=[n])

    def timed() -> float:
        t = time.perf_counter()
        back = tq_api.kv_batch_get(keys=keys, partition_id="bench")
        took = time.perf_counter() - t
        assert back["x"].shape == (n, size)
        return took

    source = data["x"].numpy()
    reused = np.empty_like(source)
    warm, fresh = [], []

    def copies() -> None:
        t = time.perf_counter()
        np.copyto(reused, source)
        warm.append(time.perf_counter() - t)
        t = time.perf_counter()
        target = np.empty_like(source)
        np.copyto(target, source)
        fresh.append(time.perf_counter() - t)

    def ms(values: list) -> str:
        return f"{statistics.median(values) * 1e3:.3f}"

    try:
        if args.after_put:
            first, second, idle = [], [], []
            for _ in range(args.rounds):
                tq_api.kv_batch_put(keys=keys, partition_id="bench", fields=data)
                first.append(timed())
                second.append(timed())
                time.sleep(0.002)
                idle.append(timed())
                copies()
                tq_api.kv_clear(keys=keys, partition_id="bench")
            print(f"get after a put {ms(first)} ms, straight again {ms(second)} ms, after 2 ms idle {ms(idle)} ms")
        else:
            tq_api.kv_batch_put(keys=keys, partition_id="bench", fields=data)
            gets = []
            start = time.time()
            while time.time() - start < args.seconds:
                gets.append(timed())
                copies()
            print(f"get {ms(gets)} ms (median of {len(gets)})")
        print(f"floor: memcpy {ms(warm)} ms into a buffer used before, {ms(fresh)} ms into a new one")
    finally:
        tq_api.close()
        ray.shutdown()


if __name__ == "__main__":
    main()
