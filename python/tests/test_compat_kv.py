"""tq.compat's KV API, init/close and configuration, as TransferQueue code calls them."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from typing import Iterator

import pytest

if os.environ.get("TQ_REQUIRE_TORCH"):
    import torch
    import tensordict
else:
    torch = pytest.importorskip("torch")
    tensordict = pytest.importorskip("tensordict")

import tq
import tq.compat as transfer_queue

from conftest import memfd_ranges, tq_process


@pytest.fixture
def tq_compat() -> Iterator[object]:
    transfer_queue.init({"backend": {"SimpleStorage": {"num_data_storage_units": 3}}})
    try:
        yield transfer_queue
    finally:
        transfer_queue.close()
    assert transfer_queue.DEPLOYMENT_VARIABLE not in os.environ


def test_kv_round_trip_returns_a_tensordict(tq_compat) -> None:
    td = tensordict.TensorDict({"x": torch.arange(6.0).reshape(3, 2), "ids": torch.tensor([7, 8, 9])}, batch_size=[3])
    meta = transfer_queue.kv_batch_put(["a", "b", "c"], "train", fields=td, tags=[{"i": 0}, {"i": 1}, {"i": 2}])
    assert isinstance(meta, transfer_queue.KVBatchMeta)
    assert (meta.keys, meta.partition_id, meta.fields, meta.size) == (["a", "b", "c"], "train", ["ids", "x"], 3)
    assert meta.tags == [{"i": 0}, {"i": 1}, {"i": 2}]
    back = transfer_queue.kv_batch_get(["c", "a"], "train")
    assert isinstance(back, tensordict.TensorDictBase)
    assert back["x"].tolist() == [[4.0, 5.0], [0.0, 1.0]]
    assert back["ids"].tolist() == [9, 7]
    only = transfer_queue.kv_batch_get("b", "train", select_fields="ids")
    assert list(only.keys()) == ["ids"] and only["ids"].tolist() == [8]
    by_meta = transfer_queue.kv_batch_get_by_meta(meta, select_fields=["x"])
    assert by_meta["x"].shape == (3, 2)
    with pytest.raises(ValueError):
        transfer_queue.kv_batch_get_by_meta(meta, select_fields=["nope"])


def test_kv_put_merges_tags_and_kv_list_shows_them(tq_compat) -> None:
    transfer_queue.kv_put("k", "p", fields={"x": torch.ones(4), "text": "hello"}, tag={"stage": "rollout"})
    meta = transfer_queue.kv_put("k", "p", tag={"reward": 1.5})
    assert meta.tags == [{"stage": "rollout", "reward": 1.5}]
    assert transfer_queue.kv_list("p") == {"p": {"k": {"stage": "rollout", "reward": 1.5}}}
    assert transfer_queue.kv_list("absent") == {}
    assert "p" in transfer_queue.kv_list()
    back = transfer_queue.kv_batch_get(["k"], "p")
    assert back["x"].tolist() == [[1.0, 1.0, 1.0, 1.0]]
    transfer_queue.kv_clear("k", "p")
    transfer_queue.kv_clear(["k", "never"], "p")  # missing keys are ignored
    assert transfer_queue.kv_list("p") in ({}, {"p": {}})
    with pytest.raises(ValueError):
        transfer_queue.kv_put("k", "p")  # neither fields nor a tag


def test_bad_writes_change_nothing(tq_compat) -> None:
    td = tensordict.TensorDict({"x": torch.zeros(3, 1)}, batch_size=[3])
    with pytest.raises(ValueError):
        transfer_queue.kv_batch_put(["a", "b"], "bad", fields=td)
    with pytest.raises(ValueError):
        transfer_queue.kv_batch_put(["a", "a", "b"], "bad", fields=td)
    with pytest.raises(ValueError):
        transfer_queue.kv_batch_put(["a", "b", "c"], "bad", fields=td, tags=[{}])
    assert transfer_queue.kv_list("bad") == {}


def test_a_missing_key_is_an_error_not_a_shorter_batch(tq_compat) -> None:
    transfer_queue.kv_put("here", "p", fields={"x": torch.zeros(1)})
    with pytest.raises(transfer_queue.StorageKeyNotFoundError) as missing:
        transfer_queue.kv_batch_get(["here", "gone"], "p")
    assert missing.value.key == "gone"


def test_the_async_variants(tq_compat) -> None:
    async def main() -> None:
        metas = await asyncio.gather(
            *(transfer_queue.async_kv_put(f"k{i}", "aio", fields={"x": torch.full((2,), float(i))}) for i in range(8))
        )
        assert [m.keys[0] for m in metas] == [f"k{i}" for i in range(8)]
        back = await transfer_queue.async_kv_batch_get([f"k{i}" for i in range(8)], "aio")
        assert back["x"][:, 0].tolist() == [float(i) for i in range(8)]
        assert len((await transfer_queue.async_kv_list("aio"))["aio"]) == 8
        await transfer_queue.async_kv_clear([f"k{i}" for i in range(8)], "aio")

    asyncio.run(main())


def test_a_child_process_attaches_and_its_close_leaves_the_deployment(tq_compat) -> None:
    transfer_queue.kv_put("from-parent", "shared", fields={"x": torch.arange(3)})
    child = textwrap.dedent("""
        import tq.compat as transfer_queue
        transfer_queue.init()
        got = transfer_queue.kv_batch_get(["from-parent"], "shared")["x"].tolist()
        transfer_queue.kv_put("from-child", "shared", fields={"x": torch.arange(3) * 10})
        transfer_queue.close()
        print(got)
    """)
    done = subprocess.run(
        [sys.executable, "-c", "import torch\n" + child], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[[0, 1, 2]]"
    # The child's close() did not stop the deployment this process started.
    assert transfer_queue.kv_batch_get(["from-child"], "shared")["x"].tolist() == [[0, 10, 20]]


def test_the_originals_configuration_is_mapped_or_refused() -> None:
    with pytest.raises(tq.UnsupportedError) as mooncake:
        transfer_queue.init({"backend": {"storage_backend": "MooncakeStore"}})
    assert "Redis Cluster" in str(mooncake.value)
    with pytest.raises(tq.UnsupportedError) as yuanrong:
        transfer_queue.init({"backend": {"storage_backend": "Yuanrong"}})
    assert "nearest" in str(yuanrong.value)
    with pytest.raises(tq.InvalidError) as sampler:
        transfer_queue.init({"controller": {"sampler": "NoSuchSampler"}})
    assert "Could not find sampler" in str(sampler.value)
    with pytest.raises(tq.InvalidError, match="total_storage_size"):
        transfer_queue.init({"backend": {"SimpleStorage": {"total_storage_size": 0}}})
    assert transfer_queue.DEPLOYMENT_VARIABLE not in os.environ
    # A capacity: total_storage_size rows over all units, refused past it (the 4 rows lie on
    # one unit: tq bounds the total, not per-unit shares).
    transfer_queue.init(
        {
            "controller": {"sampler": transfer_queue.GRPOGroupNSampler(n_samples_per_prompt=2)},
            "backend": {"SimpleStorage": {"num_data_storage_units": 2, "total_storage_size": 4}},
        }
    )
    try:
        td = tensordict.TensorDict({"x": torch.zeros(4, 1)}, batch_size=[4])
        transfer_queue.kv_batch_put([f"k{i}" for i in range(4)], "cap", fields=td)
        with pytest.raises(tq.CapacityExceededError):
            transfer_queue.kv_batch_put(["k4", "k5"], "cap", fields=tensordict.TensorDict({"x": torch.zeros(2, 1)}, batch_size=[2]))
    finally:
        transfer_queue.close()


def test_a_call_before_init_says_so() -> None:
    assert transfer_queue.DEPLOYMENT_VARIABLE not in os.environ
    with pytest.raises(RuntimeError, match="init"):
        transfer_queue.kv_list()


def test_without_ray_the_controller_is_on_a_private_unix_socket() -> None:
    conf = transfer_queue.init()
    try:
        url = conf["backend"]["tq"]["connect"]
        assert url.startswith("unix:///")
        path = url[len("unix://"):]
        assert os.path.exists(path)
        assert os.stat(os.path.dirname(path)).st_mode & 0o077 == 0  # nobody else's to open
    finally:
        transfer_queue.close()
    assert not os.path.exists(os.path.dirname(path))


def test_ssd_offload_puts_large_cells_in_files_below_its_path(tmp_path) -> None:
    path = tmp_path / "offload" / "nested"  # created with its parents, as the original does
    transfer_queue.init(
        {"backend": {"SimpleStorage": {"num_data_storage_units": 1, "ssd_offload": {"enabled": True, "path": str(path)}}}}
    )
    try:
        big = torch.arange(2 * 2**20 // 4, dtype=torch.int32).reshape(2, -1)  # 4 MiB rows: on disk
        small = torch.tensor([[1.0], [2.0]])  # 4-byte cells: in memory
        transfer_queue.kv_batch_put(["a", "b"], "ssd", fields=tensordict.TensorDict({"big": big, "small": small}, batch_size=[2]))
        (unit,) = transfer_queue.get_client()._client.status()["units"]
        assert unit["offloaded_bytes"] == big.numel() * 4
        assert sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) >= big.numel() * 4
        back = transfer_queue.kv_batch_get(["b", "a"], "ssd")
        assert torch.equal(back["big"], big.flip(0)) and torch.equal(back["small"], small.flip(0))
        transfer_queue.kv_clear(["a", "b"], "ssd")
        assert transfer_queue.get_client()._client.status()["units"][0]["offloaded_bytes"] == 0
    finally:
        transfer_queue.close()


def test_ssd_offload_keys_are_checked_before_anything_starts(tmp_path) -> None:
    with pytest.raises(tq.InvalidError, match="ssd_offload.path is required"):
        transfer_queue.init({"backend": {"SimpleStorage": {"ssd_offload": {"enabled": True}}}})
    with pytest.raises(tq.InvalidError, match="unknown keys threshold"):
        transfer_queue.init({"backend": {"SimpleStorage": {"ssd_offload": {"enabled": True, "path": str(tmp_path), "threshold": 1}}}})
    assert transfer_queue.DEPLOYMENT_VARIABLE not in os.environ
    # Off (the default) needs no path.
    transfer_queue.init({"backend": {"SimpleStorage": {"ssd_offload": {"enabled": False}}}})
    transfer_queue.close()


def _scrape(endpoint: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as answer:
        assert answer.status == 200
        return answer.read().decode()


def test_metrics_enabled_serves_prometheus_on_the_endpoint(tmp_path) -> None:
    assert transfer_queue.get_metrics_endpoint() is None  # not initialized
    conf = transfer_queue.init({"metrics": {"enabled": True, "port": 0}})
    try:
        endpoint = transfer_queue.get_metrics_endpoint()
        assert endpoint is not None and endpoint.startswith("127.0.0.1:")
        assert conf["metrics"]["endpoint"] == endpoint
        transfer_queue.kv_batch_put(["a", "b", "c"], "scraped", fields=tensordict.TensorDict({"x": torch.zeros(3, 2)}, batch_size=[3]))
        transfer_queue.kv_batch_get(["a"], "scraped")
        text = _scrape(endpoint)
        # State gauges computed for this scrape, and request metrics recorded in this process.
        assert 'tq_partition_samples_total{partition_id="scraped"} 3' in text
        assert "tq_storage_cells_total" in text
        assert 'tq_controller_request_total{op_type="KV_PREPARE_PUT"} 1' in text
        assert 'tq_controller_request_total{op_type="NOTIFY_DATA_UPDATE"} 1' in text
        # A child process attached through the environment sees the same endpoint.
        child = textwrap.dedent("""
            import tq.compat as transfer_queue
            transfer_queue.init()
            print(transfer_queue.get_metrics_endpoint())
            transfer_queue.close()
        """)
        done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == endpoint
    finally:
        transfer_queue.close()
    assert transfer_queue.get_metrics_endpoint() is None
    with pytest.raises(OSError):
        _scrape(endpoint)  # stopped with the deployment
    with pytest.raises(tq.InvalidError, match="metrics.port"):
        transfer_queue.init({"metrics": {"enabled": True, "port": 70000}})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd segments are Linux only")
@pytest.mark.parametrize("shared_memory", [None, False])
def test_a_client_on_the_units_host_puts_large_payloads_through_shared_memory_by_default(shared_memory) -> None:
    keys = [f"k{i}" for i in range(4)]
    x = torch.arange(4 * 2**18, dtype=torch.float32).reshape(4, -1)  # rows of 1 MiB
    with tq_process("serve", "--listen", "tcp://127.0.0.1:0", "--units", "2") as server:
        own = {"connect": server.endpoint("controller")}
        if shared_memory is not None:
            own["net"] = {"shared_memory": shared_memory}
        transfer_queue.init({"backend": {"tq": own}})
        try:
            transfer_queue.kv_batch_put(keys, "shm", fields=tensordict.TensorDict({"x": x}, batch_size=[4]))
            # The units keep a put's cells in the segments the client handed them.
            assert (len(memfd_ranges(server.proc.pid)) > 0) == (shared_memory is None)
            got = transfer_queue.kv_batch_get(keys, "shm")
            assert torch.equal(got["x"], x)
            # A tensor read from shared pages is this caller's copy: writing it is fine and
            # changes nothing stored.
            got["x"] += 1
            assert torch.equal(transfer_queue.kv_batch_get(keys, "shm")["x"], x)
        finally:
            transfer_queue.close()
