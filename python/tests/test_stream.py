"""Streams as iterators and async iterators, the dataset in worker processes (fork and spawn),
and clients across a fork."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from typing import List

import numpy as np
import pytest

import _workers
import tq


def _fill(p: tq.Partition, n: int) -> None:
    p.put({"x": np.arange(n, dtype=np.int64).reshape(n, 1)})
    p.complete()


def test_a_stream_yields_every_batch_and_ends_with_the_partition(client: tq.Client) -> None:
    p = client.partition("stream")
    _fill(p, 10)
    sizes, values = [], []
    for meta, data in p.stream(["x"], task="t", batch_size=4):
        sizes.append(len(meta))
        values += data["x"][:, 0].tolist()
    assert sizes == [4, 4, 2]
    assert values == list(range(10))


def test_streams_of_one_task_share_the_samples(client: tq.Client) -> None:
    p = client.partition("shared")
    p.put({"x": np.arange(200, dtype=np.int64).reshape(200, 1)})
    got: List[List[int]] = [[], []]

    def consume(i: int) -> None:
        for _, data in p.stream(["x"], task="t", batch_size=3):
            got[i] += data["x"][:, 0].tolist()

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    p.put({"x": np.arange(200, 300, dtype=np.int64).reshape(100, 1)})
    p.complete()
    for t in threads:
        t.join()
    assert sorted(got[0] + got[1]) == list(range(300))


def test_a_leased_batch_left_unfinished_comes_back(client: tq.Client) -> None:
    p = client.partition("leased")
    _fill(p, 6)
    first = p.stream(["x"], task="t", batch_size=2, lease=0.5)
    meta, data = next(first)
    abandoned = data["x"][:, 0].tolist()
    first.close()  # the consumer dies with its batch: never acknowledged
    rest: List[int] = []
    for _, data in p.stream(["x"], task="t", batch_size=2, lease=30):
        rest += data["x"][:, 0].tolist()
    # Everything is consumed once acknowledged, the abandoned batch after its lease ran out.
    assert sorted(rest) == list(range(6))
    assert set(abandoned) <= set(rest)
    assert p.consumption_status("t")["consumed"] == [True] * 6


def test_an_async_stream(client: tq.Client) -> None:
    p = client.partition("astream")
    _fill(p, 7)

    async def main() -> List[int]:
        out: List[int] = []
        async for _, data in p.async_stream(["x"], task="t", batch_size=3):
            out += data["x"][:, 0].tolist()
        return out

    assert asyncio.run(main()) == list(range(7))


def test_an_idle_stream_gives_up_when_told(client: tq.Client) -> None:
    p = client.partition("idle")
    p.put({"x": np.zeros((1, 1))})
    with pytest.raises(tq.TimeoutError):
        for _ in p.stream(["x"], task="t", batch_size=2, idle_timeout=0.3):
            pass


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_dataset_in_worker_processes_hands_each_sample_out_once(served: str, method: str) -> None:
    with tq.connect(served) as c:
        p = c.partition(f"dataset-{method}")
        _fill(p, 240)
        dataset = tq.StreamingDataset(served, p.name, ["x"], task="train", batch_size=4)
        ctx = multiprocessing.get_context(method)
        with ctx.Pool(2) as pool:
            parts = pool.map(_workers.consume, [dataset, dataset])
        assert sorted(parts[0] + parts[1]) == list(range(240))
        p.clear()


def test_a_forked_child_makes_its_own_client(client: tq.Client) -> None:
    client.partition("parent").kv_put("k", {"x": np.zeros(1)})
    _workers.INHERITED = client
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_workers.check_inherited, args=(out,))
    child.start()
    result = out.get(timeout=120)
    child.join(timeout=120)
    assert child.exitcode == 0
    assert result == ("refused", [0, 1, 2])
    # The parent's client is untouched by the child.
    assert "parent" in client.list_partitions()
