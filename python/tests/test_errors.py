"""One test per error kind, each raised by a real failure, with its retry status and the
names the error carries (partition, key, field, unit)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tq
from conftest import free_port, serve, tq_process


def test_a_missing_key_is_not_found_naming_partition_and_key(client: tq.Client) -> None:
    p = client.partition("errors")
    p.kv_put("here", {"x": np.zeros(2)})
    with pytest.raises(tq.NotFoundError) as missing:
        p.kv_batch_get(["here", "absent"])
    e = missing.value
    assert (e.partition, e.key) == ("errors", "absent"), repr(e)
    assert e.retry == "never" and not e.retryable
    assert isinstance(e, KeyError)


def test_a_refused_put_is_invalid_and_changes_nothing(client: tq.Client) -> None:
    p = client.partition("refused")
    p.kv_put("here", {"x": np.zeros(2)})
    with pytest.raises(tq.InvalidError) as refused:
        p.kv_batch_put(["a", "b"], {"x": np.zeros((3, 2))})
    assert refused.value.retry == "never"
    assert isinstance(refused.value, ValueError)
    # A field whose dtype changes is refused naming the field.
    with pytest.raises(tq.InvalidError) as retyped:
        p.kv_put("other", {"x": np.zeros(2, dtype=np.int8)})
    assert retyped.value.field == "x", repr(retyped.value)
    assert list(p.kv_list()) == ["here"]


def test_clearing_a_linked_sample_is_a_conflict(client: tq.Client) -> None:
    public = client.partition("__public__")
    public.kv_put("prompt", {"x": np.arange(3)})
    client.partition("linked").kv_link(["r"], ["prompt"], ["x"])
    with pytest.raises(tq.ConflictError) as conflict:
        public.kv_clear(["prompt"])
    assert conflict.value.retry == "never"
    assert list(public.kv_list()) == ["prompt"]


def test_a_full_unit_is_capacity_exceeded() -> None:
    with tq.Client.embedded(storage={"num_units": 1, "capacity_per_unit": 2}) as c:
        p = c.partition("full")
        p.kv_batch_put(["a", "b"], {"x": np.zeros((2, 1))})
        with pytest.raises(tq.CapacityExceededError) as full:
            p.kv_put("c", {"x": np.zeros(1)})
        assert full.value.retry in ("safe", "never")
        assert sorted(p.kv_list()) == ["a", "b"]
        # Space comes back when samples are cleared.
        p.kv_clear(["a"])
        p.kv_put("c", {"x": np.zeros(1)})


def test_a_wait_that_runs_out_is_a_timeout(client: tq.Client) -> None:
    p = client.partition("waits")
    p.put({"x": np.zeros((1, 1))})
    with pytest.raises(tq.TimeoutError) as late:
        p.fetch(["never-written"], batch_size=1, task="t", timeout=0.05)
    assert isinstance(late.value, TimeoutError)
    assert late.value.retry == "safe"


def test_a_deployment_that_goes_away_is_unavailable() -> None:
    with serve() as url:
        c = tq.connect(url, net={"request_timeout_ms": 2000, "retry_max_elapsed_ms": 1000})
        c.partition("p").kv_put("k", {"x": np.zeros(1)})
    # The server is gone (stopped by the block above).
    with pytest.raises((tq.UnavailableError, tq.TimeoutError)) as gone:
        c.partition("p").kv_list()
    assert gone.value.retry == "safe", repr(gone.value)
    c.close()


def test_a_unit_replaced_under_its_data_is_data_lost(tmp_path: pathlib.Path) -> None:
    with tq_process("controller", "--listen", "tcp://127.0.0.1:0", "--units", "1") as controller:
        url = controller.endpoint("controller")
        unit_at = f"tcp://127.0.0.1:{free_port()}"
        unit_args = ("storage-unit", "--controller", url, "--id", "unit-0", "--listen", unit_at)
        net = {"request_timeout_ms": 2000, "retry_max_elapsed_ms": 2000}
        with tq_process(*unit_args, until="unit") as unit, tq.connect(url, net=net) as c:
            p = c.partition("lost")
            p.kv_batch_put(["a", "b"], {"x": np.arange(4.0).reshape(2, 2)})
            unit.kill()
            with tq_process(*unit_args, until="unit"):
                with pytest.raises(tq.DataLostError) as lost:
                    p.kv_batch_get(["a", "b"])
                assert lost.value.unit == "unit-0", repr(lost.value)
                assert lost.value.retry == "never"
                # The replacement serves new writes.
                p.kv_put("c", {"x": np.ones(2)})
                assert p.kv_get("c")["x"].tolist() == [1.0, 1.0]


def test_a_wrong_token_is_permission_denied() -> None:
    with tq_process("serve", "--listen", "tcp://127.0.0.1:0", "--units", "1", env={"TQ_NET_TOKEN": "right"}) as server:
        url = server.endpoint("controller")
        with pytest.raises(tq.PermissionDeniedError) as denied:
            tq.connect(url, token="wrong")
        assert isinstance(denied.value, PermissionError)
        assert denied.value.retry == "never"
        with tq.connect(url, token="right") as c:
            assert c.list_partitions() == []


def test_links_on_shared_kv_storage_are_unsupported() -> None:
    config = {"storage": {"backend": "kv", "kv": {"stores": [{"url": "memory://"}]}}}
    with tq.Client.embedded(config) as c:
        c.partition("__public__").kv_put("prompt", {"x": np.arange(3)})
        with pytest.raises(tq.UnsupportedError) as unsupported:
            c.partition("p").kv_link(["r"], ["prompt"], ["x"])
        assert isinstance(unsupported.value, NotImplementedError)
        assert unsupported.value.retry == "never"


def test_a_damaged_checkpoint_is_corrupted(tmp_path: pathlib.Path) -> None:
    where = tmp_path / "ckpt"
    with tq.Client.embedded() as c:
        c.partition("p").kv_put("k", {"x": np.zeros(8)})
        c.save_checkpoint(where)
    manifest = where / "MANIFEST.toml"
    manifest.write_text(manifest.read_text().replace("samples", "sampels", 1))
    with tq.Client.embedded() as fresh:
        with pytest.raises(tq.CorruptedError) as bad:
            fresh.load_checkpoint(where)
        assert "MANIFEST.toml" in str(bad.value)
        assert bad.value.retry == "never"
        assert fresh.list_partitions() == []


def test_a_closed_client_is_closed() -> None:
    c = tq.Client.embedded()
    p = c.partition("p")
    c.close()
    with pytest.raises(tq.ClosedError) as closed:
        p.kv_list()
    assert closed.value.retry == "never"


def test_every_kind_has_its_class() -> None:
    kinds = {cls.kind: cls for cls in (getattr(tq.errors, name) for name in tq.errors.__all__)}
    assert set(kinds) == {
        "internal", "invalid", "not_found", "conflict", "capacity_exceeded", "data_lost",
        "unsupported", "timeout", "unavailable", "corrupted", "permission_denied", "closed",
    }
    assert all(issubclass(cls, tq.TqError) for cls in kinds.values())
    # The names an error carries are keyword arguments, None when absent.
    e = tq.NotFoundError("partition `p`: key `k` not found", "never", partition="p", key="k")
    assert (e.partition, e.key, e.field, e.unit) == ("p", "k", None, None)


def test_importing_the_source_tree_says_to_install_the_package(tmp_path: pathlib.Path) -> None:
    """A script run next to tq's sources (or a Ray worker started there) imports the source
    tree, which has no compiled module: the error says what happened and what to do."""
    sources = pathlib.Path(tq.__file__).resolve().parent
    tree = tmp_path / "tq"
    shutil.copytree(sources, tree, ignore=shutil.ignore_patterns("_native*.so", "_native*.pyd", "__pycache__"))
    done = subprocess.run(
        [sys.executable, "-c", "import tq"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "ImportError: tq's compiled module (tq._native) cannot be imported from " + str(tree) in done.stderr, done.stderr
    assert "pip install ./python" in done.stderr, done.stderr
