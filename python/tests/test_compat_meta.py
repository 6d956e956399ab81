"""TransferQueue's behavioural checklist, metadata part (items 1-9), through tq.compat's
BatchMeta and KVBatchMeta. Each test names its checklist item."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

if os.environ.get("TQ_REQUIRE_TORCH"):
    import torch
else:
    torch = pytest.importorskip("torch")
    pytest.importorskip("tensordict")

from tq.compat import BatchMeta, KVBatchMeta


def _meta(n: int, partition: str = "p", **kw: object) -> BatchMeta:
    return BatchMeta(list(range(n)), [partition] * n, **kw)  # type: ignore[arg-type]


def _schema(*names: str, dtype: object = None) -> dict:
    return {n: {"dtype": dtype or torch.float32, "shape": (2,), "is_nested": False, "is_non_tensor": False} for n in names}


def test_1_construction_rules() -> None:
    with pytest.raises(ValueError):
        BatchMeta([0, 1], ["p"])
    m = _meta(3, field_schema=_schema("z", "a"))
    assert m.production_status.tolist() == [0, 0, 0]
    assert m.field_names == ["a", "z"]
    assert not m.is_ready and not BatchMeta.empty().is_ready
    with pytest.raises(ValueError):
        _meta(2, production_status=[1])
    with pytest.raises(ValueError):
        _meta(2, custom_meta=[{}])
    assert _meta(2, production_status=[1, 1]).is_ready


def test_2_chunk_sizes_and_per_row_data() -> None:
    m = _meta(10, custom_meta=[{"i": i} for i in range(10)], _custom_backend_meta=[{"f": i} for i in range(10)])
    pieces = m.chunk(3)
    assert [p.size for p in pieces] == [4, 3, 3]
    assert [c["i"] for c in pieces[1].custom_meta] == [4, 5, 6]
    assert [b["f"] for b in pieces[2]._custom_backend_meta] == [7, 8, 9]
    with pytest.warns(UserWarning):
        many = _meta(2).chunk(4)
    assert [p.size for p in many] == [1, 1, 0, 0]
    with pytest.raises(ValueError):
        m.chunk(0)  # the original crashes here


def test_3_chunk_by_partition() -> None:
    m = BatchMeta([0, 1, 2, 3], ["a", "b", "a", "c"])
    pieces = m.chunk_by_partition()
    assert [(p.partition_ids[0], p.global_indexes) for p in pieces] == [("a", [0, 2]), ("b", [1]), ("c", [3])]


def test_4_concat_order_and_extra_info() -> None:
    a = _meta(2, field_schema=_schema("x"), extra_info={"step": 1, "t": torch.ones(2)})
    b = BatchMeta([5, 6], ["p", "p"], _schema("x"), extra_info={"step": 1, "t": torch.ones(2), "more": 3})
    with pytest.warns(UserWarning):
        both = BatchMeta.concat([a, b])
    assert both.global_indexes == [0, 1, 5, 6]
    assert set(both.extra_info) == {"step", "t", "more"}
    c = BatchMeta([7], ["p"], _schema("x"), extra_info={"step": 2})
    with pytest.raises(ValueError), pytest.warns(UserWarning):
        BatchMeta.concat([a, c])
    with pytest.warns(UserWarning):
        assert BatchMeta.concat([]).size == 0


def test_5_concat_refuses_other_fields_or_dtypes() -> None:
    a = _meta(1, field_schema=_schema("x"))
    with pytest.raises(ValueError):
        BatchMeta.concat([a, BatchMeta([1], ["p"], _schema("y"))])
    with pytest.raises(ValueError, match="dtype"):
        BatchMeta.concat([a, BatchMeta([1], ["p"], _schema("x", dtype=torch.int64))])


def test_5b_concat_of_differing_shapes_makes_the_field_nested() -> None:
    a = _meta(1, field_schema=_schema("x"))
    other = {"x": {"dtype": torch.float32, "shape": (3,), "is_nested": False, "is_non_tensor": False}}
    both = BatchMeta.concat([a, BatchMeta([1], ["p"], other)])
    assert both.field_schema["x"]["is_nested"] and both.get_shapes("x") == [(2,), (3,)]


def test_6_union() -> None:
    a = _meta(2, field_schema=_schema("x", "y"), production_status=[1, 0], custom_meta=[{"a": 1}, {}], extra_info={"k": 1})
    b = _meta(2, field_schema=_schema("y", dtype=torch.int64) | _schema("z"), production_status=[1, 1], custom_meta=[{"b": 2}, {"c": 3}], extra_info={"k": 2})
    u = a.union(b)
    assert u.field_names == ["x", "y", "z"] and u.field_schema["y"]["dtype"] == torch.int64
    assert u.production_status.tolist() == [1, 0]
    assert u.custom_meta == [{"a": 1, "b": 2}, {"c": 3}] and u.extra_info == {"k": 2}
    with pytest.raises(ValueError, match="global_indexes"):
        a.union(BatchMeta([0, 9], ["p", "p"]))
    with pytest.raises(ValueError, match="partition_ids"):
        a.union(BatchMeta([0, 1], ["p", "q"]))
    alone = a.union(BatchMeta.empty())
    alone.custom_meta[0]["a"] = 99
    assert a.custom_meta[0]["a"] == 1


def test_7_selections_are_isolated() -> None:
    m = _meta(3, field_schema=_schema("x", "y"), custom_meta=[{"t": [1]} for _ in range(3)], extra_info={"e": [1]})
    s = m.select_fields(["x", "unknown"])
    assert s.field_names == ["x"]
    s.custom_meta[0]["t"].append(2)
    s.extra_info["e"].append(2)
    assert m.custom_meta[0]["t"] == [1] and m.extra_info["e"] == [1]
    r = m.select_samples([2, 0, 2])
    assert r.global_indexes == [2, 0, 2]
    r.custom_meta[0]["t"].append(3)
    assert m.custom_meta[2]["t"] == [1]
    with pytest.raises(ValueError):
        m.select_samples([3])
    assert m[-1].global_indexes == [2] and m[1:].global_indexes == [1, 2]
    with pytest.raises(IndexError):
        m[3]
    with pytest.raises(TypeError):
        m["x"]


def test_8_pickle_round_trip_keeps_everything_and_production_stays_writable() -> None:
    m = _meta(2, field_schema=_schema("x"), production_status=[1, 0], extra_info={"e": 1}, custom_meta=[{"a": 1}, {"b": 2}])
    back = pickle.loads(pickle.dumps(m))
    for attr in ("global_indexes", "partition_ids", "field_schema", "extra_info", "custom_meta"):
        assert getattr(back, attr) == getattr(m, attr)
    back.production_status[1] = 1
    assert back.production_status.tolist() == [1, 1]
    m.reorder([1, 0])
    assert m.global_indexes == [1, 0] and m.custom_meta == [{"b": 2}, {"a": 1}]
    with pytest.raises(ValueError):
        m.reorder([0, 0])


def test_8b_extra_info_and_custom_meta_helpers() -> None:
    m = _meta(2)
    m.set_extra_info("a", 1)
    m.update_extra_info({"b": 2})
    assert m.get_extra_info("a") == 1 and m.has_extra_info("b") and m.remove_extra_info("b") == 2
    assert m.get_extra_info("missing", "d") == "d"
    m.update_custom_meta([{"x": 1}, {"y": 2}])
    m.update_custom_meta([{"x": 3}, {}])
    assert m.get_all_custom_meta() == [{"x": 3}, {"y": 2}]
    with pytest.raises(ValueError):
        m.update_custom_meta([{}])
    m.clear_custom_meta()
    assert m.custom_meta == [{}, {}]
    assert [s.global_index for s in m.samples] == [0, 1]
    with pytest.raises(KeyError):
        m.get_dtypes("x")


def test_9_kv_batch_meta() -> None:
    with pytest.raises(ValueError):
        KVBatchMeta(["a"], [{}, {}])
    with pytest.raises(ValueError):
        KVBatchMeta(["a", "a"])
    with pytest.raises(ValueError):
        KVBatchMeta(["a"], fields=["f", "f"])
    tags = [{"t": [1]}, {"t": [2]}]
    m = KVBatchMeta(["a", "b"], tags, "p", ["f"], {"e": [1]})
    tags[0]["t"].append(9)
    assert m.tags[0] == {"t": [1]}
    assert m.select_keys(["b"]).keys == ["b"]
    with pytest.raises(ValueError):
        m.select_keys(["a", "a"])
    with pytest.raises(RuntimeError):
        m.select_keys(["zz"])
    with pytest.raises(ValueError):
        m.reorder([0])
    with pytest.raises(ValueError):
        m.reorder([0, 0])
    m.reorder([1, 0])
    assert m.keys == ["b", "a"]
    assert [c.keys for c in KVBatchMeta(list("abcde"), partition_id="p").chunk(2)] == [["a", "b", "c"], ["d", "e"]]
    with pytest.raises(ValueError):
        KVBatchMeta.concat([m, KVBatchMeta(["c"], partition_id="q")])
    with pytest.raises(ValueError):
        KVBatchMeta.concat([m, KVBatchMeta(["c"], partition_id="p", fields=["g"])])
    assert KVBatchMeta.concat([]).size == 0
    with pytest.warns(UserWarning):  # the second piece has no extra_info
        joined = KVBatchMeta.concat([m, KVBatchMeta(["c"], partition_id="p", fields=["f"])])
    assert joined.keys == ["b", "a", "c"] and joined.extra_info == {"e": [1]}


def test_production_status_is_an_int8_array() -> None:
    m = _meta(2, production_status=np.array([True, False]))
    assert m.production_status.dtype == np.int8
