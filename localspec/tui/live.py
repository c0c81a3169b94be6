"""Live numbers for the stats panel, and the loop that turns a `Generation` into batched UI updates.

`stream_generation` runs in the app's thread worker: it iterates the engine, splits a reasoning model's thinking
from its answer (`ThinkingSplit`), gathers released text as provenance runs of each, and calls `emit` at most
every `interval` seconds with a `Chunk` (text since the last chunk plus a `StatsView` snapshot), then once with the
`Finished` answer. Nothing here touches a widget, so the loop is safe off the UI thread; the widgets draw what it
sends (`widgets.render_stats` draws a `StatsView`).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from localspec.core.engine import Generation
from localspec.core.stats import Stats
from localspec.core.thinking import ANSWER, THINKING, PartStats, ThinkingSplit

from .failure import error_text

log = logging.getLogger(__name__)

Runs = list[tuple[str, bool]]  # (text, came from the draft)
PACE_STRETCH = 500  # tokens per stretch in the log's "answer pace" line


@dataclass(frozen=True, slots=True)
class StatsView:
    """What the stats panel shows: the current (or last) turn, the session, and live rates."""

    turn: Stats | None = None
    session: Stats = field(default_factory=Stats)
    turns: int = 0
    tokens_per_second_now: float = 0.0
    tokens_per_second_turn: float = 0.0
    generating: bool = False
    drafter: str = "model"  # the drafter the settings ask for (shown by name)
    drafts: bool = True  # the loaded drafter proposes tokens (not plain decoding's `NoDrafter`)
    draft_max: int = 0
    adaptive: bool = True  # the engine picks k ≤ draft_max each step (and may turn speculation off)
    provenance: bool = False  # draft tokens are coloured: show the legend
    drafting_note: str = ""  # how a draft with another vocabulary drafts (`Engine.drafting_note`)
    parts: dict[str, PartStats] | None = None  # the turn's thinking and answer numbers (shown when it thought)


@dataclass(frozen=True, slots=True)
class Chunk:
    """Text released since the last chunk (the answer's and the thinking's), with a snapshot of the turn's stats."""

    runs: Runs
    stats: Stats
    tokens_per_second_now: float
    tokens_per_second_turn: float
    thinking_runs: Runs = field(default_factory=list)
    parts: dict[str, PartStats] | None = None  # each part's numbers so far


@dataclass(frozen=True, slots=True)
class Reading:
    """Progress of reading a long prompt into one model (before the first token)."""

    model: str  # "target" or "draft"
    done: int
    total: int

    def status(self) -> str:
        """The status-line text for this step."""
        if self.done >= self.total:
            return "generating… (Esc stops)"
        return f"reading the conversation into the {self.model}: {self.done:,}/{self.total:,} tokens… (Esc stops)"


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of a turn: the whole answer (its thinking apart), how it ended, and its final stats."""

    text: str
    runs: Runs
    finish_reason: str
    stats: Stats
    notices: list[str]
    error: str | None = None  # a one-line error that ended the turn early
    reasoning: str = ""  # the thinking, markers out
    reasoning_runs: Runs = field(default_factory=list)
    parts: dict[str, PartStats] | None = None  # each part's numbers (None: the model does not think)

    @property
    def reason(self) -> str:
        """How the answer ended as saved and shown: "error" when an error ended it, else the finish reason."""
        return "error" if self.error else self.finish_reason

    @classmethod
    def stopped(cls, text: str, runs: Runs, reasoning_runs: Runs, live: Chunk | None) -> Finished:
        """An answer stopped with what was shown of it (its last chunk's stats), when the worker's own end did not
        come back (a quit that could not wait)."""
        return cls(
            text=text,
            runs=list(runs),
            finish_reason="cancelled",
            stats=live.stats if live is not None else Stats(),
            notices=[],
            reasoning="".join(text for text, _ in reasoning_runs).strip(),
            reasoning_runs=list(reasoning_runs),
            parts=live.parts if live is not None else None,
        )


class RateMeter:
    """Tokens per second over the last `window` seconds."""

    def __init__(self, window: float = 1.0) -> None:
        self.window = window
        self._points: deque[tuple[float, int]] = deque()

    def update(self, now: float, emitted: int) -> float:
        """Record the count at `now`; return the rate over the window."""
        self._points.append((now, emitted))
        while len(self._points) > 2 and now - self._points[1][0] >= self.window:
            self._points.popleft()
        t0, n0 = self._points[0]
        return (emitted - n0) / (now - t0) if now > t0 else 0.0


def add_run(runs: Runs, text: str, from_draft: bool) -> None:
    """Append text to provenance runs, merging with the last run of the same origin."""
    if not text:
        return
    if runs and runs[-1][1] == from_draft:
        runs[-1] = (runs[-1][0] + text, from_draft)
    else:
        runs.append((text, from_draft))


class ChunkGate:
    """Back-pressure between the generating worker and the UI thread: at most one chunk in flight.

    The worker calls `sent()` when it posts a chunk; the UI's handler calls `drawn()` once the chunk is on
    screen (even if drawing failed), after the pause its `FrameBudget` asks for. Until then `ready()` is False and
    `stream_generation` keeps the new text with it, to send in the next chunk: a slow UI never builds a queue of
    chunk messages in front of the keys, and the screen takes only its share of the CPU from the models.
    """

    def __init__(self) -> None:
        self._drawn = threading.Event()
        self._drawn.set()
        self.budget = FrameBudget()

    def sent(self) -> None:
        self._drawn.clear()

    def drawn(self) -> None:
        self._drawn.set()

    def ready(self) -> bool:
        return self._drawn.is_set()


class FrameBudget:
    """How long the screen waits before it takes the next chunk, so that the UI thread uses at most `share` of one
    core while an answer streams.

    On a small CPU every millisecond the UI thread spends drawing is taken from llama.cpp's threads, which wait
    for each other: measured on 2 cores, the chat's answers ran 0.80–0.90× `generate` while its screen used
    10–15 % of a core (docs/benchmarks.md "The chat against its engine"). So the budget is a bucket on the UI
    thread's own CPU clock: since the answer's first frame
    it may have used `share` of the time passed (plus `burst`); a frame that overdraws it waits until the bucket
    refills. A fast machine draws up to `fastest` apart, a slow one less often, and never under one frame in
    `slowest` seconds. Everything the UI thread does counts (the stats panel, keys), since all of it competes.
    """

    def __init__(
        self,
        share: float = 0.02,
        fastest: float = 1 / 30,
        slowest: float = 1.0,
        burst: float = 0.02,
        *,
        cpu: Callable[[], float] = time.thread_time,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.share, self.fastest, self.slowest, self.burst = share, fastest, slowest, burst
        self._cpu, self._clock = cpu, clock
        self._origin: tuple[float, float] | None = None  # (clock, cpu) at the first frame
        self.frames = 0

    def pause(self) -> float:
        """A frame was drawn: seconds to wait from now before taking the next chunk (call it in the UI thread)."""
        now, cpu = self._clock(), self._cpu()
        self.frames += 1
        if self._origin is None:
            self._origin = (now, cpu)
            return self.fastest
        spent = cpu - self._origin[1]
        earned = self.share * (now - self._origin[0]) + self.burst
        return min(self.slowest, max(self.fastest, (spent - earned) / self.share))

    @property
    def used(self) -> float:
        """The UI thread's share of one core since the first frame (0 before the second)."""
        if self._origin is None:
            return 0.0
        wall = self._clock() - self._origin[0]
        return (self._cpu() - self._origin[1]) / wall if wall > 0 else 0.0


def stream_generation(
    generation: Generation,
    emit: Callable[[Chunk | Reading | Finished], None],
    *,
    split: ThinkingSplit | None = None,
    ready: Callable[[], bool] = lambda: True,
    interval: float = 1 / 30,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Iterate `generation`, calling `emit` with batched `Chunk`s and one final `Finished`.

    A chunk goes out at most every `interval` seconds and only when `ready()` (a `ChunkGate`'s) says the UI
    has drawn the previous one: text piles up here rather than in the UI's message queue, so keys stay
    responsive however fast the models are. An error raised mid-answer ends the turn with `Finished.error`
    set (the engine rolls its caches back before it raises or yields). Reading a long prompt reports `Reading`
    steps. `split` (the session's `splitter`) separates a reasoning model's thinking; without it all is answer.
    """
    generation.on_prefill = lambda model, done, total: emit(Reading(model, done, total))
    split = split or ThinkingSplit(None, opened=False, token_bytes=lambda token: b"")

    start = last = clock()
    meter = RateMeter()
    pending: dict[str, Runs] = {THINKING: [], ANSWER: []}
    runs: dict[str, Runs] = {THINKING: [], ANSWER: []}
    error = None
    times: list[float] = []  # when each token came: the answer's pace, logged at its end
    try:
        for event in generation:
            times.append(clock())
            for part, text, from_draft in split.feed(event, generation.stats):
                add_run(pending[part], text, from_draft)
            now = clock()
            if (pending[THINKING] or pending[ANSWER]) and now - last >= interval and ready():
                emit(_chunk(generation.stats, pending, split, meter, now, now - start))
                _keep(runs, pending)
                pending, last = {THINKING: [], ANSWER: []}, now
    except Exception as e:  # keep the partial answer, show one line
        error = error_text(e, "generation")
    _keep(runs, pending)
    stats = copy.deepcopy(generation.stats)
    finished = Finished(
        split.answer if split.markers else generation.text,
        runs[ANSWER],
        generation.finish_reason or "cancelled",
        stats,
        list(generation.notices),
        error,
        reasoning=split.reasoning,
        reasoning_runs=runs[THINKING],
        parts=split.parts() if split.markers else None,
    )
    if len(times) > 1:
        log.info("answer pace: %s", pace(times))
    emit(finished)


def pace(times: list[float], stretch: int = PACE_STRETCH) -> str:
    """Tokens per second over each stretch of `stretch` tokens, from the time each token came, e.g.
    "0-500 61.2, 500-812 60.1 tok/s": a screen whose cost grows with the answer shows as a falling pace."""
    parts = []
    for start in range(0, len(times) - 1, stretch):
        end = min(start + stretch, len(times) - 1)
        seconds = times[end] - times[start]
        parts.append(f"{start}-{end} {(end - start) / seconds:.1f}" if seconds > 0 else f"{start}-{end} –")
    return ", ".join(parts) + " tok/s"


def _keep(runs: dict[str, Runs], pending: dict[str, Runs]) -> None:
    for part, part_runs in pending.items():
        for text, from_draft in part_runs:
            add_run(runs[part], text, from_draft)


def _chunk(
    stats: Stats, pending: dict[str, Runs], split: ThinkingSplit, meter: RateMeter, now: float, elapsed: float
) -> Chunk:
    generating = elapsed - stats.seconds_prefill
    turn_rate = stats.emitted / generating if generating > 0 else 0.0
    return Chunk(
        list(pending[ANSWER]),
        copy.deepcopy(stats),
        meter.update(now, stats.emitted),
        turn_rate,
        thinking_runs=list(pending[THINKING]),
        parts=split.parts() if split.markers else None,
    )


# --- drawing -------------------------------------------------------------------------------------------------
