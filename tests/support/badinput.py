"""Helpers for the bad-input matrix: run the real CLI, check its outcome, prove nothing on disk changed.

An outcome is judged the same way in every family: the exit code, exactly one `localspec: error:` line on
stderr for an error (notes and the stats line otherwise), no "Traceback" on stdout, stderr or in the log
file, and the same bytes in the chat database and the model folders before and after.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Outcome:
    code: int
    out: str
    err: str


def run_cli(args: list, *, stdin: bytes = b"", env: dict | None = None, timeout: float = 120) -> Outcome:
    """`python -m localspec ARGS` in a subprocess (args may be bytes: argv that is not UTF-8)."""
    argv = [sys.executable, "-m", "localspec", *[a if isinstance(a, bytes) else str(a) for a in args]]
    result = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, env={**os.environ, **(env or {})})
    return Outcome(
        result.returncode, result.stdout.decode("utf-8", "replace"), result.stderr.decode("utf-8", "replace")
    )


def run_main(args: list, capsys) -> Outcome:
    """`localspec ARGS` in this process (fast: pure validation and tiny models)."""
    from localspec.cli.main import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return Outcome(code, out, err)


def snapshot(*roots: Path) -> dict[str, str]:
    """Path → sha256 of every file under `roots` (absent roots give nothing)."""
    found = {}
    for root in roots:
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            if path.is_file():
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def assert_outcome(outcome: Outcome, code: int, match: str | None = None, *, log_file: Path | None = None) -> None:
    """The exit code; one error line containing `match` when code != 0; never a traceback anywhere."""
    assert "Traceback" not in outcome.out + outcome.err, outcome.err
    if log_file is not None and log_file.is_file():
        assert "Traceback" not in log_file.read_text(encoding="utf-8", errors="replace")
    assert outcome.code == code, (outcome.code, outcome.err)
    lines = outcome.err.splitlines()
    if code in (0, 130, 143):
        allowed = ("localspec: note:", "localspec: interrupted", "localspec: terminated")
        assert all(line.startswith(allowed) or "tok/s" in line for line in lines), outcome.err
    else:
        assert len(lines) == 1 and lines[0].startswith("localspec: error: "), outcome.err
    if match is not None:
        assert match in outcome.err, outcome.err
