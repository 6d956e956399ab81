"""torch tensors and TensorDicts in and out (skipped only where torch is not installed;
CI requires them: TQ_REQUIRE_TORCH)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tq

if os.environ.get("TQ_REQUIRE_TORCH"):
    import torch
    import tensordict
else:
    torch = pytest.importorskip("torch")
    tensordict = pytest.importorskip("tensordict")


DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


@pytest.mark.parametrize("name", DTYPES)
def test_torch_dtypes_round_trip(client: tq.Client, name: str) -> None:
    dtype = getattr(torch, name)
    t = (torch.arange(24) % 5).to(dtype).reshape(4, 6)
    p = client.partition(f"torch-{name}")
    p.kv_batch_put(["a", "b", "c", "d"], {"x": t})
    back = p.kv_batch_get(["a", "b", "c", "d"], format="torch")["x"]
    assert back.dtype == dtype and back.shape == (4, 6)
    assert torch.equal(back, t)


def test_a_gathered_field_is_handed_to_torch_without_a_copy(client: tq.Client) -> None:
    p = client.partition("torch-view")
    keys = [f"k{i}" for i in range(16)]
    p.kv_batch_put(keys, {"x": torch.randn(16, 256)})
    as_numpy = p.kv_batch_get(keys)["x"]
    # 16 KiB: a fresh buffer of the read's own, so torch may view it.
    assert as_numpy.base.writable
    # A single key viewing the store's own bytes is copied for torch (tensors are writable),
    # so writing into it leaves the store alone.
    one = p.kv_get("k0", format="torch")["x"]
    one.fill_(7.0)
    assert not torch.equal(p.kv_get("k0", format="torch")["x"], one)


def test_a_large_gathered_field_is_viewed_by_torch_where_the_read_packed_it(client: tq.Client) -> None:
    # 1024 x 4 KiB: the read packs the column into a buffer of tq's read pool. That buffer is
    # the read's alone, so numpy may write it and torch views it instead of copying it.
    p = client.partition("torch-pooled")
    keys = [f"k{i}" for i in range(1024)]
    data = torch.randn(1024, 1024)
    p.kv_batch_put(keys, {"x": data})
    as_numpy = p.kv_batch_get(keys)["x"]
    assert as_numpy.base.writable and as_numpy.flags.writeable
    packed_at = as_numpy.base.address
    as_numpy[0, 0] = 123.0
    assert torch.equal(p.kv_batch_get(keys, format="torch")["x"], data), "the store is unchanged"
    # Dropped, the column's buffer goes back to the pool; the next read of the same size packs
    # into it again. A copy for torch would sit elsewhere.
    del as_numpy
    back = p.kv_batch_get(keys, format="torch")["x"]
    assert back.data_ptr() == packed_at
    assert torch.equal(back, data)
    back.mul_(2)
    assert torch.equal(p.kv_batch_get(keys, format="torch")["x"], data)


def test_tensors_on_another_device_or_not_contiguous_are_taken_by_value(client: tq.Client) -> None:
    p = client.partition("torch-strided")
    t = torch.arange(40, dtype=torch.int32).reshape(4, 10)[:, ::2]
    assert not t.is_contiguous()
    p.kv_batch_put(["a", "b", "c", "d"], {"x": t})
    assert torch.equal(p.kv_batch_get(["a", "b", "c", "d"], format="torch")["x"], t)


def test_ragged_fields_as_lists_and_nested_tensors(client: tq.Client) -> None:
    p = client.partition("torch-ragged")
    rows = [torch.arange(n) for n in (3, 1, 4)]
    p.kv_batch_put(["a", "b", "c"], {"tokens": rows})
    p.kv_batch_put(["d", "e"], {"tokens": torch.nested.nested_tensor([torch.arange(2), torch.arange(5)], layout=torch.jagged)})
    nested = p.kv_batch_get(["a", "b", "c", "d", "e"], format="torch")["tokens"]
    assert nested.is_nested
    assert [r.tolist() for r in nested.unbind()] == [[0, 1, 2], [0], [0, 1, 2, 3], [0, 1], [0, 1, 2, 3, 4]]
    as_numpy = p.kv_batch_get(["b", "a"])["tokens"]
    assert [r.tolist() for r in as_numpy] == [[0], [0, 1, 2]]


def test_tensordicts_in_and_out(client: tq.Client) -> None:
    p = client.partition("td")
    td = tensordict.TensorDict(
        {
            "input_ids": torch.arange(6).reshape(3, 2),
            "logp": torch.randn(3, 2, dtype=torch.bfloat16),
            "prompt": tensordict.NonTensorStack(*(tensordict.NonTensorData(s) for s in ["x", "y", "z"])),
        },
        batch_size=[3],
    )
    p.kv_batch_put(["a", "b", "c"], td)
    back = p.kv_batch_get(["a", "b", "c"], format="tensordict")
    assert isinstance(back, tensordict.TensorDictBase)
    assert back.batch_size == torch.Size([3])
    assert torch.equal(back["input_ids"], td["input_ids"])
    assert back["logp"].dtype == torch.bfloat16 and torch.equal(back["logp"], td["logp"])
    assert back.get("prompt").tolist() == ["x", "y", "z"]
    # The metadata API takes and gives TensorDicts too.
    meta = p.put(td)
    again = client.get_data(meta, format="tensordict")
    assert torch.equal(again["input_ids"], td["input_ids"])
    with pytest.raises(ValueError):
        client.get_data(meta, format="pandas")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_torch_dataloader_with_two_workers_hands_each_sample_out_once(served: str, method: str) -> None:
    from torch.utils.data import DataLoader

    with tq.connect(served) as c:
        p = c.partition(f"loader-{method}")
        p.put({"x": torch.arange(200).reshape(200, 1)})
        p.complete()
        dataset = tq.StreamingDataset(served, p.name, ["x"], task="train", batch_size=8)
        loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=method)
        seen = [int(v) for batch in loader for v in batch["x"][:, 0]]
        assert sorted(seen) == list(range(200)), "every sample once, over both workers"
        p.clear()


def test_a_tensor_handed_over_is_stored_without_a_copy(client: tq.Client) -> None:
    p = client.partition("torch-handover")
    t = torch.arange(1024, dtype=torch.float32).reshape(1, 1024)
    p.kv_batch_put(["k"], {"x": t}, copy=False)
    back = p.kv_get("k")["x"]
    assert back.__array_interface__["data"][0] == t.data_ptr()
    copied = torch.arange(1024, dtype=torch.float32).reshape(1, 1024)
    p.kv_batch_put(["c"], {"x": copied})
    assert p.kv_get("c")["x"].__array_interface__["data"][0] != copied.data_ptr()
