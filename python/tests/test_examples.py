"""The examples run as a user runs them, and check themselves."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import serve

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "grpo.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_grpo_example_trains_every_response_once_embedded() -> None:
    out = _run("--prompts", "48", "--group", "4")
    assert "trained on 192 responses" in out
    assert "check: OK" in out


def test_the_grpo_example_runs_on_a_real_deployment(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "tq.toml"
    config.write_text('[controller.samplers]\ngrpo = "grpo:2"\n')
    with serve("--config", str(config)) as url:
        out = _run("--prompts", "24", "--group", "2", "--connect", url)
        assert "trained on 48 responses" in out
        assert "check: OK" in out


def test_the_python_benchmark_reports_python_next_to_rust_and_memcpy() -> None:
    bench = EXAMPLES.parent / "benchmarks" / "kv.py"
    done = subprocess.run(
        [sys.executable, str(bench), "--reps", "1", "--allow-debug", "--tq-bin", ""],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| small")]
    # put, put with copy=False, and get, embedded (no binary given: no remote)
    assert [r.split("|")[2].strip() for r in rows] == ["put", "put, copy=False", "get"], done.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[4]) > 0, row  # the python / rust ratio
    assert "no tq binary" in done.stdout


def test_the_ray_cpu_benchmark_takes_a_get_and_a_round_trip_apart() -> None:
    """``python/benchmarks/ray_cpu.py`` runs as documented (briefly): each step of a get next to
    its floor, and the CPU per call of the controller's and units' actor processes."""
    # Skipped without Ray and torch, unless CI says they are there (then a missing one fails).
    for module, required_by in (("torch", "TQ_REQUIRE_TORCH"), ("tensordict", "TQ_REQUIRE_TORCH"), ("ray", "TQ_REQUIRE_RAY")):
        if not os.environ.get(required_by):
            pytest.importorskip(module)
    bench = EXAMPLES.parent / "benchmarks" / "ray_cpu.py"
    for args, rows in (
        (["get", "--reps", "3", "--seconds", "0.5"], ["key lookup (kv_meta)", "storage read (get_data)", "floor: numpy.copyto"]),
        (["round-trip", "--seconds", "0.5"], ["tq.compat round trip", "floor: the same 4 exchanges"]),
    ):
        # CI's build is a debug one, which the benchmarks refuse without this.
        done = subprocess.run([sys.executable, str(bench), *args, "--allow-debug"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        for row in rows:
            line = next((line for line in done.stdout.splitlines() if line.startswith(row)), None)
            assert line is not None, f"no `{row}` line in:\n{done.stdout}"
            assert float(line.split(" ms")[0].split()[-1]) > 0, line
        # The servers run in actor processes of their own, and their CPU is counted there, with
        # how long they waited for a core, and the busy cores of the whole machine.
        assert "ray::TransferQueueController" in done.stdout, done.stdout
        assert "us CPU per round" in done.stdout and "us waiting for a CPU" in done.stdout, done.stdout
        busy = [line for line in done.stdout.splitlines() if "all processes:" in line]
        assert busy, done.stdout
        for line in busy:
            cores = float(line.split(" of the machine's")[0].split()[-1])
            assert 0 < cores <= os.cpu_count() + 0.5, line
    # The floor's echo thread ends with its connection; its process's CPU is still counted.
    assert "ray::EchoActor" in done.stdout, done.stdout


def test_the_compat_benchmark_worker_measures_the_asked_number_of_units() -> None:
    """``python/benchmarks/compat.py``'s tq.compat worker, in process, with one storage unit
    (``--units``): every workload next to its ``memcpy``, and no round-trip floor in process
    (a Python echo thread there is slower than tq's round trip, so it bounds nothing)."""
    for module, required_by in (("torch", "TQ_REQUIRE_TORCH"), ("tensordict", "TQ_REQUIRE_TORCH")):
        if not os.environ.get(required_by):
            pytest.importorskip(module)
    bench = EXAMPLES.parent / "benchmarks" / "compat.py"
    done = subprocess.run(
        [sys.executable, str(bench), "--reps", "1", "--units", "1", "--worker", "tq.compat", "local"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("4 KiB", "1 MiB"):
        for row in (f"put {name}", f"get {name}", f"memcpy {name}"):
            median, low, high = figures[row]
            assert 0 < low <= median <= high, (row, figures[row])
    assert figures["round trip 4 KiB"][0] > 0
    assert "floor round trip 4 KiB" not in figures, figures


def _compat_module():
    sys.path.insert(0, str(EXAMPLES.parent / "benchmarks"))
    try:
        import compat
    finally:
        sys.path.pop(0)
    return compat


def test_the_compat_benchmark_pairs_each_rounds_ratio_and_counts_the_rounds_that_meet_a_goal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``compat.py --rounds``: each ratio is TransferQueue's figure over tq.compat's of the same
    round (the median of those), and every round's ratio under Ray is checked against the
    issue's goal. Figures made up so that pairing matters: a slow round slows both."""
    compat = _compat_module()

    def figures(put: float, trip: float) -> dict:
        return {"put 4 KiB": [put, put, put], "memcpy 4 KiB": [0.3, 0.3, 0.3], "round trip 4 KiB": [trip, trip, trip]}

    rounds = [
        # Round 1 fast, round 2 slow for everyone, round 3 tq.compat's bad one.
        {"tq.compat (in process)": figures(1.0, 0.05), "tq.compat (Ray)": figures(4.0, 0.3), "transfer_queue (Ray)": figures(32.0, 9.0)},
        {"tq.compat (in process)": figures(2.0, 0.10), "tq.compat (Ray)": figures(8.0, 0.6), "transfer_queue (Ray)": figures(64.0, 18.0)},
        {"tq.compat (in process)": figures(1.0, 0.05), "tq.compat (Ray)": figures(8.0, 0.4), "transfer_queue (Ray)": figures(32.0, 9.0)},
    ]
    for one in rounds:
        one["tq.compat (Ray)"]["floor round trip 4 KiB"] = [0.1, 0.1, 0.1]
    compat.report(rounds, reps=5, units=2)
    out = capsys.readouterr().out
    put = next(line for line in out.splitlines() if line.startswith("| put 4 KiB"))
    # Ratios under Ray per round: 8, 8, 4 -> median 8 (unpaired medians would give 32 / 8 = 4).
    assert put.rstrip().endswith("| 32.0x, 8.0x |"), put
    assert "8.000 (4.000-8.000)" in put, put
    goals = out.split("against the goals:")[1]
    assert "put 4 KiB" in goals and ">= 6x in 2 of 3" in goals, goals
    trip = next(line for line in goals.splitlines() if "round trip 4 KiB" in line)
    assert "30.0x" in trip and ">= 30x in 2 of 3" in trip, trip  # 30, 30, 22.5


def test_the_benchmarks_refuse_a_debug_build_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every benchmark script refuses to measure a debug build of the native module (which
    ``scripts/test.sh`` installs into the shared virtual environment) unless ``--allow-debug``
    says it is a smoke test: its figures would be several times a release build's."""
    compat = _compat_module()
    from tq import _native

    monkeypatch.setattr(_native, "debug_build", True)
    with pytest.raises(SystemExit) as refused:
        compat.refuse_debug_build(allow=False)
    assert refused.value.code == 2
    compat.refuse_debug_build(allow=True)
    monkeypatch.setattr(_native, "debug_build", False)
    compat.refuse_debug_build(allow=False)

    # The scripts themselves, as a user runs them, on the build installed here: refused before
    # they start anything when it is a debug build (as in CI).
    monkeypatch.undo()
    if not _native.debug_build:
        return
    for script, args in (("compat.py", []), ("ray_cpu.py", ["get"]), ("get_loop.py", []), ("kv.py", ["--tq-bin", ""])):
        done = subprocess.run(
            [sys.executable, str(EXAMPLES.parent / "benchmarks" / script), *args], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2, (script, done.stdout, done.stderr)
        assert "debug build" in done.stderr and "--allow-debug" in done.stderr, (script, done.stderr)
        assert done.stdout == "", (script, done.stdout)
