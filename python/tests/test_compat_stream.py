"""tq.compat's StreamingDataset and StreamingDataLoader, and the samplers by the original's
class names (checklist items 31-34), against a real deployment."""

from __future__ import annotations

import os
import pickle
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
from tq.compat import StreamingDataLoader, StreamingDataset

TD = tensordict.TensorDict


@pytest.fixture
def deployment() -> Iterator[dict]:
    conf = transfer_queue.init()
    try:
        yield conf
    finally:
        transfer_queue.close()


def _put(n: int, start: int = 0, partition: str = "train") -> None:
    ids = torch.arange(start, start + n)
    data = TD(
        {
            "ids": ids,
            "tokens": torch.nested.nested_tensor([torch.ones(1 + i % 3) for i in range(n)], layout=torch.jagged),
            "text": tensordict.NonTensorStack(*[f"t{i}" for i in ids.tolist()]),
        },
        batch_size=[n],
    )
    transfer_queue.get_client().put(data=data, partition_id=partition)


def _dataset(conf: dict, **kw: object) -> StreamingDataset:
    args = dict(batch_size=7, micro_batch_size=3, data_fields=["ids", "tokens", "text"], partition_id="train",
                task_name="train", dp_rank=0, should_check_consumption_status=True)
    args.update(kw)
    return StreamingDataset(conf, **args)  # type: ignore[arg-type]


def test_micro_batches_split_data_and_meta_at_the_same_rows(deployment) -> None:
    _put(7)
    items = list(_dataset(deployment))
    sizes = [(int(d.batch_size[0]), m.size) for d, m in items]
    assert sizes == [(3, 3), (3, 3), (1, 1)]  # the original's meta split would be 3/2/2
    for data, meta in items:
        assert data["ids"].tolist() == meta.global_indexes
        assert data["text"].tolist() == [f"t{i}" for i in meta.global_indexes]
        assert [t.shape[0] for t in data["tokens"].unbind()] == [1 + i % 3 for i in meta.global_indexes]


def test_reset_replays_and_step_moves_on(deployment) -> None:
    _put(4)
    _put(2, start=100, partition="val")
    ds = _dataset(deployment, batch_size=4, micro_batch_size=4)
    first = [m.global_indexes for _, m in ds]
    ds.reset()
    assert [m.global_indexes for _, m in ds] == first  # the buffered batches again, nothing refetched
    ds.step("val")
    ds.batch_size = 2
    assert [d["ids"].tolist() for d, _ in ds] == [[100, 101]]
    assert len(ds.get_buffer()) == 1


def test_a_streaming_dataset_waits_for_producers_and_ends_on_a_complete_partition(deployment) -> None:
    _put(2)
    client = tq.connect(deployment["backend"]["tq"]["connect"])
    ds = _dataset(deployment, batch_size=2, micro_batch_size=2, should_check_consumption_status=False)
    it = iter(ds)
    assert next(it)[0]["ids"].tolist() == [0, 1]
    _put(2, start=2)
    assert next(it)[0]["ids"].tolist() == [2, 3]
    client.partition("train").complete()
    assert list(it) == []  # complete and consumed: the infinite stream ends
    client.close()


def test_dataloader_workers_share_the_partition_once(deployment) -> None:
    _put(24)
    ds = _dataset(deployment, batch_size=4, micro_batch_size=2, data_fields=["ids"])
    pickle.dumps(ds)  # what a spawned worker gets
    loader = StreamingDataLoader(ds, num_workers=2, multiprocessing_context="fork")
    seen = sorted(i for data, _meta in loader for i in data["ids"].tolist())
    assert seen == list(range(24))
    assert loader.get_buffer() == []  # the workers buffered, not this process


def test_dataset_argument_checks(deployment) -> None:
    for bad in ({"micro_batch_size": 0}, {"data_fields": []}, {"dp_rank": -1}):
        with pytest.raises(ValueError):
            _dataset(deployment, **bad)


def _init_with(sampler: object) -> dict:
    return transfer_queue.init({"controller": {"sampler": sampler, "polling_mode": True}})


def _fetch(n: int, task: str = "t", **sampling: object) -> list:
    return transfer_queue.get_client().get_meta(
        data_fields=["ids"], batch_size=n, partition_id="train", task_name=task, sampling_config=sampling
    ).global_indexes


def test_31_sequential_sampler() -> None:
    """Difference: a fetch of 0 samples is refused (the original answers [])."""
    _init_with("SequentialSampler")
    try:
        _put(3)
        with pytest.raises(tq.InvalidError):
            _fetch(0)
        assert _fetch(2) == [0, 1]
        assert _fetch(5) == []  # polling: fewer ready than asked answers nothing, as the original
    finally:
        transfer_queue.close()


def test_32_grpo_sampler_takes_whole_groups() -> None:
    _init_with(transfer_queue.GRPOGroupNSampler(n_samples_per_prompt=3))
    try:
        _put(3)
        assert _fetch(6) == []  # one group only
        _put(3, start=3)
        with pytest.raises(tq.TqError):
            _fetch(4)  # not a multiple of 3
        assert _fetch(6) == [0, 1, 2, 3, 4, 5]
    finally:
        transfer_queue.close()
    with pytest.raises(tq.TqError):
        _init_with(transfer_queue.GRPOGroupNSampler(n_samples_per_prompt=0))
    transfer_queue.close()


def test_33_rank_aware_sampler_gives_a_rank_the_same_batch() -> None:
    _init_with(transfer_queue.RankAwareSampler)
    try:
        _put(6)
        first = _fetch(2, dp_rank=0, batch_index=0)
        assert _fetch(2, dp_rank=0, batch_index=0) == first  # another rank of the same group
        other = _fetch(2, dp_rank=1, batch_index=0)
        assert set(other).isdisjoint(first)
        assert _fetch(2, dp_rank=0, batch_index=1) not in (first, other)
    finally:
        transfer_queue.close()


def test_34_seqlen_balanced_sampler_balances_weights() -> None:
    _init_with(transfer_queue.SeqlenBalancedSampler(n_samples_per_prompt=1, dp_size=2))
    try:
        client = transfer_queue.get_client()
        meta = client.get_meta(data_fields=["ids"], batch_size=4, partition_id="train", mode="insert")
        meta.update_custom_meta([{"total_lengths": w} for w in (100, 100, 10, 10)])
        client.put(data=TD({"ids": torch.arange(4)}, batch_size=[4]), metadata=meta)
        weights = {g: w for g, w in zip(meta.global_indexes, (100, 100, 10, 10))}
        shares = [_fetch(2, dp_rank=r, batch_index=0) for r in (0, 1)]
        assert [sum(weights[g] for g in s) for s in shares] == [110, 110]
        assert sorted(shares[0] + shares[1]) == sorted(weights)
    finally:
        transfer_queue.close()


class _EveryOther(transfer_queue.BaseSampler):
    """A sampler written in Python: every other ready index, consumed; remembers its calls."""

    def sample(self, ready_indexes, batch_size, *args, **kwargs):
        self._states.setdefault("calls", []).append(dict(kwargs))
        picked = ready_indexes[::2][:batch_size]
        if len(picked) < batch_size:
            return [], []
        return picked, picked


class _WithReplacement(transfer_queue.BaseSampler):
    def sample(self, ready_indexes, batch_size, *args, **kwargs):
        return ready_indexes[:batch_size], []  # nothing consumed: the same samples again


class _Broken(transfer_queue.BaseSampler):
    def sample(self, ready_indexes, batch_size, *args, **kwargs):
        if batch_size > 1:
            raise ValueError("this sampler takes one at a time")
        return [999], [999]  # not a ready index


def test_a_sampler_written_in_python_is_called_by_the_controller() -> None:
    sampler = _EveryOther()
    _init_with(sampler)
    try:
        _put(6)
        assert _fetch(2, dp_rank=1, batch_index=7) == [0, 2]
        assert _fetch(2) == [1, 4]  # ready is now [1, 3, 4, 5]
        calls = sampler._states["calls"]  # this process hosts the controller: the same object
        assert calls[0] == {"partition_id": "train", "task_name": "t", "dp_rank": 1, "batch_index": 7}
        assert calls[1] == {"partition_id": "train", "task_name": "t"}
    finally:
        transfer_queue.close()


class _ByPriority(transfer_queue.BaseSampler):
    """The highest ``priority_scores`` first (a per-call input, as TransferQueue's tutorial 05
    passes one); remembers what it was given."""

    def sample(self, ready_indexes, batch_size, *args, priority_scores=None, **kwargs):
        self._states["given"] = priority_scores
        ranked = sorted(ready_indexes, key=lambda i: -priority_scores[i])[:batch_size]
        return ranked, ranked


def test_per_call_sampler_inputs_reach_a_python_sampler() -> None:
    """sampling_config entries beyond the context travel with the fetch to the controller,
    decoded there by a decoder that takes plain values and numpy arrays only."""
    import datetime

    import numpy as np

    sampler = _ByPriority()
    conf = _init_with(sampler)
    try:
        _put(5)
        scores = np.array([0.1, 5.0, 0.2, 9.0, 0.3])
        # Over the wire (a connected client, as every other process is): task t2.
        with tq.connect(conf["backend"]["tq"]["connect"]) as remote:
            meta = remote.partition("train").fetch(
                ["ids"], "t2", 1, timeout=0, sampler=conf["controller"]["tq_sampler"], sampler_args={"priority_scores": scores}
            )
            assert meta.global_indexes == [3]
        # In this process (the deployment's own client): task t.
        assert _fetch(2, priority_scores=scores) == [3, 1]
        given = sampler._states["given"]
        assert isinstance(given, np.ndarray) and given.tolist() == scores.tolist()
        assert _fetch(1, priority_scores=torch.tensor([0.0, 0.0, 1.0, 0.0, 7.0])) == [4]  # sent as numpy
        # Anything but plain values and numpy arrays is refused by the controller's decoder,
        # and nothing is consumed.
        with pytest.raises(tq.InvalidError, match="plain values and numpy arrays only"):
            _fetch(1, priority_scores=datetime.date(2026, 1, 1))
        assert _fetch(1, priority_scores=scores) == [2]
    finally:
        transfer_queue.close()


def test_a_built_in_sampler_refuses_per_call_inputs() -> None:
    _init_with("SequentialSampler")
    try:
        _put(2)
        with pytest.raises(tq.InvalidError, match="takes none"):
            _fetch(1, priority_scores=[1.0, 2.0])
        assert _fetch(2) == [0, 1]  # the refused fetch took nothing
    finally:
        transfer_queue.close()


def test_a_python_sampler_may_leave_samples_unconsumed() -> None:
    _init_with(_WithReplacement)
    try:
        _put(3)
        assert _fetch(2) == [0, 1] and _fetch(2) == [0, 1]
    finally:
        transfer_queue.close()


def test_a_python_sampler_s_errors_reach_the_caller_and_change_nothing() -> None:
    _init_with(_Broken())
    try:
        _put(3)
        with pytest.raises(tq.InvalidError, match="one at a time"):
            _fetch(2)
        with pytest.raises(tq.InvalidError, match="999"):
            _fetch(1)
        _, consumed = transfer_queue.get_client().get_consumption_status("t", "train")
        assert consumed.tolist() == [0, 0, 0]
    finally:
        transfer_queue.close()


def test_spawned_multiprocessing_workers_attach_without_ray(deployment) -> None:
    import multiprocessing

    import _workers

    transfer_queue.get_client().put(data=TD({"x": torch.tensor([5, 6])}, batch_size=[2]), partition_id="shared")
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        got = pool.map(_workers.compat_worker, [0, 1])
    assert got == [[5, 6], [5, 6]]  # two tasks, each reads the whole partition
    keys = transfer_queue.kv_list("workers")["workers"]
    assert sorted(keys) == ["w0", "w1"]  # and the workers' close left the deployment running


def test_a_dataloader_with_spawned_workers(deployment) -> None:
    _put(12)
    ds = _dataset(deployment, batch_size=2, micro_batch_size=2, data_fields=["ids"])
    loader = StreamingDataLoader(ds, num_workers=2, multiprocessing_context="spawn")
    assert sorted(i for data, _meta in loader for i in data["ids"].tolist()) == list(range(12))
