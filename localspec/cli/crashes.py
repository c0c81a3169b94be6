"""A native crash is never silent: faulthandler writes into the log, and the next command says the last run died.

A crash in llama.cpp (SIGSEGV, SIGILL, SIGABRT) ends the process where no Python error can be raised, so nothing
of ours runs afterwards. Every command therefore leaves a mark (`logs/runs/PID.json`) and arms `faulthandler` on a
file of its own (`logs/runs/PID.fatal`), both removed by a clean exit: a fatal block is always its own run's, however
many commands share the log. A mark whose process is gone with faulthandler's "Fatal Python error" in its file is a
crash: the next command (or `doctor`) moves the block into the log and says which run died, of what, while doing
what, after turning off the terminal modes a crashed chat app left on. A chat's mark without one is a chat killed
(SIGKILL: the OOM killer) before it could restore the terminal: the next command restores it and says so. Any other
mark left by a kill is dropped silently, and so is a damaged one.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from localspec.llama import model
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
    models: tuple[str, ...] = ()  # the files the run loaded, the last one last

    @property
    def left_the_terminal(self) -> bool:
        """Whether the crashed run was the chat app, which leaves the terminal in its modes."""
        return self.command.split()[1:2] == ["chat"]

    def describe(self) -> str:
        """One line for the next start and for doctor."""
        native = "in llama.cpp" if self.where.startswith("localspec/llama/") else "in native code"
        where = f" ({self.where})" if self.where else ""
        if self.doing == _DOING["llama/model.py"] and self.models:  # the file is the first suspect, not the build
            return (
                f"the last run of `{self.command}` (started {self.started}) crashed {native} with {self.signal} "
                f"while loading {self.models[-1]}{where}: the file may be damaged (`localspec models` checks its "
                f"header; re-download it), see {self.log_file}; `localspec doctor` checks this build on this CPU"
            )
        models = f" with {' and '.join(Path(m).name for m in self.models)}" if self.models else ""
        return (
            f"the last run of `{self.command}` (started {self.started}) crashed {native} with {self.signal} "
            f"while {self.doing}{models}{where}: see {self.log_file}; `localspec doctor` checks this build on this CPU"
        )


class RunMark:
    """This run's mark and faulthandler on its own file; `close()` at a clean exit removes both."""

    def __init__(self, paths: Paths, command: str) -> None:
        self.path: Path | None = paths.log_dir / "runs" / f"{os.getpid()}.json"
        self.fatal: Path | None = self.path.with_suffix(".fatal")
        self._file = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fatal = self.fatal.open("wb")
        except OSError:  # an unwritable log folder: doctor reports it; the run goes on unwatched
            self.path = self.fatal = None
            return
        # Someone else's faulthandler (pytest, python -X faulthandler) stays theirs.
        if not faulthandler.is_enabled():
            faulthandler.enable(file=fatal, all_threads=True)
            self._file = fatal
        else:
            fatal.close()
        self._mark = {
            "pid": os.getpid(),
            "proc_start": _proc_start(os.getpid()),
            "command": command,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "models": [],  # the files this run loaded, last last: a crash while loading one names it
        }
        self._write()
        self._listener = _Loading(self)
        logging.getLogger(model.__name__).addHandler(self._listener)

    def loading(self, path: str) -> None:
        """The run starts loading the model file `path` (told by llama/model.py's log line)."""
        if self.path is not None:
            self._mark["models"].append(path)
            self._write()

    def _write(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.write_text(json.dumps(self._mark), encoding="utf-8")

    def close(self) -> None:
        if getattr(self, "_listener", None) is not None:
            logging.getLogger(model.__name__).removeHandler(self._listener)
            self._listener = None
        if self._file is not None:
            faulthandler.disable()
            self._file.close()
            self._file = None
        for path in (self.path, self.fatal):
            if path is not None:
                with contextlib.suppress(OSError):
                    path.unlink()
        self.path = self.fatal = None


class _Loading(logging.Handler):
    """Hands the mark each model file the run starts to load (llama/model.py's `LOADING` line)."""

    def __init__(self, mark: RunMark) -> None:
        super().__init__(logging.INFO)
        self.mark = mark

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == model.LOADING and record.args:
            self.mark.loading(str(record.args[0]))


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), so a reused pid is not taken for the run."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def _alive(mark: dict) -> bool:
    pid = mark.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 2**31:  # a damaged mark: no such run
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


@dataclass(frozen=True, slots=True)
class DeadChat:
    """A chat app killed without a crash (SIGKILL: the OOM killer, `kill -9`): its terminal was left in its modes."""

    command: str
    started: str
    left_the_terminal = True

    def describe(self) -> str:
        """One line for the next start and for doctor."""
        return (
            f"the last chat (`{self.command}`, started {self.started}) ended without cleaning up (killed, by the "
            "out-of-memory killer or `kill -9`): the terminal was reset; its answer is saved up to its last "
            "seconds"
        )


def take_crashes(paths: Paths) -> list[Crash | DeadChat]:
    """The crashes of earlier runs, and the chats killed, not yet reported (each is reported once); marks of runs
    that ended another way are dropped, and those of running processes kept."""
    folder = paths.log_dir / "runs"
    try:
        marks = sorted(folder.glob("*.json"))
    except OSError:
        return []
    crashes: list[Crash | DeadChat] = []
    for path in marks:
        try:
            mark = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            mark = {}
        mark = mark if isinstance(mark, dict) else {}
        if mark and _alive(mark):
            continue
        fatal = path.with_suffix(".fatal")
        if crash := _crash_in_file(mark, fatal, paths.log_file):
            crashes.append(crash)
        elif str(mark.get("command", "")).split()[1:2] == ["chat"]:
            crashes.append(DeadChat(str(mark["command"]), str(mark.get("started", "?"))))
        for done in (path, fatal):
            with contextlib.suppress(OSError):
                done.unlink()
    return crashes


def _crash_in_file(mark: dict, fatal_file: Path, log_file: Path) -> Crash | None:
    """The crash faulthandler wrote into the run's own file (then copied into the log), or None."""
    try:
        with fatal_file.open("rb") as f:
            text = f.read(1 << 20).decode("utf-8", errors="replace")
    except OSError:
        return None
    fatal = _FATAL.search(text)
    if fatal is None:
        return None
    with contextlib.suppress(OSError), log_file.open("a", encoding="utf-8") as log:
        log.write(f"--- the crash of `{mark.get('command', 'localspec')}` (pid {mark.get('pid')}):\n{text}\n")
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
    models = mark.get("models")
    return Crash(
        command=str(mark.get("command", "localspec")),
        started=str(mark.get("started", "?")),
        signal=_SIGNALS.get(what, what),
        doing=doing,
        where=where,
        log_file=log_file,
        models=tuple(str(m) for m in models) if isinstance(models, list) else (),
    )
