"""The asyncio variants: real coroutines on tq's runtime, many at once, cancellable."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import tq


def test_many_coroutines_share_one_client(client: tq.Client) -> None:
    p = client.partition("aio-many")

    async def one(i: int) -> np.ndarray:
        keys = [f"k{i}-{j}" for j in range(4)]
        await p.async_kv_batch_put(keys, {"x": np.full((4, 8), i, dtype=np.int32)})
        got = await p.async_kv_batch_get(keys)
        return got["x"]

    async def main() -> list:
        return await asyncio.gather(*(one(i) for i in range(64)))

    results = asyncio.run(main())
    for i, x in enumerate(results):
        assert x.shape == (4, 8) and (x == i).all()
    assert len(p.kv_list()) == 256


def test_a_waiting_fetch_leaves_the_event_loop_free(client: tq.Client) -> None:
    p = client.partition("aio-wait")

    async def main() -> int:
        waiting = asyncio.ensure_future(p.async_fetch(["x"], task="t", batch_size=1, timeout=20))
        await asyncio.sleep(0)  # one turn of the loop: the fetch is now waiting
        # Runs only if the waiting fetch left the loop free (else the fetch times out).
        await p.async_put({"x": np.ones((1, 2))})
        meta = await waiting
        data = await client.async_get_data(meta)
        await client.async_clear_samples(meta)
        return int(data["x"].sum())

    assert asyncio.run(main()) == 2


def test_a_cancelled_fetch_takes_nothing(client: tq.Client) -> None:
    p = client.partition("aio-cancel")
    p.put({"x": np.zeros((1, 1))})

    async def main() -> None:
        waiting = asyncio.ensure_future(p.async_fetch(["x"], task="t", batch_size=2, timeout=30))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())
    p.put({"x": np.zeros((1, 1))})
    # Both samples are still there for the task: the cancelled fetch consumed none.
    assert len(p.fetch(["x"], task="t", batch_size=2, timeout=0)) == 2


def test_errors_and_a_closed_client_reach_the_coroutine() -> None:
    c = tq.Client.embedded()
    p = c.partition("aio-errors")

    async def main() -> None:
        with pytest.raises(tq.NotFoundError):
            await p.async_kv_batch_get(["absent"])
        waiting = asyncio.ensure_future(p.async_fetch(["x"], task="t", batch_size=1, timeout=30))
        await asyncio.sleep(0)
        c.close()  # the operation is dropped with the runtime; its coroutine is told
        with pytest.raises(tq.ClosedError):
            await waiting
        with pytest.raises(tq.ClosedError):
            await p.async_kv_list()

    asyncio.run(main())


def test_every_async_variant_answers_as_its_blocking_twin(client: tq.Client) -> None:
    p = client.partition("aio-all")

    async def main() -> None:
        await p.async_kv_put("k", {"x": np.arange(3), "s": "text"}, tags={"n": 1})
        assert (await p.async_kv_get("k"))["s"] == "text"
        assert await p.async_kv_list() == {"k": {"n": 1}}
        await p.async_kv_clear_fields(["k"], ["s"])
        assert sorted((await p.async_kv_get("k")).keys()) == ["x"]
        await p.async_kv_clear(["k"])
        await p.async_kv_set_tags(["t"], [{"a": 1}])
        assert await p.async_kv_tags(["t"]) == [{"a": 1}]
        await p.async_kv_put("u", {"x": np.array([1, 2])})
        await p.async_kv_update(["u"], {"x": np.array([[1, 1]])}, "add")
        assert (await p.async_kv_get("u"))["x"].tolist() == [2, 3]
        await client.partition("__public__/aio").async_kv_put("src", {"s": np.arange(2)})
        await p.async_kv_link(["v"], ["src"], ["s"], public_partition="__public__/aio")
        assert (await p.async_kv_get("v"))["s"].tolist() == [0, 1]
        assert await p.async_kv_unlink(["v"], ["s"]) == 1
        await client.partition("__public__/aio").async_kv_clear(["src"])
        await p.async_kv_clear(["t", "u", "v"])
        meta = await p.async_put({"y": np.zeros((2, 1))})
        await client.async_put(meta, {"z": np.ones((2, 1))})
        assert (await p.async_production_status(["y", "z"]))["produced"] == [[True, True]] * 2
        leased = await p.async_fetch(["y", "z"], task="t", batch_size=2, lease=30)
        assert await client.async_ack("t", leased) == 2
        assert (await p.async_consumption_status("t"))["consumed"] == [True, True]
        await p.async_complete()
        assert "aio-all" in await client.async_list_partitions()
        await p.async_clear()
        assert "aio-all" not in await client.async_list_partitions()

    asyncio.run(main())
