"""The examples run as a user runs them, and check themselves."""

from __future__ import annotations

import pathlib
import subprocess
import sys

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
