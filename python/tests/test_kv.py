"""The KV API from Python, embedded and against a real `tq serve`."""

from __future__ import annotations

import numpy as np
import pytest

import tq

DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16, np.uint32,
          np.uint64, np.float16, np.float32, np.float64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_round_trips(client: tq.Client, dtype) -> None:
    p = client.partition("dtypes")
    data = (np.arange(24) % 7).astype(dtype).reshape(4, 2, 3)
    p.kv_batch_put(["a", "b", "c", "d"], {"x": data})
    back = p.kv_batch_get(["a", "b", "c", "d"], ["x"])["x"]
    assert back.dtype == np.dtype(dtype)
    assert back.shape == (4, 2, 3)
    np.testing.assert_array_equal(back, data)


def test_rows_follow_the_order_of_the_keys(client: tq.Client) -> None:
    p = client.partition("order")
    p.kv_batch_put(["a", "b", "c"], {"x": np.array([[1], [2], [3]], dtype=np.int64)})
    back = p.kv_batch_get(["c", "a", "b"])["x"]
    assert back[:, 0].tolist() == [3, 1, 2]


def test_a_dense_field_is_one_array_viewing_tqs_buffer(client: tq.Client) -> None:
    p = client.partition("views")
    data = np.random.default_rng(0).standard_normal((8, 1024)).astype(np.float32)
    p.kv_batch_put([f"k{i}" for i in range(8)], {"x": data})
    first = p.kv_batch_get([f"k{i}" for i in range(8)])["x"]
    # Not a copy: the array owns nothing and its base is tq's buffer object.
    assert not first.flags.owndata
    assert isinstance(first.base, tq.Buffer)
    assert first.base.nbytes == data.nbytes
    assert first.__array_interface__["data"][0] == first.base.address
    np.testing.assert_array_equal(first, data)
    # Writable exactly when the bytes are this read's alone; writing then changes nothing
    # stored, and a view of bytes tq shares refuses writes.
    assert first.flags.writeable == first.base.writable
    if first.flags.writeable:
        first[0, 0] = 123.0
        np.testing.assert_array_equal(p.kv_batch_get([f"k{i}" for i in range(8)])["x"], data)
    else:
        with pytest.raises(ValueError):
            first[0, 0] = 1.0
    # A view keeps its buffer alive after everything else let go of it.
    kept = p.kv_batch_get([f"k{i}" for i in range(8)])["x"]
    del p
    assert float(kept.sum()) == pytest.approx(float(data.sum()), rel=1e-5)


def test_one_key_is_read_where_tq_keeps_it(client: tq.Client) -> None:
    p = client.partition("same-address")
    p.kv_put("k", {"x": np.arange(4096, dtype=np.float32)})
    one = p.kv_batch_get(["k"])["x"]
    two = p.kv_batch_get(["k"])["x"]
    # The in-memory store hands out its own bytes: two reads view the same memory, which
    # is therefore read-only.
    assert one.base.address == two.base.address
    assert one.shape == (1, 4096)
    assert not one.base.writable and not one.flags.writeable
    with pytest.raises(ValueError):
        one[0, 0] = 1.0


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_an_embedded_put_copies_unless_the_array_is_handed_over(client: tq.Client) -> None:
    p = client.partition("handover")
    copied = np.arange(4096, dtype=np.float32)
    p.kv_put("copied", {"x": copied})
    assert _address(p.kv_get("copied")["x"]) != _address(copied)
    # The store has its own copy: the caller's array stays writable and writes do not reach it.
    copied[0] = -1.0
    assert p.kv_get("copied")["x"][0] == 0.0

    given = np.arange(4096, dtype=np.float32)
    p.kv_put("given", {"x": given}, copy=False)
    back = p.kv_get("given")["x"]
    # No copy at all: the read views the memory of the array that was put.
    assert _address(back) == _address(given)
    np.testing.assert_array_equal(back, np.arange(4096, dtype=np.float32))
    # The handed-over array is read-only now, so the stored data cannot change under tq.
    assert not given.flags.writeable
    with pytest.raises(ValueError):
        given[0] = 1.0
    del given, back
    assert p.kv_get("given")["x"][4095] == 4095.0

    # A batch handed over: each key's row views the array's memory, row by row.
    rows = np.arange(64, dtype=np.float32).reshape(8, 8)
    p.kv_batch_put([f"r{i}" for i in range(8)], {"x": rows}, copy=False)
    assert _address(p.kv_get("r3")["x"]) == _address(rows) + 3 * 8 * 4
    p.kv_clear(["copied", "given"] + [f"r{i}" for i in range(8)])
    assert p.kv_list() == {}


def test_a_connected_put_sends_from_the_array_without_freezing_it(served: str) -> None:
    with tq.connect(served) as c:
        p = c.partition("remote-copy")
        data = np.arange(3 * 1024, dtype=np.float64).reshape(3, 1024)
        p.kv_batch_put(["a", "b", "c"], {"x": data})
        assert data.flags.writeable, "a connected put keeps no reference to the array"
        data += 1.0
        np.testing.assert_array_equal(p.kv_batch_get(["a", "b", "c"])["x"], data - 1.0)
        p.kv_batch_put(["a", "b", "c"], {"x": data}, copy=True)
        np.testing.assert_array_equal(p.kv_batch_get(["a", "b", "c"])["x"], data)


def test_a_non_contiguous_array_is_taken_as_its_values(client: tq.Client) -> None:
    p = client.partition("strided")
    data = np.arange(40, dtype=np.int32).reshape(4, 10)[:, ::2]
    assert not data.flags.c_contiguous
    p.kv_batch_put(["a", "b", "c", "d"], {"x": data})
    np.testing.assert_array_equal(p.kv_batch_get(["a", "b", "c", "d"])["x"], data)


def test_ragged_fields_are_lists_of_arrays(client: tq.Client) -> None:
    p = client.partition("ragged")
    rows = [np.arange(n, dtype=np.int64) for n in (3, 1, 5)]
    p.kv_batch_put(["a", "b", "c"], {"tokens": rows})
    back = p.kv_batch_get(["c", "a", "b"])["tokens"]
    assert [r.tolist() for r in back] == [rows[2].tolist(), rows[0].tolist(), rows[1].tolist()]
    assert all(isinstance(r.base, tq.Buffer) for r in back)


def test_object_fields_keep_python_values(client: tq.Client) -> None:
    p = client.partition("objects")
    values = ["héllo", b"\x00raw", 7, 2.5, True, None, {"nested": [1, 2]}]
    keys = [f"k{i}" for i in range(len(values))]
    p.kv_batch_put(keys, {"obj": values})
    back = p.kv_batch_get(keys)["obj"]
    assert back == values
    assert type(back[4]) is bool and type(back[2]) is int


def test_kv_put_and_kv_get_take_one_row(client: tq.Client) -> None:
    p = client.partition("single")
    p.kv_put("k", {"ids": np.array([1, 2, 3]), "score": 0.5, "text": "hi"}, tags={"step": 3})
    got = p.kv_get("k")
    assert got["ids"].tolist() == [1, 2, 3]
    assert got["score"] == 0.5
    assert got["text"] == "hi"
    assert p.kv_list() == {"k": {"step": 3}}


def test_tags_list_and_clears(client: tq.Client) -> None:
    p = client.partition("tags")
    p.kv_batch_put(
        ["a", "b"],
        {"x": np.zeros((2, 2)), "y": np.ones((2, 1))},
        tags=[{"ok": True, "n": 1, "w": 0.5, "s": "x"}, {}],
    )
    assert p.kv_list() == {"a": {"ok": True, "n": 1, "w": 0.5, "s": "x"}, "b": {}}
    p.kv_clear_fields(["a"], ["y"])
    assert sorted(p.kv_batch_get(["a"]).keys()) == ["x"]
    p.kv_clear(["a", "missing"])
    assert list(p.kv_list()) == ["b"]
    assert "tags" in client.list_partitions()


def test_bad_configuration_is_refused_with_the_key() -> None:
    with pytest.raises(tq.InvalidError) as bad:
        tq.Client.embedded(storage={"no_such_key": 1})
    assert "no_such_key" in str(bad.value)


def test_a_closed_client_says_so() -> None:
    c = tq.Client.embedded(storage={"num_units": 3})
    p = c.partition("p")
    p.kv_put("k", {"x": np.zeros(1)})
    c.close()
    c.close()
    assert c.closed
    with pytest.raises(tq.ClosedError):
        p.kv_list()


def test_a_real_deployment_shares_keys_between_clients(served: str) -> None:
    with tq.connect(served) as writer, tq.connect(served) as reader:
        data = np.arange(12, dtype=np.float64).reshape(3, 4)
        writer.partition("shared").kv_batch_put(["a", "b", "c"], {"x": data, "t": ["p", "q", "r"]})
        back = reader.partition("shared").kv_batch_get(["c", "b", "a"])
        np.testing.assert_array_equal(back["x"], data[::-1])
        assert back["t"] == ["r", "q", "p"]
        assert not back["x"].flags.owndata
        reader.partition("shared").kv_clear(["a", "b", "c"])
        assert writer.partition("shared").kv_list() == {}


def test_a_deployment_that_is_not_there_is_unavailable() -> None:
    with pytest.raises(tq.TqError) as gone:
        tq.connect("tcp://127.0.0.1:1", net={"connect_timeout_ms": 500, "retry_max_elapsed_ms": 500})
    assert isinstance(gone.value, (tq.UnavailableError, tq.TimeoutError)), repr(gone.value)


def test_tags_alone_and_updates_by_merge(client: tq.Client) -> None:
    p = client.partition("update")
    p.kv_set_tags(["a", "b"], [{"stage": "new"}, {"stage": "new", "w": 2}])
    assert p.kv_tags(["b", "a"]) == [{"stage": "new", "w": 2}, {"stage": "new"}]
    p.kv_batch_put(["a", "b"], {"x": np.array([[1, 2], [3, 4]], dtype=np.int64)})
    p.kv_update(["a", "b"], {"x": np.array([[10, 10], [0, 100]], dtype=np.int64)}, "add")
    assert p.kv_batch_get(["a", "b"])["x"].tolist() == [[11, 12], [3, 104]]
    p.kv_update(["a", "b"], {"x": np.array([[5, 50], [5, 5]], dtype=np.int64)}, "max")
    assert p.kv_batch_get(["a", "b"])["x"].tolist() == [[11, 50], [5, 104]]
    p.kv_update(["a"], {"x": np.array([[7, 8]], dtype=np.int64)}, "concat", dim=0)
    assert p.kv_get("a")["x"].tolist() == [11, 50, 7, 8]
    with pytest.raises(tq.TqError):
        p.kv_update(["a"], {"x": np.array([[1, 1]], dtype=np.int64)}, "no-such-merge")


def test_links_share_a_public_payload(client: tq.Client) -> None:
    public = client.partition("__public__")
    public.kv_put("prompt-0", {"prompt": np.arange(4, dtype=np.int32)})
    p = client.partition("responses")
    p.kv_link(["r0", "r1"], ["prompt-0", "prompt-0"], ["prompt"])
    p.kv_batch_put(["r0", "r1"], {"response": np.array([[1], [2]], dtype=np.int32)})
    got = p.kv_batch_get(["r0", "r1"])
    assert got["prompt"].tolist() == [[0, 1, 2, 3]] * 2
    # The public sample cannot be cleared while it is linked; unlinking frees it.
    with pytest.raises(tq.ConflictError):
        public.kv_clear(["prompt-0"])
    assert p.kv_unlink(["r0", "r1"], ["prompt"]) == 2
    public.kv_clear(["prompt-0"])
    assert public.kv_list() == {}


def test_tags_of_a_missing_key_are_not_found(client: tq.Client) -> None:
    p = client.partition("tags-missing")
    p.kv_set_tags(["a"], [{"x": 1}])
    with pytest.raises(tq.NotFoundError) as missing:
        p.kv_tags(["a", "b"])
    assert missing.value.key == "b"
