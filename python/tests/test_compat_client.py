"""TransferQueue's behavioural checklist, controller, sampler and end-to-end parts (items
10-40), through ``tq.compat.get_client()`` against a real deployment (a controller and storage
units serving over loopback TCP). Each test names its checklist item; where tq deliberately
differs, the test asserts tq's behaviour and says so (docs/python-compat.md gives the reason).
Items about the original controller's internal matrices (24, 26, 27, 29) are covered by what
they imply for a caller."""

from __future__ import annotations

import asyncio
import os
from typing import Iterator

import pytest

if os.environ.get("TQ_REQUIRE_TORCH"):
    import tensordict
    import torch
else:
    torch = pytest.importorskip("torch")
    tensordict = pytest.importorskip("tensordict")

import tq
import tq.compat as transfer_queue
from tq.compat import BatchMeta

TD = tensordict.TensorDict


@pytest.fixture
def client() -> Iterator[transfer_queue.TransferQueueClient]:
    transfer_queue.init({"controller": {"polling_mode": True}, "backend": {"SimpleStorage": {"num_data_storage_units": 2}}})
    try:
        yield transfer_queue.get_client()
    finally:
        transfer_queue.close()


def _rows(n: int, start: int = 0) -> object:
    return TD({"a": torch.arange(start, start + n).float().unsqueeze(1), "b": torch.ones(n, 2)}, batch_size=[n])


def test_10_insert_allocates_fresh_indexes_with_nothing_produced(client) -> None:
    meta = client.get_meta(data_fields=["a"], batch_size=32, partition_id="p", mode="insert")
    assert meta.global_indexes == list(range(32))
    assert meta.production_status.tolist() == [0] * 32


def test_11_production_after_a_put_and_fresh_consumption(client) -> None:
    client.put(data=_rows(32), partition_id="p")
    gis, produced = client.get_production_status(["a", "b"], "p")
    assert gis.tolist() == list(range(32)) and produced.shape == (32, 2) and bool(produced.all())
    _, consumed = client.get_consumption_status("new-task", "p")
    assert consumed.tolist() == [0] * 32


def test_12_fetch_consumes_and_force_fetch_does_not(client) -> None:
    client.put(data=_rows(32), partition_id="p")
    meta = client.get_meta(data_fields=["a"], batch_size=32, partition_id="p", task_name="T")
    assert meta.global_indexes == list(range(32)) and meta.field_names == ["a"]
    assert client.check_consumption_status("T", "p")
    assert client.get_meta(data_fields=["a"], batch_size=32, partition_id="p", task_name="T").size == 0
    assert client.get_meta(data_fields=["a"], batch_size=32, partition_id="p", mode="force_fetch").size == 32


def test_13_clear_partition_and_a_missing_one(client) -> None:
    client.put(data=_rows(4), partition_id="p")
    client.clear_partition("p")
    assert "p" not in client.get_partition_list()
    client.clear_partition("never-there")
    assert client.get_meta(data_fields=["a"], batch_size=4, partition_id="p", mode="force_fetch").size == 0


def test_14_cleared_indexes_are_reused(client) -> None:
    client.put(data=_rows(32), partition_id="p1")
    client.put(data=_rows(16), partition_id="p2")
    client.clear_partition("p1")
    p3 = client.put(data=_rows(64), partition_id="p3")
    assert p3.global_indexes == list(range(32)) + list(range(48, 80))


def test_15_tasks_consume_independently_and_reset(client) -> None:
    client.put(data=_rows(4), partition_id="p")
    for task in ("A", "B"):
        assert client.get_meta(data_fields=["a"], batch_size=4, partition_id="p", task_name=task).size == 4
    assert client.reset_consumption("p", "A") is True
    assert client.get_consumption_status("A", "p")[1].tolist() == [0] * 4
    assert client.get_consumption_status("B", "p")[1].tolist() == [1] * 4
    client.reset_consumption("p")
    assert client.get_consumption_status("B", "p")[1].tolist() == [0] * 4
    assert client.get_meta(data_fields=["a"], batch_size=4, partition_id="p", task_name="B").size == 4


def test_16_sequential_by_default(client) -> None:
    client.put(data=_rows(6), partition_id="p")
    fetch = lambda task, n: client.get_meta(data_fields=["a"], batch_size=n, partition_id="p", task_name=task).global_indexes  # noqa: E731
    assert fetch("A", 3) == [0, 1, 2] and fetch("A", 3) == [3, 4, 5] and fetch("B", 2) == [0, 1]


def test_17_clear_samples_leaves_the_rest_and_repeats_harmlessly(client) -> None:
    meta = client.put(data=_rows(8), partition_id="p")
    other = client.put(data=_rows(2), partition_id="q")
    gone = BatchMeta.concat([meta.select_samples([0, 1, 2, 3, 6]), other.select_samples([0])])
    client.clear_samples(gone)
    left = client.get_meta(data_fields=["a"], batch_size=8, partition_id="p", mode="force_fetch")
    assert left.global_indexes == [4, 5, 7]
    client.clear_samples(gone)  # again: those samples are gone, nothing else changes
    assert client.get_meta(data_fields=["a"], batch_size=8, partition_id="p", mode="force_fetch").global_indexes == [4, 5, 7]
    assert client.get_meta(data_fields=["a"], batch_size=8, partition_id="q", mode="force_fetch").size == 1


def test_18_custom_meta_is_stored_per_sample_and_merged(client) -> None:
    """Difference: tq merges a sample's tags (the original replaces the dict); a key a caller
    wants gone is dropped by the write that sets the rest."""
    p = client.put(data=_rows(3), partition_id="p")
    q = client.put(data=_rows(2), partition_id="q")
    both = BatchMeta.concat([p.select_samples([0, 2]), q.select_samples([1])])
    both.update_custom_meta([{"score": 1}, {"score": 2}, {"score": 3}])
    client.set_custom_meta(both)
    p_back = client.get_meta(data_fields=["a"], batch_size=3, partition_id="p", mode="force_fetch")
    q_back = client.get_meta(data_fields=["a"], batch_size=2, partition_id="q", mode="force_fetch")
    assert p_back.custom_meta == [{"score": 1}, {}, {"score": 2}]
    assert q_back.custom_meta == [{}, {"score": 3}]


def test_19_kv_retrieve_meta_creates_keys_in_request_order(client) -> None:
    meta = client.kv_retrieve_meta(["x", "y", "z"], "kv", create=True)
    assert meta.size == 3 and meta.partition_ids == ["kv"] * 3
    again = client.kv_retrieve_meta(["z", "x"], "kv")
    assert again.global_indexes == [meta.global_indexes[2], meta.global_indexes[0]]
    assert "kv" in client.get_partition_list()


def test_20_kv_retrieve_meta_of_missing_keys_is_an_error(client) -> None:
    """Difference: the original answers the keys it found (a shorter batch); tq names the
    missing ones."""
    client.kv_retrieve_meta(["a", "b"], "kv", create=True)
    with pytest.raises(transfer_queue.StorageKeyNotFoundError) as err:
        client.kv_retrieve_meta(["a", "nope", "b"], "kv")
    assert "nope" in str(err.value)
    with pytest.raises(ValueError):
        client.kv_retrieve_meta([], "kv")
    with pytest.raises(TypeError):
        client.kv_retrieve_meta(["a", 1], "kv")


def test_21_written_fields_and_tags_show_in_the_meta(client) -> None:
    transfer_queue.kv_batch_put(["k0", "k1", "k2"], "kv", fields=TD({"data": torch.ones(3, 2)}, batch_size=[3]), tags=[{"i": i} for i in range(3)])
    meta = client.kv_retrieve_meta(["k2", "k0", "k1"], "kv")
    assert "data" in meta.field_schema and meta.field_schema["data"]["dtype"] == torch.float32
    assert meta.custom_meta == [{"i": 2}, {"i": 0}, {"i": 1}]
    assert client.get_data(meta)["data"].shape == (3, 2)


def test_22_kv_retrieve_keys(client) -> None:
    transfer_queue.kv_put("first", "p1", fields={"x": torch.ones(1)})
    transfer_queue.kv_batch_put(["a", "b", "c"], "p2", fields=TD({"x": torch.ones(3, 1)}, batch_size=[3]))
    gis = client.kv_retrieve_meta(["a", "b", "c"], "p2").global_indexes
    assert gis[0] == 1  # global indexes are global: p1's key took 0
    assert client.kv_retrieve_keys(gis, "p2") == ["a", "b", "c"]
    assert client.kv_retrieve_keys(gis[1], "p2") == ["b"]
    assert client.kv_retrieve_keys([999], "p2") == [None]
    with pytest.raises(ValueError):
        client.kv_retrieve_keys([], "p2")
    with pytest.raises(TypeError):
        client.kv_retrieve_keys(["a"], "p2")


def test_25_partitions_are_independent(client) -> None:
    first = client.put(data=_rows(2), partition_id="p")
    client.clear_samples(first)
    client.put(data=TD({"other": torch.ones(2, 1)}, batch_size=[2]), partition_id="q")  # reuses the indexes
    assert client.get_meta(data_fields=["a"], batch_size=2, partition_id="p", task_name="t").size == 0
    assert not client.check_production_status(["a"], "q")


def test_28_dtype_conflicts_and_shapes_that_differ(client) -> None:
    transfer_queue.kv_put("a", "kv", fields={"x": torch.ones(2)})
    with pytest.raises(tq.TqError):
        transfer_queue.kv_put("b", "kv", fields={"x": torch.ones(2, dtype=torch.int64)})
    transfer_queue.kv_put("c", "kv", fields={"x": torch.ones(3)})
    back = transfer_queue.kv_batch_get(["a", "c"], "kv")
    assert back["x"].is_nested and [t.shape[0] for t in back["x"].unbind()] == [2, 3]


def test_30_status_of_unknown_things(client) -> None:
    assert client.get_production_status(["a"], "missing") == (None, None)
    assert client.get_consumption_status("t", "missing") == (None, None)
    assert not client.check_production_status(["a"], "missing")
    assert not client.check_consumption_status("t", "missing")


def test_35_put_needs_a_partition_and_clearing_nothing_is_fine(client) -> None:
    with pytest.raises(ValueError):
        client.put(data=_rows(1))
    client.clear_samples(BatchMeta.empty())
    with pytest.raises(ValueError):
        client.put(data=_rows(1), metadata=BatchMeta.empty())


def test_36_partial_production_and_consumption_at_fetch(client) -> None:
    meta = client.put(data=TD({"a": torch.ones(4, 1)}, batch_size=[4]), partition_id="p")
    assert client.check_production_status(["a"], "p")
    assert not client.check_production_status(["a", "b"], "p")
    fetched = client.get_meta(data_fields=["a"], batch_size=4, partition_id="p", task_name="t")
    assert client.check_consumption_status("t", "p")  # before any get_data
    client.put(data=TD({"b": torch.zeros(4, 1)}, batch_size=[4]), metadata=fetched)
    assert client.check_production_status(["a", "b"], "p")
    assert meta.size == 4


def test_36b_a_stage_adds_fields_to_fetched_samples(client) -> None:
    client.put(data=TD({"prompt": torch.arange(4).unsqueeze(1)}, batch_size=[4]), partition_id="p")
    meta = client.get_meta(data_fields=["prompt"], batch_size=4, partition_id="p", task_name="rollout")
    meta = client.put(data=TD({"response": torch.arange(4).unsqueeze(1) * 10}, batch_size=[4]), metadata=meta)
    assert meta.field_names == ["prompt", "response"] and meta.is_ready
    both = client.get_data(meta)
    assert both["prompt"].flatten().tolist() == [0, 1, 2, 3] and both["response"].flatten().tolist() == [0, 10, 20, 30]
    ready = client.get_meta(data_fields=["prompt", "response"], batch_size=4, partition_id="p", task_name="train")
    assert ready.size == 4


def test_37_kv_end_to_end(client) -> None:
    m = transfer_queue.kv_put("k", "kv", fields={"x": torch.ones(2)}, tag={"s": 1})
    assert m.fields == ["x"]
    transfer_queue.kv_put("k", "kv", tag={"t": 2})
    m = transfer_queue.kv_put("k", "kv", fields={"y": torch.zeros(1)})
    assert sorted(transfer_queue.kv_list("kv")["kv"]["k"]) == ["s", "t"]
    back = transfer_queue.kv_batch_get("k", "kv")
    assert sorted(back.keys()) == ["x", "y"] and back["x"].shape == (1, 2)
    assert list(transfer_queue.kv_batch_get("k", "kv", select_fields="y").keys()) == ["y"]


def test_38_keys_with_different_fields(client) -> None:
    transfer_queue.kv_put("a", "kv", fields={"f_a": torch.ones(1), "f_b": torch.ones(1)})
    transfer_queue.kv_put("b", "kv", fields={"f_a": torch.ones(1), "f_c": torch.ones(1)})
    back = transfer_queue.kv_batch_get(["a", "b"], "kv")
    assert list(back.keys()) == ["f_a"]


def test_39_kv_clear(client) -> None:
    transfer_queue.kv_put("a", "p1", fields={"x": torch.ones(1)})
    transfer_queue.kv_clear("a", "p1")
    transfer_queue.kv_clear(["a", "missing"], "p1")
    transfer_queue.kv_clear("a", "no-partition")
    assert transfer_queue.kv_list("p1") == {}
    transfer_queue.kv_put("b", "p2", fields={"x": torch.ones(1)})
    assert client.get_meta(data_fields=["x"], batch_size=1, partition_id="p1", task_name="t").size == 0
    with pytest.raises(ValueError):
        transfer_queue.kv_clear([], "p1")


def test_40_checkpoint_round_trip(tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    transfer_queue.init()
    try:
        data = TD(
            {
                "dense": torch.arange(6).reshape(3, 2),
                "ragged": torch.nested.nested_tensor([torch.ones(1), torch.ones(2), torch.ones(3)], layout=torch.jagged),
                "text": tensordict.NonTensorStack("a", "b", "c"),
            },
            batch_size=[3],
        )
        transfer_queue.kv_batch_put(["x", "y", "z"], "p", fields=data, tags=[{"i": i} for i in range(3)])
        with pytest.warns(UserWarning):
            transfer_queue.save_checkpoint(ckpt, include_storage=False, metadata={"step": 10})
    finally:
        transfer_queue.close()
    with pytest.raises(RuntimeError):
        transfer_queue.save_checkpoint(ckpt)
    transfer_queue.init()
    try:
        with pytest.raises(FileNotFoundError):
            transfer_queue.load_checkpoint(tmp_path / "missing")
        assert transfer_queue.load_checkpoint(ckpt) == {"step": 10}
        back = transfer_queue.kv_batch_get(["z", "x"], "p")
        assert back["dense"].tolist() == [[4, 5], [0, 1]]
        assert [t.shape[0] for t in back["ragged"].unbind()] == [3, 1]
        assert back["text"].tolist() == ["c", "a"]
        assert transfer_queue.kv_list("p")["p"]["y"] == {"i": 1}
    finally:
        transfer_queue.close()


def test_40b_a_checkpoint_loads_only_into_the_same_number_of_units(tmp_path) -> None:
    transfer_queue.init({"backend": {"SimpleStorage": {"num_data_storage_units": 2}}})
    try:
        transfer_queue.kv_put("x", "p", fields={"v": torch.ones(1)})
        transfer_queue.save_checkpoint(tmp_path)
    finally:
        transfer_queue.close()
    transfer_queue.init({"backend": {"SimpleStorage": {"num_data_storage_units": 3}}})
    try:
        with pytest.raises(tq.TqError):
            transfer_queue.load_checkpoint(tmp_path)
        assert transfer_queue.kv_list() == {}
    finally:
        transfer_queue.close()


def test_async_client_methods(client) -> None:
    async def main() -> None:
        meta = await client.async_put(data=_rows(4), partition_id="p")
        fetched = await client.async_get_meta(data_fields=["a"], batch_size=4, partition_id="p", task_name="t")
        data = await client.async_get_data(fetched)
        assert data["a"].flatten().tolist() == [0.0, 1.0, 2.0, 3.0]
        assert await client.async_check_consumption_status("t", "p")
        await client.async_clear_samples(meta)
        assert await client.async_get_partition_list() == []

    asyncio.run(main())


def test_help_shows_the_original_signatures() -> None:
    import inspect

    sig = inspect.signature(transfer_queue.TransferQueueClient.get_meta)
    assert list(sig.parameters) == ["self", "data_fields", "batch_size", "partition_id", "mode", "task_name", "sampling_config"]
    assert list(inspect.signature(transfer_queue.async_kv_put).parameters) == ["key", "partition_id", "fields", "tag", "data_parser"]
    assert transfer_queue.TransferQueueClient.async_get_meta.__doc__


def test_a_hand_made_batch_meta_is_refused_for_data(client) -> None:
    client.put(data=_rows(2), partition_id="p")
    with pytest.raises(tq.InvalidError, match="generation"):
        client.get_data(BatchMeta([0, 1], ["p", "p"], {"a": {"dtype": torch.float32, "shape": (1,)}}))


def test_data_of_several_partitions_comes_back_in_row_order(client) -> None:
    p = client.put(data=_rows(3, start=0), partition_id="p")
    q = client.put(data=_rows(2, start=100), partition_id="q")
    mixed = BatchMeta.concat([q.select_samples([1]), p.select_samples([2, 0]), q.select_samples([0])])
    assert client.get_data(mixed)["a"].flatten().tolist() == [101.0, 2.0, 0.0, 100.0]


def test_a_fetched_batch_nobody_read_is_handed_out_again() -> None:
    """Difference (acknowledged delivery): a fetch leases its samples to the task; reading
    (get_data) or writing (put) them consumes them; a batch its consumer never got to comes
    back when the lease runs out, where the original would have lost it."""
    transfer_queue.init({"backend": {"tq": {"lease_seconds": 0.5}}})
    try:
        client = transfer_queue.get_client()
        client.put(data=_rows(6), partition_id="p")
        read = client.get_meta(data_fields=["a"], batch_size=2, partition_id="p", task_name="t")
        client.get_data(read)
        written = client.get_meta(data_fields=["a"], batch_size=2, partition_id="p", task_name="t")
        client.put(data=TD({"out": torch.zeros(2, 1)}, batch_size=[2]), metadata=written)
        dropped = client.get_meta(data_fields=["a"], batch_size=2, partition_id="p", task_name="t")
        assert client.check_consumption_status("t", "p")  # leased counts as taken meanwhile
        again = client.get_meta(data_fields=["a"], batch_size=2, partition_id="p", task_name="t")  # waits out the lease
        assert again.global_indexes == dropped.global_indexes
        assert set(again.global_indexes).isdisjoint(read.global_indexes + written.global_indexes)
    finally:
        transfer_queue.close()


def test_without_a_lease_a_fetch_consumes_at_once() -> None:
    transfer_queue.init({"controller": {"polling_mode": True}, "backend": {"tq": {"lease_seconds": None}}})
    try:
        client = transfer_queue.get_client()
        client.put(data=_rows(2), partition_id="p")
        assert client.get_meta(data_fields=["a"], batch_size=2, partition_id="p", task_name="t").size == 2
        assert client.get_consumption_status("t", "p")[1].tolist() == [1, 1]
        status = client._client.partition("p").consumption_status("t")
        assert status["consumed"] == [True, True] and status["leased"] == [False, False]
    finally:
        transfer_queue.close()
