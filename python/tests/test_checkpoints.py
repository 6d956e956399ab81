"""Status and checkpoints from Python."""

from __future__ import annotations

import asyncio
import pathlib

import numpy as np
import pytest

import tq


def test_status_shows_partitions_and_units(client: tq.Client) -> None:
    client.partition("seen").kv_batch_put(["a", "b", "c"], {"x": np.zeros((3, 4))})
    status = client.status()
    assert status["storage_backend"] == "simple"
    partitions = {p["name"]: p for p in status["controller"]["partitions"]}
    assert partitions["seen"]["samples"] == 3
    assert len(status["units"]) == 2


def test_a_checkpoint_restores_keys_and_payloads(tmp_path: pathlib.Path) -> None:
    where = tmp_path / "ckpt"
    data = np.arange(24, dtype=np.float32).reshape(6, 4)
    with tq.Client.embedded() as first:
        p = first.partition("train")
        p.kv_batch_put([f"k{i}" for i in range(6)], {"x": data, "text": list("abcdef")}, tags=[{"i": i} for i in range(6)])
        manifest = first.save_checkpoint(where)
    assert manifest["counts"]["samples"] == 6
    with tq.Client.embedded() as second:
        loaded = second.load_checkpoint(where)
        assert loaded["epoch"] == manifest["epoch"]
        p = second.partition("train")
        back = p.kv_batch_get([f"k{i}" for i in range(6)])
        np.testing.assert_array_equal(back["x"], data)
        assert back["text"] == list("abcdef")
        assert p.kv_list()["k5"] == {"i": 5}
        # A second load into a controller that holds partitions is refused, nothing changed.
        with pytest.raises((tq.ConflictError, tq.InvalidError)) as again:
            second.load_checkpoint(where)
        assert "already holds" in str(again.value)
        assert len(p.kv_list()) == 6


def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path: pathlib.Path) -> None:
    where = tmp_path / "ckpt"
    with tq.Client.embedded() as c:
        c.partition("p").kv_put("k", {"x": np.zeros(8)})
        c.save_checkpoint(where)
    victim = next(f for f in sorted(where.rglob("*")) if f.is_file() and f.name != "MANIFEST.toml")
    blob = bytearray(victim.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    victim.write_bytes(bytes(blob))
    with tq.Client.embedded() as fresh:
        with pytest.raises(tq.CorruptedError) as bad:
            fresh.load_checkpoint(where)
        assert victim.name in str(bad.value)
        assert fresh.list_partitions() == []


def test_checkpoints_and_status_as_coroutines(client: tq.Client, tmp_path: pathlib.Path) -> None:
    client.partition("aio").kv_put("k", {"x": np.ones(2)})

    async def main() -> None:
        status = await client.async_status()
        assert any(p["name"] == "aio" for p in status["controller"]["partitions"])
        manifest = await client.async_save_checkpoint(tmp_path / "a")
        assert manifest["counts"]["samples"] == 1
        with tq.Client.embedded() as other:
            await other.async_load_checkpoint(tmp_path / "a")
            assert other.partition("aio").kv_get("k")["x"].tolist() == [1.0, 1.0]

    asyncio.run(main())
