"""A Redis-backed deployment from Python: `tq serve` over a real redis-server, two Python
processes consuming one partition exactly once, payloads going to Redis directly."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import time
from typing import Iterator

import numpy as np
import pytest

import tq
from conftest import free_port, serve


@pytest.fixture
def redis_url() -> Iterator[str]:
    if shutil.which("redis-server") is None:
        if os.environ.get("TQ_REQUIRE_REDIS"):
            pytest.fail("TQ_REQUIRE_REDIS is set but redis-server is not installed")
        pytest.skip("redis-server is not installed")
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # ready when it answers PING (the deadline turns a dead server into a failure)
            ping = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True)
            if ping.stdout.strip() == "PONG":
                break
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_two_processes_share_a_redis_backed_deployment(redis_url: str, tmp_path: pathlib.Path) -> None:
    config = tmp_path / "tq.toml"
    config.write_text(f'[storage]\nbackend = "kv"\n\n[[storage.kv.stores]]\nurl = "{redis_url}"\n')
    with serve("--config", str(config), units=None) as url, tq.connect(url) as c:
        assert c.status()["storage_backend"] == "kv(redis)"
        p = c.partition("redis-stream")
        p.put({"x": np.arange(120, dtype=np.int64).reshape(120, 1), "s": [f"s{i}" for i in range(120)]})
        p.complete()
        consumer = textwrap.dedent("""
            import json, sys, tq
            seen = []
            with tq.connect(sys.argv[1]) as c:
                for _, data in c.partition("redis-stream").stream(["x", "s"], task="train", batch_size=4):
                    seen += data["x"][:, 0].tolist()
                    assert data["s"] == [f"s{v}" for v in data["x"][:, 0].tolist()]
            print(json.dumps(seen))
        """)
        children = [
            subprocess.Popen([sys.executable, "-c", consumer, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        outputs = [child.communicate(timeout=120) for child in children]
        for child, (_, err) in zip(children, outputs):
            assert child.returncode == 0, err
        seen = sorted(json.loads(outputs[0][0]) + json.loads(outputs[1][0]))
        assert seen == list(range(120)), "every sample consumed once across the two processes"
        # The payloads are in Redis itself, under tq's namespace.
        keys = subprocess.run(
            ["redis-cli", "-u", redis_url, "--scan", "--pattern", "tq/*"], capture_output=True, text=True
        ).stdout.split()
        assert len(keys) >= 120
        p.clear()


def test_tq_compat_puts_payloads_in_redis(redis_url: str) -> None:
    """A compat user reaches tq's own backends through ``backend.tq``: here the payloads go
    to Redis, and the deployment starts no storage unit."""
    torch = pytest.importorskip("torch")
    tensordict = pytest.importorskip("tensordict")
    import tq.compat as transfer_queue

    conf = {"backend": {"tq": {"storage": {"backend": "kv", "kv": {"stores": [{"url": redis_url}]}}}}}
    transfer_queue.init(conf)
    try:
        assert transfer_queue.get_client()._client.status()["units"] == []
        data = tensordict.TensorDict({"x": torch.arange(6).reshape(3, 2)}, batch_size=[3])
        transfer_queue.kv_batch_put(["a", "b", "c"], "p", fields=data)
        assert transfer_queue.kv_batch_get(["c", "a"], "p")["x"].tolist() == [[4, 5], [0, 1]]
        stored = subprocess.run(["redis-cli", "-u", redis_url, "--scan", "--pattern", "tq/*"], capture_output=True, text=True)
        assert stored.stdout.strip()  # the cells are in Redis
    finally:
        transfer_queue.close()
