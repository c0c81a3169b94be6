"""A native crash is never silent: the real CLI in a child process dies in llama_decode, faulthandler writes it
into the log, and the next command (or doctor) says so once; a run that ends another way leaves nothing to say.
The crash is made by replacing `llama_cpp.llama_decode` with a function that reads address 0, so every Python frame
above it is the real one; a target with no tokenizer, which aborted llama.cpp, is now one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from support.badinput import assert_outcome, run_cli

from localspec.cli.crashes import take_crashes

CRASH_IN_DECODE = textwrap.dedent(
    """
    import ctypes, sys
    import llama_cpp
    from localspec.cli.main import main

    llama_cpp.llama_decode = lambda *args: ctypes.string_at(0)  # SIGSEGV inside the decode, as a bad kernel would
    sys.exit(main(sys.argv[1:]))
    """
)


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.slow
def test_a_crash_in_llama_decode_is_logged_and_told_once_by_the_next_command(localspec_home, tiny_models):
    args = ["generate", "--target", str(tiny_models.target), "--drafter", "none", "--max-tokens", "4", "Hi"]
    crashed = _run(CRASH_IN_DECODE, *args)
    assert crashed.returncode == -signal.SIGSEGV, crashed.stderr
    [fatal] = (localspec_home.log_dir / "runs").glob("*.fatal")  # the run's own file: no other run's block
    block = fatal.read_text(encoding="utf-8", errors="replace")
    assert "Fatal Python error: Segmentation fault" in block and "localspec/llama/context.py" in block
    assert list((localspec_home.log_dir / "runs").glob("*.json")), "the crashed run's mark stays behind"

    after = run_cli(["models"])
    notes = [line for line in after.err.splitlines() if line.startswith("localspec: note:")]
    assert len(notes) == 1, after.err
    assert "the last run of `localspec generate --target" in notes[0]
    assert "crashed in llama.cpp with SIGSEGV while decoding with target.gguf (localspec/llama/context.py:" in notes[0]
    assert str(localspec_home.log_file) in notes[0] and "localspec doctor" in notes[0]
    assert_outcome(after, 0)
    assert "note:" not in run_cli(["models"]).err  # told once
    assert not list((localspec_home.log_dir / "runs").glob("*"))
    assert block in localspec_home.log_file.read_text(encoding="utf-8", errors="replace")  # moved into the log


@pytest.mark.slow
def test_doctor_tells_the_crash_in_its_report(localspec_home, tiny_models):
    args = ["generate", "--target", str(tiny_models.target), "--drafter", "none", "--max-tokens", "4", "Hi"]
    assert _run(CRASH_IN_DECODE, *args).returncode == -signal.SIGSEGV
    report = run_cli(["doctor"])
    assert report.code == 0 and "note:" not in report.err
    lines = report.out.splitlines()
    at = lines.index("  last run: crashed")
    assert "with SIGSEGV while decoding" in lines[at + 1]
    assert "canary decode: Q4_0 ok, Q4_1 ok, Q8_0 ok, Q4_K ok, Q6_K ok" in report.out


def test_runs_that_end_without_a_crash_leave_nothing_to_tell(localspec_home, tiny_models):
    ok = run_cli(["generate", "--target", str(tiny_models.target), "--drafter", "none", "--max-tokens", "2", "Hi"])
    assert ok.code == 0 and not list((localspec_home.log_dir / "runs").glob("*.json"))
    # A kill leaves a mark but no crash in the log: dropped without a word.
    port = _free_port()
    child = subprocess.Popen(
        [sys.executable, "-m", "localspec", "worker", "--port", port], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    marks = localspec_home.log_dir / "runs"
    deadline = time.monotonic() + 60
    while not (marks / f"{child.pid}.json").exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert json.loads((marks / f"{child.pid}.json").read_text())["command"] == f"localspec worker --port {port}"
    assert take_crashes(localspec_home) == []  # still running: kept
    assert (marks / f"{child.pid}.json").exists()
    child.kill()
    child.wait()
    assert take_crashes(localspec_home) == [] and not list(marks.glob("*.json"))


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_a_target_with_no_tokenizer_is_one_line_not_an_abort(localspec_home, tiny_models, command):
    args = [command, "--target", str(tiny_models.no_tokenizer), "--drafter", "none"]
    outcome = run_cli(args + (["Hi", "--max-tokens", "2"] if command == "generate" else ["--port", _free_port()]))
    if command == "serve":  # serve logs its loading progress on stderr first: the error is its last line
        outcome.err = outcome.err.splitlines()[-1]
    assert_outcome(outcome, 1, "has no tokenizer to write text with", log_file=localspec_home.log_file)
    assert "GGML_ASSERT" not in outcome.err and "Fatal Python error" not in outcome.err


def _leave_a_crash(paths, command: str) -> None:
    """The mark and the log lines a run of `command` leaves when it dies in llama_decode (its pid is gone; a start
    time no process has, should the pid be reused)."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    paths.log_dir.joinpath("runs").mkdir(parents=True, exist_ok=True)
    mark = {"pid": int(gone.stdout), "proc_start": "0", "command": command, "started": "then"}
    (paths.log_dir / "runs" / f"{gone.stdout.strip()}.json").write_text(json.dumps(mark))
    (paths.log_dir / "runs" / f"{gone.stdout.strip()}.fatal").write_text(
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n"
        '  File "/x/localspec/llama/model.py", line 90 in _direct\n'
        '  File "/x/localspec/llama/context.py", line 261 in _submit\n'
    )


@pytest.mark.parametrize("command, reset", [("localspec chat --pair demo", True), ("localspec generate hi", False)])
def test_a_crashed_chat_s_terminal_modes_are_turned_off_by_the_next_command(localspec_home, command, reset):
    import pty

    from localspec.cli.crashes import TERMINAL_RESET

    _leave_a_crash(localspec_home, command)
    main_side, terminal = pty.openpty()
    try:
        code = subprocess.run(
            [sys.executable, "-m", "localspec", "models"], stdout=subprocess.DEVNULL, stderr=terminal, timeout=120
        ).returncode
        os.close(terminal)
        seen = b""
        with contextlib.suppress(OSError):  # EIO once the terminal side is closed and read empty
            while chunk := os.read(main_side, 4096):
                seen += chunk
    finally:
        os.close(main_side)
    text = seen.decode("utf-8", errors="replace")
    assert code == 0 and f"the last run of `{command}` (started then) crashed in llama.cpp with SIGSEGV" in text
    assert "while decoding (localspec/llama/context.py:261 in _submit)" in text  # the pass-through frame skipped
    assert (TERMINAL_RESET in text) == reset
    if reset:
        assert text.index(TERMINAL_RESET) < text.index("the last run")


@pytest.mark.slow
def test_each_run_s_crash_is_its_own_whatever_ran_beside_it(localspec_home, tiny_models):
    """A long run (a worker here; `serve` alike) beside a `generate` that crashes, then the long run killed -9:
    before, the next command blamed the long run too (its mark's log offset lay before the crash's block)."""
    port = _free_port()
    beside = subprocess.Popen(
        [sys.executable, "-m", "localspec", "worker", "--port", port], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    marks = localspec_home.log_dir / "runs"
    try:
        deadline = time.monotonic() + 60
        while not (marks / f"{beside.pid}.json").exists() and beside.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        args = ["generate", "--target", str(tiny_models.target), "--drafter", "none", "--max-tokens", "4", "Hi"]
        assert _run(CRASH_IN_DECODE, *args).returncode == -signal.SIGSEGV
    finally:
        beside.kill()
        beside.wait()
    after = run_cli(["models"])
    notes = [line for line in after.err.splitlines() if line.startswith("localspec: note:")]
    assert len(notes) == 1 and "the last run of `localspec generate --target" in notes[0], after.err
    assert "worker" not in after.err


@pytest.mark.parametrize(
    "mark", ['{"pid": "abc"}', '{"pid": 9223372036854775808}', '{"pid": -5}', "[1, 2]", '{"pid": true}', "{"]
)
def test_a_damaged_run_mark_is_dropped_without_a_word(localspec_home, mark):
    runs = localspec_home.log_dir / "runs"
    runs.mkdir(parents=True)
    (runs / "12345.json").write_text(mark)
    outcome = run_cli(["models"])  # before: a ValueError or an OverflowError traceback, every command
    assert_outcome(outcome, 0)
    assert "note:" not in outcome.err and not list(runs.glob("12345.*"))


CRASH_IN_LOAD = textwrap.dedent(
    """
    import ctypes, sys
    import llama_cpp
    from localspec.cli.main import main

    llama_cpp.llama_model_load_from_file = lambda *args: ctypes.string_at(0)  # as a damaged file can make it
    sys.exit(main(sys.argv[1:]))
    """
)


def test_a_crash_while_loading_a_file_names_the_file_first(localspec_home, tiny_models):
    args = ["generate", "--target", str(tiny_models.target), "--drafter", "none", "--max-tokens", "4", "Hi"]
    assert _run(CRASH_IN_LOAD, *args).returncode == -signal.SIGSEGV
    after = run_cli(["models"])
    [note] = [line for line in after.err.splitlines() if line.startswith("localspec: note:")]
    # before: "while loading or reading a model …: `localspec doctor` checks this build", no file named
    assert f"while loading {tiny_models.target} (localspec/llama/model.py:" in note
    assert "the file may be damaged" in note and "re-download it" in note
