"""tq.serve: a deployment hosted by a Python process, used from other processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import tq


def test_a_hosted_deployment_serves_another_process() -> None:
    with tq.serve(units=3, controller={"samplers": {"grpo": "grpo:2"}}) as server:
        assert server.url.startswith("tcp://127.0.0.1:")
        assert [u[0] for u in server.units] == ["unit-0", "unit-1", "unit-2"]
        with server.connect() as c:
            c.partition("p").kv_batch_put(["a", "b"], {"x": np.arange(4).reshape(2, 2)})
        child = subprocess.run(
            [sys.executable, "-c", textwrap.dedent("""
                import json, sys, tq
                with tq.connect(sys.argv[1]) as c:
                    got = c.partition("p").kv_batch_get(["b", "a"])["x"].tolist()
                    p = c.partition("groups")
                    p.put({"x": [1, 2, 3, 4]})
                    batch = p.fetch(["x"], task="t", batch_size=2, sampler="grpo")
                    print(json.dumps({"got": got, "group": len(batch), "units": len(c.status()["units"])}))
            """), server.url],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert child.returncode == 0, child.stderr
        assert json.loads(child.stdout) == {"got": [[2, 3], [0, 1]], "group": 2, "units": 3}
    assert server.closed
    # Closed: nothing listens there any more.
    with pytest.raises(tq.TqError):
        tq.connect(server.url, net={"connect_timeout_ms": 500, "retry_max_elapsed_ms": 500})


def test_the_hosting_process_calls_its_deployment_directly() -> None:
    """Server.local_client: no socket between the hosting process and its own controller and
    units, the same state as the connected clients, and closing it leaves the server up."""
    with tq.serve(units=2) as server:
        local = server.local_client()
        assert "in process" in repr(local._native)
        with server.connect() as remote:
            local.partition("p").kv_batch_put(["a", "b", "c"], {"x": np.arange(6).reshape(3, 2)})
            assert remote.partition("p").kv_batch_get(["c", "a"])["x"].tolist() == [[4, 5], [0, 1]]
            remote.partition("p").kv_batch_put(["d"], {"x": np.array([[9, 9]])})
            assert local.partition("p").kv_batch_get(["d"])["x"].tolist() == [[9, 9]]
            # Routing agrees: 20 rows (a run of 16 on one unit, 4 on the other) written by the
            # local client are where the connected one reads them.
            keys = [f"k{i}" for i in range(20)]
            local.partition("q").kv_batch_put(keys, {"x": np.arange(40).reshape(20, 2)})
            assert remote.partition("q").kv_batch_get(keys)["x"].tolist() == np.arange(40).reshape(20, 2).tolist()
            assert all(u["cells"] > 0 for u in remote.status()["units"])
            # A fetch by one consumes for the other: one controller.
            batch = local.partition("p").fetch(["x"], task="t", batch_size=4)
            assert len(batch) == 4
            assert remote.partition("p").consumption_status("t")["consumed"] == [True] * 4
            local.close()
            assert remote.partition("p").kv_batch_get(["a"])["x"].tolist() == [[0, 1]]
    with tq.serve(units=2, remote_units=True) as controller:
        with pytest.raises(tq.UnsupportedError, match="connect to"):
            controller.local_client()
    with pytest.raises(tq.ClosedError):
        server.local_client()


def test_serve_refuses_what_it_cannot_do() -> None:
    with pytest.raises(tq.InvalidError) as exposed:
        tq.serve(listen="tcp://0.0.0.0:0")
    assert "without a token" in str(exposed.value)
    with pytest.raises(tq.InvalidError):
        tq.serve(units=0)
    with pytest.raises(tq.InvalidError):
        tq.serve(default_sampler="no-such-sampler")


def test_a_deployment_on_object_storage_is_reachable(tmp_path) -> None:
    """`tq serve` over object storage in a directory (object_store's local files): a Python
    client writes and reads through the store itself, and the payloads are files there."""
    from conftest import serve

    store = tmp_path / "objects"
    store.mkdir()
    config = tmp_path / "tq.toml"
    config.write_text(f'[storage]\nbackend = "kv"\n\n[[storage.kv.stores]]\nurl = "file://{store}"\n')
    with serve("--config", str(config), units=None) as url, tq.connect(url) as c:
        assert c.status()["storage_backend"].startswith("kv(")
        p = c.partition("objects")
        data = np.arange(12, dtype=np.int32).reshape(3, 4)
        p.kv_batch_put(["a", "b", "c"], {"x": data, "s": ["p", "q", "r"]})
        back = p.kv_batch_get(["c", "a"])
        np.testing.assert_array_equal(back["x"], data[[2, 0]])
        assert back["s"] == ["r", "p"]
        assert sum(1 for f in store.rglob("*") if f.is_file()) >= 3
        p.kv_clear(["a", "b", "c"])
        assert p.kv_list() == {}


def test_units_served_elsewhere_register_with_a_controller() -> None:
    """tq.serve(remote_units=True) hosts the controller alone; tq.serve_unit hosts one unit that
    registers with it (here in this process, under Ray in an actor per node)."""
    with tq.serve(units=2, remote_units=True) as controller:
        assert controller.units == []
        units = [tq.serve_unit(controller.url, f"unit-{i}") for i in range(2)]
        try:
            assert [u.id for u in units] == ["unit-0", "unit-1"]
            with controller.connect() as c:
                assert sorted(u["id"] for u in c.status()["units"]) == ["unit-0", "unit-1"]
                p = c.partition("p")
                p.kv_batch_put(["a", "b", "c"], {"x": np.arange(6).reshape(3, 2)})
                assert p.kv_batch_get(["c", "a"])["x"].tolist() == [[4, 5], [0, 1]]
            with pytest.raises(tq.TqError):
                tq.serve_unit(controller.url, "unit-0")  # the id is held by a live unit
        finally:
            for u in units:
                u.close()
        assert all(u.closed for u in units)



def test_closing_a_client_right_after_a_clear_leaves_the_clear_finished() -> None:
    # A clear returns before the controller's release of its samples (which follows behind the
    # answer); close() waits for it instead of dropping it with the client's runtime. The
    # partition goes with the release of its last sample, so another client sees it gone.
    with tq.serve(units=2) as server:
        observer = server.local_client()
        for round in range(20):
            c = server.connect()
            p = c.partition(f"p{round}")
            p.kv_batch_put(["a", "b"], {"x": np.arange(4).reshape(2, 2)})
            p.kv_clear(["a", "b"])
            c.close()
            assert f"p{round}" not in observer.list_partitions(), f"round {round}"


def _server_threads(expected: int) -> int:
    """Threads of this process named ``tq-server`` (the servers' runtime, Linux), read until
    there are ``expected`` or 10 s passed: a new thread names itself once it runs."""
    deadline = time.monotonic() + 10
    while True:
        found = _threads_named("tq-server")
        if found == expected or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


def _threads_named(name: str) -> int:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return names.count(name)


def test_hosted_servers_run_the_configured_worker_threads() -> None:
    """One worker thread per hosted deployment or unit by default (decision 0051);
    ``net.server_threads`` sets it, and a bad count is refused before anything starts."""
    before = _threads_named("tq-server")
    with tq.serve(units=2) as server:
        assert _server_threads(before + 1) == before + 1
        with tq.serve(units=1, net={"server_threads": 3}) as wider:
            assert _server_threads(before + 4) == before + 4
            with wider.connect() as c:
                c.partition("p").kv_batch_put(["k"], {"x": np.arange(3).reshape(1, 3)})
                assert c.partition("p").kv_batch_get(["k"])["x"].tolist() == [[0, 1, 2]]
    with pytest.raises(tq.InvalidError, match="net.server_threads"):
        tq.serve(units=1, net={"server_threads": 0})
