"""The chat against its own engine: `localspec chat` (the real app, in a pseudo-terminal) beside
`localspec generate --chat --json` on the same pair, prompt and settings, runs interleaved (issue 42).

Each round runs `generate` once and the chat once, in that order or the other (alternating), each a fresh process.
The chat is driven as a user drives it: the harness waits for "ready" on the screen, types the prompt and Enter,
waits for the answer to be saved in the chat database, and quits with Ctrl+Q; the answer's own stats (saved with it)
give its tok/s, tokens per pass and the policy's choices, and the app's log its pace by stretches of 500 tokens.
The terminal is drained as fast as it writes, as a terminal emulator would (its drawing is not measured here).
Not a test: the figures depend on the machine and its load (printed with them).

    python benchmarks/chat_speed.py [--pair demo | --target T.gguf --draft D.gguf] [--tokens 400] [--rounds 3]
        [--prompt TEXT] [--size 120x40] [--json FILE] [-- extra flags for both, e.g. --drafter none]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import resource
import signal
import sqlite3
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

PROMPT = "Write a short poem about the sea."
ANSI = re.compile(rb"\x1b(\[[0-9;?<>=]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[()][A-Z0-9]|[=>NOPMc78])")
PACE = re.compile(r"(answer pace: .*|screen: .*)$")
EXTRA_ENV: dict[str, str] = {}  # --env: set for both the chat and generate


class Screen:
    """The app's pseudo-terminal: drains what it writes (as a terminal would) and keeps the recent text."""

    def __init__(self, command: list[str], env: dict[str, str], size: tuple[int, int]) -> None:
        self.master, slave = os.openpty()
        cols, rows = size
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc = subprocess.Popen(
            command, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True, close_fds=True
        )
        os.close(slave)
        self._text = bytearray()
        self._lock = threading.Lock()
        self.bytes = 0
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self.bytes += len(data)
                self._text += ANSI.sub(b"", data)
                del self._text[:-65536]

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if text.encode() in self._text:
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(f"the chat exited ({self.proc.returncode}) before showing {text!r}")
            time.sleep(0.05)
        raise TimeoutError(f"the chat did not show {text!r} in {timeout:.0f} s")

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def thread_seconds(self) -> tuple[float, float]:
        """CPU seconds of the app's main thread (Textual's loop: the UI) and of all its threads together."""
        ticks, main, total = os.sysconf("SC_CLK_TCK"), 0.0, 0.0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
            total += seconds
            main += seconds if task.name == str(self.proc.pid) else 0.0
        return main, total

    def close(self, timeout: float = 20.0) -> int:
        self.type("\x11")  # Ctrl+Q
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGTERM)
            return self.proc.wait(timeout)
        finally:
            os.close(self.master)


def _answer(db: Path, timeout: float) -> dict | None:
    """The first saved answer's stats once it is finished (None until then)."""
    if not db.exists():
        return None
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=timeout) as con:
        row = con.execute(
            "SELECT stats, finish_reason FROM messages WHERE role = 'assistant' AND finish_reason IS NOT NULL "
            "AND finish_reason NOT IN ('partial') ORDER BY id LIMIT 1"
        ).fetchone()
    return json.loads(row[0]) | {"finish_reason": row[1]} if row and row[0] else None


def run_chat(
    python: str, flags: list[str], prompt: str, home: Path, size: tuple[int, int], limit: float, profile: Path | None
) -> dict:
    db = home / "data" / "chats.sqlite3"
    for old in db.parent.glob(db.name + "*"):  # the database and its WAL files: each run starts a new one
        old.unlink()
    log = home / "logs" / "localspec.log"
    mark = log.stat().st_size if log.exists() else 0
    env = os.environ | {"LOCALSPEC_HOME": str(home), "TERM": "xterm-256color", "COLORTERM": "truecolor"} | EXTRA_ENV
    profiler = ["-m", "cProfile", "-o", str(profile)] if profile else []  # the main thread: Textual's loop
    screen = Screen([python, *profiler, "-m", "localspec", "chat", *flags], env, size)
    try:
        screen.wait_for("ready", 300)
        ui_before, all_before = screen.thread_seconds()
        screen.type(prompt)
        time.sleep(0.3)  # the prompt box gathers typed keys and inserts them once the queue is handled
        screen.type("\r")
        deadline = time.monotonic() + limit
        while (stats := _answer(db, 5.0)) is None:
            if time.monotonic() > deadline or screen.proc.poll() is not None:
                raise RuntimeError("the chat saved no answer in time")
            time.sleep(0.2)
        ui, total = screen.thread_seconds()
        stats["cpu_ui"], stats["cpu_all"] = ui - ui_before, total - all_before
    finally:
        code = screen.close()
    paces = [m.group(1) for line in _tail(log, mark) if (m := PACE.search(line))]
    return stats | {"exit_code": code, "terminal_bytes": screen.bytes, "pace": "; ".join(paces)}


def _tail(log: Path, mark: int) -> list[str]:
    if not log.exists():
        return []
    with log.open("rb") as f:
        f.seek(mark)
        return f.read().decode("utf-8", "replace").splitlines()


def run_generate(python: str, flags: list[str], prompt: str, home: Path) -> dict:
    env = os.environ | {"LOCALSPEC_HOME": str(home)} | EXTRA_ENV
    done = subprocess.run(
        [python, "-m", "localspec", "generate", "--chat", "--json", *flags, prompt],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RuntimeError(f"generate failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout.splitlines()[-1])["stats"]


class OtherLoad:
    """The cores that processes other than the harness and its runs kept busy over a stretch (/proc/stat)."""

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float]:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        mine = time.process_time() + children.ru_utime + children.ru_stime
        return time.monotonic(), busy, mine

    def cores(self) -> float:
        now = self._sample()
        wall = now[0] - self._start[0]
        return max(0.0, (now[1] - self._start[1]) - (now[2] - self._start[2])) / wall if wall > 0 else 0.0


def wait_quiet(limit: float, most: float = 600.0) -> float:
    """Wait (up to `most` seconds) until other processes use under `limit` cores over 5 s; returns their load."""
    deadline = time.monotonic() + most
    while True:
        probe = OtherLoad()
        time.sleep(5)
        load = probe.cores()
        if load < limit or time.monotonic() > deadline:
            return load
        print(f"  (waiting: other processes use {load:.2f} cores)", flush=True)


class Freeze:
    """Stops every SCHED_IDLE process (other work put aside with `chrt -i -a -p 0 PID`) for the length of a run,
    and lets them go on after it: on a shared 2-core machine nothing else then runs beside the measured one."""

    def __init__(self, on: bool) -> None:
        self.on, self.stopped = on, []

    def __enter__(self) -> Freeze:
        if self.on:
            for pid in (int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
                try:
                    if os.sched_getscheduler(pid) == os.SCHED_IDLE:
                        os.kill(pid, signal.SIGSTOP)
                        self.stopped.append(pid)
                except OSError:
                    pass
        return self

    def __exit__(self, *exc) -> None:
        for pid in self.stopped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        self.stopped.clear()


def summary(stats: dict) -> dict:
    """The figures a row shows, from a saved answer's `Stats.to_dict()`."""
    drafted = stats.get("drafted", 0)
    decision = stats.get("decision") or {}
    by_k = stats.get("steps_by_draft_length") or []
    return {
        "tokens": stats.get("emitted", 0),
        "tok_s": stats.get("tokens_per_second", 0.0),
        "tokens_per_pass": stats.get("mean_tokens_per_pass", 0.0),
        "acceptance": stats.get("acceptance_rate", 0.0),
        "steps_off": stats.get("steps_off", 0),
        "passes": stats.get("target_passes", 0),
        "mean_k": sum(k * n for k, n in enumerate(by_k)) / max(sum(by_k), 1),
        "draft_cost": decision.get("draft_cost", 0.0),
        "predicted": decision.get("predicted_speedup", 0.0),
        "us_per_draft_token": 1e6 * stats.get("seconds_draft", 0.0) / drafted if drafted else 0.0,
        "us_per_draft_decode": 1e6 * stats.get("seconds_draft_decode", 0.0) / drafted if drafted else 0.0,
        "us_python_per_pass": 1e6 * stats.get("python_per_verify_step", 0.0),
        "off_reason": stats.get("speculation_off", ""),
        "pace": stats.get("pace", ""),
        "cpu_ui": stats.get("cpu_ui", 0.0),
        "cpu_all": stats.get("cpu_all", 0.0),
        "seconds": stats.get("seconds", 0.0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--pair", help="a pair from models.toml (default: demo, unless --target is given)")
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--size", default="120x40", help="the terminal's COLSxROWS")
    parser.add_argument("--home", type=Path, help="LOCALSPEC_HOME for the runs (default: a fresh temporary folder)")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument(
        "--freeze-idle",
        action="store_true",
        help="stop every SCHED_IDLE process during each run (other work on the machine, put under chrt -i)",
    )
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for both (repeatable)")
    parser.add_argument("--profile", type=Path, help="profile the chat's main thread (cProfile) into this file")
    parser.add_argument(
        "--quiet",
        type=float,
        default=0.0,
        help="before each run wait until other processes use under this many cores, and run again a run during "
        "which they used more (0: off)",
    )
    parser.add_argument("extra", nargs="*", help="more flags for both (after --)")
    args = parser.parse_args()
    # a kill must not leave the frozen processes stopped: SIGTERM unwinds through `Freeze.__exit__` as Ctrl+C does
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    models = ["--target", args.target] + (["--draft", args.draft] if args.draft else []) if args.target else []
    flags = [*(models or ["--pair", args.pair or "demo"]), "--temperature", str(args.temperature)]
    flags += ["--max-tokens", str(args.tokens), *args.extra]
    size = tuple(int(n) for n in args.size.split("x"))
    EXTRA_ENV.update(item.split("=", 1) for item in args.env)
    home = args.home or Path(tempfile.mkdtemp(prefix="localspec-chat-speed-"))
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')} {os.cpu_count()} CPUs; flags: {' '.join(flags)}; env {EXTRA_ENV}",
        flush=True,
    )
    runs: list[dict] = []
    for r in range(args.rounds):
        order = ("generate", "chat") if r % 2 == 0 else ("chat", "generate")
        for mode in order:
            for _attempt in range(5):
                with Freeze(args.freeze_idle):
                    if args.quiet:
                        wait_quiet(args.quiet)
                    others = OtherLoad()
                    if mode == "chat":
                        limit = 60 + args.tokens
                        stats = run_chat(args.python, flags, args.prompt, home, size, limit, args.profile)
                    else:
                        stats = run_generate(args.python, flags, args.prompt, home)
                    other = others.cores()
                if not args.quiet or other < args.quiet:
                    break
                print(f"  ({mode} again: other processes used {other:.2f} cores during it)", flush=True)
            row = {"round": r + 1, "mode": mode, "load": other, **summary(stats)}
            runs.append(row)
            print(
                f"round {row['round']} {mode:8} {row['tok_s']:6.1f} tok/s  {row['tokens']:4} tok  "
                f"{row['tokens_per_pass']:.2f} tok/pass  mean k {row['mean_k']:.2f}  off {row['steps_off']}/"
                f"{row['passes']}  c {row['draft_cost']:.2f}  draft {row['us_per_draft_token']:.0f} µs/tok "
                f"({row['us_per_draft_decode']:.0f} decode)  py/pass {row['us_python_per_pass']:.0f} µs  "
                f"others {row['load']:.2f} cores"
                + (f"  UI {row['cpu_ui']:.1f} of {row['cpu_all']:.1f} CPU s" if mode == "chat" else "")
                + (f"  pace {row['pace']}" if row["pace"] else ""),
                flush=True,
            )
    ratios = []
    for r in range(1, args.rounds + 1):
        chat, gen = (next(x for x in runs if x["round"] == r and x["mode"] == m) for m in ("chat", "generate"))
        ratios.append(chat["tok_s"] / gen["tok_s"] if gen["tok_s"] else 0.0)
    print(
        "chat / generate by round: " + ", ".join(f"{x:.2f}" for x in ratios),
        f"(median {statistics.median(ratios):.2f})",
    )
    if args.json:
        args.json.write_text(json.dumps({"flags": flags, "runs": runs, "ratios": ratios}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
