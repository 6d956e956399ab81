"""Fixtures: an embedded client, and a real `tq serve` process for the remote tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
from typing import Iterator

import pytest

import tq


@pytest.fixture
def client() -> Iterator[tq.Client]:
    with tq.Client.embedded() as c:
        yield c


def _tq_binary() -> str | None:
    explicit = os.environ.get("TQ_BIN")
    if explicit:
        return explicit
    return shutil.which("tq")


@contextlib.contextmanager
def serve(*extra: str, units: int | None = 2) -> Iterator[str]:
    """Runs `tq serve --units 2` (`units=None`: no units, for shared storage; plus `extra`
    arguments) for the duration; yields its URL."""
    binary = _tq_binary()
    if binary is None:
        if os.environ.get("TQ_REQUIRE_SERVE"):
            pytest.fail("TQ_REQUIRE_SERVE is set but no tq binary was found (set TQ_BIN)")
        pytest.skip("no tq binary (set TQ_BIN to target/debug/tq)")
    env = dict(os.environ)
    env.pop("TQ_NET_TOKEN", None)
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "tcp://127.0.0.1:0", *(["--units", str(units)] if units else []), *extra],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:
            if line.startswith("listening controller "):
                url = line.split()[-1]
                break
        assert url, "tq serve did not say where it listens"
        # Keep reading its output so the server never blocks on a full pipe.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def served() -> Iterator[str]:
    """The URL of a `tq serve --units 2` started for the test and stopped after it."""
    with serve() as url:
        yield url
