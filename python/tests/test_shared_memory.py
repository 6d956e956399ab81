"""Same-host shared memory (``net={"shared_memory": True}``) from Python against a real
``tq serve``: the arrays a get returns are views of the storage units' own pages."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import tq

from conftest import memfd_ranges, serve

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd segments are Linux only")


def _in_shared_memory(array: np.ndarray) -> bool:
    """Whether every byte of ``array`` lies in mappings of tq's segments."""
    at = array.__array_interface__["data"][0]
    end = at + array.nbytes
    for lo, hi in memfd_ranges():
        if lo <= at < hi:
            at = hi
    return at >= end


def test_a_same_host_get_returns_arrays_over_the_units_memory() -> None:
    keys = [f"k{i}" for i in range(64)]
    # 64 rows of 64 KiB: 2 MiB per unit, over the size from which puts go through a segment.
    data = np.random.default_rng(1).standard_normal((64, 16384)).astype(np.float32)
    ids = np.arange(64 * 8192, dtype=np.int64).reshape(64, 8192)
    with serve() as url:
        with tq.connect(url, net={"shared_memory": True}) as c, tq.connect(url) as tcp:
            p = c.partition("same-host")
            p.kv_batch_put(keys, {"x": data, "ids": ids})
            got = p.kv_batch_get(keys)
            np.testing.assert_array_equal(got["x"], data)
            np.testing.assert_array_equal(got["ids"], ids)
            # No copy: the column is the units' pages, mapped side by side copy-on-write, so
            # it is the reader's own: writable, and a write stays out of the store.
            assert _in_shared_memory(got["x"]) and _in_shared_memory(got["ids"])
            assert got["x"].flags.writeable and got["ids"].flags.writeable
            got["x"][0, 0] = 1234.5
            assert got["x"][0, 0] == 1234.5
            np.testing.assert_array_equal(p.kv_batch_get(keys[:2])["x"], data[:2])
            got["x"][0, 0] = data[0, 0]
            # Rows in another order, and a TCP-only client, read the same bytes.
            back = p.kv_batch_get(keys[::-1])["x"]
            np.testing.assert_array_equal(back, data[::-1])
            np.testing.assert_array_equal(tcp.partition("same-host").kv_batch_get(keys)["x"], data)
            # What a reader holds stays valid after the keys are cleared.
            p.kv_clear(keys)
            np.testing.assert_array_equal(got["x"], data)
            with pytest.raises(tq.TqError):
                p.kv_batch_get(keys[:1])


def test_small_puts_go_over_tcp_and_read_back_the_same() -> None:
    small = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    with serve() as url, tq.connect(url, net={"shared_memory": True}) as c:
        p = c.partition("small")
        p.kv_batch_put([f"s{i}" for i in range(8)], {"x": small})
        got = p.kv_batch_get([f"s{i}" for i in range(8)])["x"]
        np.testing.assert_array_equal(got, small)
        assert not _in_shared_memory(got)


def test_torch_views_a_same_host_column_without_copying_it() -> None:
    torch = pytest.importorskip("torch")
    keys = [f"t{i}" for i in range(32)]
    # 32 rows of 64 KiB, as test above: joined from the units' pages.
    data = np.random.default_rng(2).integers(0, 255, (32, 65536), dtype=np.uint8)
    with serve() as url:
        with tq.connect(url, net={"shared_memory": True}) as c:
            p = c.partition("same-host-torch")
            p.kv_batch_put(keys, {"x": data})
            got = p.kv_batch_get(keys, format="torch")["x"]
            assert isinstance(got, torch.Tensor)
            np.testing.assert_array_equal(got.numpy(), data)
            # torch tensors are writable: the mapped column is handed over as it is (no copy
            # out of the shared pages), and writing into it does not reach the store.
            assert _in_shared_memory(got.numpy())
            got[0, 0] = int(data[0, 0]) ^ 0xFF
            np.testing.assert_array_equal(p.kv_batch_get(keys[:1], format="torch")["x"].numpy(), data[:1])
