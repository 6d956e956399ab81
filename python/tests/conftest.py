"""Fixtures: an embedded client, and a real `tq serve` process for the remote tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
from typing import Iterator

import pytest

import tq


def free_port() -> int:
    """A loopback TCP port nothing listens on (for a server that must come back on it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def client() -> Iterator[tq.Client]:
    with tq.Client.embedded() as c:
        yield c


def _tq_binary() -> str | None:
    explicit = os.environ.get("TQ_BIN")
    if explicit:
        return explicit
    return shutil.which("tq")


def memfd_ranges(pid: int | str = "self") -> list[tuple[int, int]]:
    """Process ``pid``'s mappings of tq's shared-memory segments (``/memfd:tq-cells``), sorted."""
    ranges = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            if "/memfd:tq-cells" in line:
                lo, hi = line.split()[0].split("-")
                ranges.append((int(lo, 16), int(hi, 16)))
    return sorted(ranges)


class TqProcess:
    """A running `tq` process: what it announced (`listening <what> ... <endpoint>` lines)."""

    def __init__(self, proc: subprocess.Popen, listening: list[list[str]]) -> None:
        self.proc = proc
        self.listening = listening

    def endpoint(self, what: str) -> str:
        """The endpoint of the first announced `what` (``"controller"``, ``"unit"``)."""
        return next(line[-1] for line in self.listening if line[1] == what)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self.proc.kill()
        self.proc.wait(timeout=30)


@contextlib.contextmanager
def tq_process(*args: str, until: str = "controller", env: dict | None = None) -> Iterator[TqProcess]:
    """Runs `tq <args>` for the block, entered once it has announced its `until` endpoint
    (``"controller"`` or ``"unit"``)."""
    binary = _tq_binary()
    if binary is None:
        if os.environ.get("TQ_REQUIRE_SERVE"):
            pytest.fail("TQ_REQUIRE_SERVE is set but no tq binary was found (set TQ_BIN)")
        pytest.skip("no tq binary (set TQ_BIN to target/debug/tq)")
    environment = dict(os.environ)
    environment.pop("TQ_NET_TOKEN", None)
    environment.update(env or {})
    proc = subprocess.Popen([binary, *args], stdout=subprocess.PIPE, text=True, env=environment)
    try:
        assert proc.stdout is not None
        listening: list[list[str]] = []
        for line in proc.stdout:
            if line.startswith("listening "):
                listening.append(line.split())
                if listening[-1][1] == until:
                    break
        assert listening and listening[-1][1] == until, f"tq {args[0]} announced {listening}, then exited"
        # Keep reading its output so the server never blocks on a full pipe.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield TqProcess(proc, listening)
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


@contextlib.contextmanager
def serve(*extra: str, units: int | None = 2) -> Iterator[str]:
    """Runs `tq serve --units 2` (`units=None`: no units, for shared storage; plus `extra`
    arguments) for the duration; yields its URL."""
    args = ["serve", "--listen", "tcp://127.0.0.1:0", *(["--units", str(units)] if units else []), *extra]
    with tq_process(*args) as server:
        yield server.endpoint("controller")


@pytest.fixture
def served() -> Iterator[str]:
    """The URL of a `tq serve --units 2` started for the test and stopped after it."""
    with serve() as url:
        yield url
