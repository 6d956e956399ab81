"""The metadata API from Python: put, fetch, get_data, clears; the GIL, Ctrl-C, and two
processes consuming one partition of a real `tq serve` exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import tq


def test_a_pipeline_stage_by_stage(client: tq.Client) -> None:
    p = client.partition("pipeline")
    prompts = p.put({"prompt": np.arange(8, dtype=np.int64).reshape(4, 2), "text": ["a", "b", "c", "d"]})
    assert isinstance(prompts, tq.BatchMeta) and len(prompts) == 4 and prompts.size == 4
    assert prompts.partition == "pipeline"
    assert sorted(prompts.field_names) == ["prompt", "text"]

    # A rollout stage takes the prompts and writes responses into the same samples.
    batch = p.fetch(["prompt"], task="rollout", batch_size=4)
    assert batch.global_indexes == prompts.global_indexes
    data = client.get_data(batch)
    client.put(batch, {"response": data["prompt"] * 10})
    status = p.production_status(["prompt", "response"])
    assert status["produced"] == [[True, True]] * 4

    # The trainer needs both fields; it gets every sample once.
    train = p.fetch(["prompt", "response"], task="train", batch_size=4)
    got = client.get_data(train)
    np.testing.assert_array_equal(got["response"], np.arange(8).reshape(4, 2) * 10)
    assert client.get_data(train, fields=["prompt"]).keys() == {"prompt"}
    assert p.consumption_status("train")["consumed"] == [True] * 4
    assert len(p.fetch(["prompt"], task="train", batch_size=1, timeout=0)) == 0

    # Re-reading after a reset, then clearing.
    p.reset_consumption("train")
    assert len(p.fetch(["prompt"], task="train", batch_size=4, timeout=0)) == 4
    client.clear_samples(train)
    # Emptied (and not complete), the partition is gone.
    assert "pipeline" not in client.list_partitions()
    with pytest.raises(tq.NotFoundError):
        p.production_status(["prompt"])


def test_meta_selects_and_chunks(client: tq.Client) -> None:
    p = client.partition("meta")
    meta = p.put({"x": np.zeros((5, 1)), "y": np.ones((5, 1))})
    parts = meta.chunk(2)
    assert [len(m) for m in parts] == [3, 2]
    assert parts[0].global_indexes + parts[1].global_indexes == meta.global_indexes
    assert meta.select_fields(["y"]).field_names == ["y"]
    assert meta.select_samples([4, 0]).global_indexes == [meta.global_indexes[4], meta.global_indexes[0]]
    with pytest.raises(tq.InvalidError):
        meta.chunk(0)
    assert "size=5" in repr(meta)


def test_leased_fetches_are_acknowledged(client: tq.Client) -> None:
    p = client.partition("leases")
    p.put({"x": np.zeros((4, 1))})
    batch = p.fetch(["x"], task="t", batch_size=4, lease=30)
    assert batch.lease is not None
    assert p.consumption_status("t")["leased"] == [True] * 4
    assert client.ack("t", batch) == 4
    assert client.ack("t", batch) == 4, "a repeated ack answers as the first did"
    assert p.consumption_status("t")["consumed"] == [True] * 4
    with pytest.raises(tq.InvalidError):
        client.ack("t", p.fetch(["x"], task="other", batch_size=4))


def test_a_lease_is_renewed_until_acknowledged(client: tq.Client) -> None:
    p = client.partition("renewed")
    p.put({"x": np.zeros((2, 1))})
    batch = p.fetch(["x"], task="t", batch_size=2, lease=30)
    assert client.renew_lease("t", batch, 120) == 2
    assert client.renew_lease("other", batch, 120) == 0, "another task holds nothing"
    assert client.ack("t", batch) == 2
    assert client.renew_lease("t", batch, 120) == 0, "acknowledged samples are not held"
    for bad in (0, -1, float("nan"), 1e30):
        with pytest.raises(tq.InvalidError):
            client.renew_lease("t", batch, bad)


def test_a_fetch_that_waits_too_long_times_out(client: tq.Client) -> None:
    p = client.partition("empty")
    p.put({"x": np.zeros((1, 1))})
    with pytest.raises(tq.TimeoutError) as waited:
        p.fetch(["x"], task="t", batch_size=2, timeout=0.2)
    assert isinstance(waited.value, TimeoutError)
    with pytest.raises(tq.InvalidError):
        p.fetch(["x"], task="t", batch_size=1, timeout=-1)


def test_a_complete_partition_ends_its_consumers(client: tq.Client) -> None:
    p = client.partition("ends")
    p.put({"x": np.zeros((3, 1))})
    p.complete()
    assert len(p.fetch(["x"], task="t", batch_size=2)) == 2
    assert len(p.fetch(["x"], task="t", batch_size=2)) == 1, "the last, smaller batch"
    with pytest.raises(tq.ClosedError):
        p.fetch(["x"], task="t", batch_size=2)
    p.clear()
    assert "ends" not in client.list_partitions()


def test_other_threads_run_while_a_fetch_waits(client: tq.Client) -> None:
    p = client.partition("gil")
    p.put({"seed": np.zeros((1, 1))})
    started = threading.Event()
    result: list = []

    def consumer() -> None:
        started.set()
        # Waits for a second sample; it only comes from the main thread below, which can run
        # only if this wait released the GIL (else this times out after 20 s and fails).
        result.append(p.fetch(["x"], task="t", batch_size=1, timeout=20))

    t = threading.Thread(target=consumer)
    t.start()
    started.wait()
    spins = sum(i for i in range(200_000))  # Python bytecode while the other thread waits
    p.put({"x": np.ones((1, 1))})
    t.join()
    assert spins > 0
    assert len(result) == 1 and len(result[0]) == 1


def _python(script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_ctrl_c_interrupts_a_waiting_fetch() -> None:
    child = _python(
        """
        import sys, tq
        with tq.Client.embedded() as c:
            p = c.partition("interrupt")
            try:
                print("waiting", flush=True)
                p.fetch(["x"], task="t", batch_size=1, timeout=120)
            except KeyboardInterrupt:
                print("interrupted", flush=True)
                sys.exit(3)
        """
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "waiting"
    child.send_signal(signal.SIGINT)
    # (The timeout turns a fetch that ignores Ctrl-C into a failure instead of a hang.)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 3, err
    assert "interrupted" in out


def test_two_processes_consume_a_partition_exactly_once(served: str) -> None:
    with tq.connect(served) as producer:
        p = producer.partition("shared-stream")
        written = []
        for start in range(0, 96, 16):
            meta = p.put({"x": np.arange(start, start + 16, dtype=np.int64).reshape(16, 1)})
            written += meta.global_indexes
        p.complete()
        consumer = """
            import json, sys, tq
            with tq.connect(sys.argv[1]) as c:
                p = c.partition("shared-stream")
                def take():
                    batch = p.fetch(["x"], task="train", batch_size=4)
                    return c.get_data(batch)["x"][:, 0].tolist()
                seen = take()
                # Both processes hold a batch before either goes on, so both take part.
                print("first", flush=True)
                sys.stdin.readline()
                while True:
                    try:
                        seen += take()
                    except tq.ClosedError:
                        break
            print(json.dumps(seen), flush=True)
        """
        children = [
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(consumer), served],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "first", child.stderr.read() if child.stderr else ""
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = [c.communicate(timeout=120) for c in children]
        for child, (_, err) in zip(children, outputs):
            assert child.returncode == 0, err
        seen = [json.loads(out) for out, _ in outputs]
        everything = sorted(seen[0] + seen[1])
        assert everything == list(range(96)), "every sample consumed once, none twice"
        assert len(seen[0]) >= 4 and len(seen[1]) >= 4, "both processes took part"
        assert len(written) == 96
        p.clear()
