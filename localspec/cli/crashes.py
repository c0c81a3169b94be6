"""A native crash is never silent: faulthandler writes into the log, and the next command says the last run died.

A crash in llama.cpp (SIGSEGV, SIGILL, SIGABRT) ends the process where no Python error can be raised, so nothing
of ours runs afterwards. Every command therefore arms `faulthandler` on the log file and leaves a mark
(`logs/runs/PID.json`) that a clean exit removes. A mark whose process is gone, with faulthandler's "Fatal Python
error" in the log after the offset the mark recorded, is a crash: the next command (or `doctor`) says which run
died, of what, while doing what, and where the log is, after turning off the terminal modes a crashed chat app left
on. A mark left by a kill without a crash is dropped silently.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from localspec.paths import Paths

# faulthandler's frames: '  File "/…/localspec/llama/context.py", line 258 in _submit'
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', re.M)
_FATAL = re.compile(r"^Fatal Python error: (?P<what>.+)$", re.M)
# The innermost frame of ours in the crashed thread → what the run was doing: by function, else by module.
_DOING_IN = {"tokenize": "tokenizing", "_submit": "decoding", "decode": "decoding", "detokenize": "detokenizing"}
_PASS_THROUGH = {"_direct", "_native", "call", "_serve"}  # helpers that only hand a native call on
_DOING = {
    "llama/context.py": "decoding",
    "llama/model.py": "loading or reading a model",
    "llama/templates.py": "rendering the chat template",
    "llama/sampler.py": "sampling",
    "llama/rpc.py": "talking to an RPC worker",
    "llama/canary.py": "decoding the canary",
}
_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Illegal instruction": "SIGILL",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
}


# What the chat app (Textual's terminal driver) turns on, turned off again: the mouse modes, bracketed paste, in-band
# resize, focus events, the kitty keyboard mode, the alternate screen and the hidden cursor. A chat that died in
# native code left them on; the shell restores only the tty's line settings.
TERMINAL_RESET = (
    "\x1b[?1000l\x1b[?1003l\x1b[?1015l\x1b[?1006l\x1b[?1016l\x1b[?2004l\x1b[?2048l\x1b[?1004l"
    "\x1b[<u\x1b[?7h\x1b[?1049l\x1b[?25h"
)


@dataclass(frozen=True, slots=True)
class Crash:
    """A run that died in native code, as its mark and the log tell it."""

    command: str
    started: str
    signal: str
    doing: str
    where: str  # the innermost frame of ours, "localspec/llama/context.py:258 in _submit", or ""
    log_file: Path

    @property
    def left_the_terminal(self) -> bool:
        """Whether the crashed run was the chat app, which leaves the terminal in its modes."""
        return self.command.split()[1:2] == ["chat"]

    def describe(self) -> str:
        """One line for the next start and for doctor."""
        native = "in llama.cpp" if self.where.startswith("localspec/llama/") else "in native code"
        where = f" ({self.where})" if self.where else ""
        return (
            f"the last run of `{self.command}` (started {self.started}) crashed {native} with {self.signal} "
            f"while {self.doing}{where}: see {self.log_file}; `localspec doctor` checks this build on this CPU"
        )


class RunMark:
    """This run's mark and faulthandler on the log file; `close()` at a clean exit removes both."""

    def __init__(self, paths: Paths, command: str) -> None:
        self.path = paths.log_dir / "runs" / f"{os.getpid()}.json"
        self._log = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            log = paths.log_file.open("ab")
        except OSError:  # an unwritable log folder: doctor reports it; the run goes on unwatched
            self.path = None
            return
        # Someone else's faulthandler (pytest, python -X faulthandler) stays theirs.
        if not faulthandler.is_enabled():
            faulthandler.enable(file=log, all_threads=True)
            self._log = log
        else:
            log.close()
        mark = {
            "pid": os.getpid(),
            "proc_start": _proc_start(os.getpid()),
            "command": command,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "log_offset": paths.log_file.stat().st_size,
        }
        with contextlib.suppress(OSError):
            self.path.write_text(json.dumps(mark), encoding="utf-8")

    def close(self) -> None:
        if self._log is not None:
            faulthandler.disable()
            self._log.close()
            self._log = None
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.path = None


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), so a reused pid is not taken for the run."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def _alive(mark: dict) -> bool:
    pid = int(mark.get("pid", 0))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return mark.get("proc_start") is None or _proc_start(pid) in (None, mark["proc_start"])


def restore_terminal(stream: TextIO) -> None:
    """Turn off on `stream`'s terminal what a crashed chat app left on (nothing when it is not a terminal)."""
    with contextlib.suppress(OSError, ValueError):
        if stream.isatty():
            stream.write(TERMINAL_RESET)
            stream.flush()


def take_crashes(paths: Paths) -> list[Crash]:
    """The crashes of earlier runs not yet reported (each is reported once); marks of runs that ended another way
    are dropped, and those of running processes kept."""
    folder = paths.log_dir / "runs"
    try:
        marks = sorted(folder.glob("*.json"))
    except OSError:
        return []
    crashes = []
    for path in marks:
        try:
            mark = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            mark = {}
        if isinstance(mark, dict) and mark and _alive(mark):
            continue
        if isinstance(mark, dict) and (crash := _crash_in_log(mark, paths.log_file)):
            crashes.append(crash)
        with contextlib.suppress(OSError):
            path.unlink()
    return crashes


def _crash_in_log(mark: dict, log_file: Path) -> Crash | None:
    """The crash faulthandler wrote into the log after the mark's offset, or None."""
    try:
        with log_file.open("rb") as f:
            f.seek(int(mark.get("log_offset", 0)))
            text = f.read(1 << 20).decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return None
    fatal = _FATAL.search(text)
    if fatal is None:
        return None
    what = fatal["what"].strip()
    # faulthandler lists the other threads first and the crashed one last ("Current thread …").
    crashed = text[fatal.end() :]
    if (current := crashed.find("Current thread")) >= 0:
        crashed = crashed[current:]
    doing, where = "running", ""
    for frame in _FRAME.finditer(crashed):  # most recent call first
        file = frame["file"].replace("\\", "/")
        if "/localspec/" in file and frame["func"] not in _PASS_THROUGH:
            module = file.rpartition("/localspec/")[2]
            doing = _DOING_IN.get(frame["func"]) or _DOING.get(module, f"in {frame['func']}")
            where = f"localspec/{module}:{frame['line']} in {frame['func']}"
            break
    return Crash(
        command=str(mark.get("command", "localspec")),
        started=str(mark.get("started", "?")),
        signal=_SIGNALS.get(what, what),
        doing=doing,
        where=where,
        log_file=log_file,
    )
