"""benchmarks/cold_start.py runs on a real model and prints one timing per call and pause."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "cold_start.py"


@pytest.mark.slow
def test_the_cold_start_table_has_every_call_and_pause(tiny_models):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tiny_models.target), "--rounds", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "median µs of one call" in lines[0] and "after sleeping 16 ms" in lines[1]
    for name in ("argmax (T 0)", "law (T 0.8)", "Python loop"):
        (row,) = [line for line in lines if line.startswith(name)]
        values = [float(v) for v in row[len(name) :].split()]
        assert len(values) == 4 and all(v > 0 for v in values), row
