"""Live numbers for the stats panel, and the loop that turns a `Generation` into batched UI updates.

`stream_generation` runs in the app's thread worker: it iterates the engine, splits a reasoning model's thinking
from its answer (`ThinkingSplit`), gathers released text as provenance runs of each, and calls `emit` at most
every `interval` seconds with a `Chunk` (text since the last chunk plus a `StatsView` snapshot), then once with the
`Finished` answer. `render_stats` draws a `StatsView` as Rich text. Nothing here touches a widget, so the loop is
safe off the UI thread.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.text import Text

from localspec.core.engine import Generation
from localspec.core.stats import Stats
from localspec.core.thinking import ANSWER, THINKING, PartStats, ThinkingSplit

from .failure import error_text

Runs = list[tuple[str, bool]]  # (text, came from the draft)
BAR_WIDTH = 12
DRAFT_STYLE = "bold green"  # tokens the draft proposed and the target accepted
TARGET_STYLE = ""  # tokens the target produced itself


@dataclass(frozen=True, slots=True)
class StatsView:
    """What the stats panel shows: the current (or last) turn, the session, and live rates."""

    turn: Stats | None = None
    session: Stats = field(default_factory=Stats)
    turns: int = 0
    tokens_per_second_now: float = 0.0
    tokens_per_second_turn: float = 0.0
    generating: bool = False
    drafter: str = "model"
    draft_max: int = 0
    adaptive: bool = True  # the engine picks k ≤ draft_max each step (and may turn speculation off)
    provenance: bool = False  # draft tokens are coloured: show the legend
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
    screen (even if drawing failed). Until then `ready()` is False and `stream_generation` keeps the new text
    with it, to send in the next chunk: a slow UI never builds a queue of chunk messages in front of the keys.
    """

    def __init__(self) -> None:
        self._drawn = threading.Event()
        self._drawn.set()

    def sent(self) -> None:
        self._drawn.clear()

    def drawn(self) -> None:
        self._drawn.set()

    def ready(self) -> bool:
        return self._drawn.is_set()


def stream_generation(
    generation: Generation,
    emit: Callable[[Chunk | Reading | Finished], None],
    *,
    split: ThinkingSplit | None = None,
    ready: Callable[[], bool] = lambda: True,
    interval: float = 1 / 20,
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
    try:
        for event in generation:
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
    emit(finished)


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


def provenance_text(runs: Runs) -> Text:
    """Answer text with draft tokens coloured."""
    text = Text()
    for piece, from_draft in runs:
        text.append(piece, DRAFT_STYLE if from_draft else TARGET_STYLE)
    return text


def _bar(fraction: float, width: int = BAR_WIDTH) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * filled + "░" * (width - filled)


def _usual_draft_length(turn: Stats) -> int:
    """The draft length most steps used (k ≥ 1), else the longest one drafted."""
    by_k = getattr(turn, "steps_by_draft_length", [])
    counts = [(n, k) for k, n in enumerate(by_k) if k >= 1 and n]
    return max(counts)[1] if counts else len(turn.drafted_by_position) or turn.draft_length


def _speculation_line(view: StatsView) -> tuple[str, str, str]:
    """(verdict, why it is off or "", style) for the speculation row."""
    turn = view.turn
    if view.drafter == "none":
        return "off", "no drafter", "yellow"
    if turn is not None and turn.target_passes:
        if turn.speculation_off:
            return "off", turn.speculation_off, "yellow"
        k = turn.draft_length if view.generating else _usual_draft_length(turn)
        return f"on, draft length {k}", "", "green"
    if view.draft_max == 0:
        return "off", "draft max is 0", "yellow"
    return f"on, draft length ≤ {view.draft_max}", "", "green"


def _row(text: Text, label: str, value: str, style: str = "") -> None:
    text.append(label + " " * max(1, 14 - cell_len(label)), "dim")
    text.append(value + "\n", style)


def render_stats(view: StatsView) -> Text:
    """The stats panel: this answer's numbers, time split, acceptance by draft position, the session."""
    text = Text()
    text.append("this answer" + (" (live)" if view.generating else "") + "\n", "bold")
    verdict, why, style = _speculation_line(view)
    if len(why) > 20:  # a long reason (the adaptive policy explains itself) goes on its own line
        _row(text, "speculation", verdict, style)
        text.append(f"  {why}\n", "dim")
    else:
        _row(text, "speculation", f"{verdict} ({why})" if why else verdict, style)
    _row(text, "drafter", f"{view.drafter}, max {view.draft_max}" + (" adaptive" if view.adaptive else " fixed"))
    turn = view.turn or Stats()
    if turn.drafted:
        _row(text, "acceptance", f"{turn.acceptance_rate:.0%} ({turn.accepted}/{turn.drafted})", "bold")
    else:
        _row(text, "acceptance", "–")
    _row(text, "α per token", f"{turn.alpha:.2f}" if turn.drafted else "–")
    _row(text, "tokens/pass", f"{turn.mean_tokens_per_pass:.2f}" if turn.target_passes else "–")
    _row(text, "tok/s now", f"{view.tokens_per_second_now:.1f}" if view.generating else "–")
    _row(text, "tok/s turn", f"{view.tokens_per_second_turn:.1f}" if turn.emitted else "–")
    _row(text, "tokens", f"{turn.emitted} in {turn.target_passes} passes")
    _parts_lines(text, view.parts)
    decision = turn.decision
    if view.adaptive and decision.predicted_speedup > 0:  # what the adaptive policy decides from
        _row(text, "c · v(k) · α̂", f"{decision.draft_cost:.2f} · {decision.verify_cost:.2f} · {decision.alpha:.2f}")
        measured = f"{decision.measured_speedup:.2f}×" if decision.measured_speedup else "–"
        _row(text, "speed-up", f"{decision.predicted_speedup:.2f}× pred, {measured} real")
    _time_split(text, turn)
    text.append("\nacceptance by draft position\n", "bold")
    rates = turn.acceptance_by_position
    if not rates:
        text.append("  nothing drafted yet\n", "dim")
    for i, rate in enumerate(rates, start=1):
        text.append(f"{i:>3} ")
        text.append(_bar(rate), "green")
        text.append(f" {rate:>4.0%}\n")
    _session_lines(text, view)
    if view.provenance:
        text.append("\n■ draft token", DRAFT_STYLE)
        text.append("  ■ target token\n")
    return text


def _parts_lines(text: Text, parts: dict[str, PartStats] | None) -> None:
    """Thinking and answer side by side, for an answer that thought (DESIGN §10)."""
    if not parts or not parts[THINKING].tokens:
        return
    thinking, answer = parts[THINKING], parts[ANSWER]

    def both(value) -> str:
        return f"{value(thinking):>8} {value(answer):>8}"

    text.append("\n" + " " * 14 + f"{'thinking':>8} {'answer':>8}\n", "bold")
    _row(text, "tokens", both(lambda p: str(p.tokens)))
    _row(text, "acceptance", both(lambda p: f"{p.acceptance_rate:.0%}" if p.drafted else "–"))
    _row(text, "tokens/pass", both(lambda p: f"{p.tokens_per_pass:.2f}" if p.passes else "–"))


def _time_split(text: Text, turn: Stats) -> None:
    parts = {
        "draft": turn.seconds_draft,
        "verify": turn.seconds_verify,
        "sample": turn.seconds_sampling,
        "other": turn.seconds_other,
    }
    total = sum(parts.values())
    text.append("\ntime split\n", "bold")
    if total <= 0:
        text.append("  nothing timed yet\n", "dim")
        return
    for name, seconds in parts.items():
        text.append(f"  {name:<7}")
        text.append(_bar(seconds / total), "cyan")
        text.append(f" {seconds / total:>4.0%}\n")


def _session_lines(text: Text, view: StatsView) -> None:
    session = view.session
    text.append("\nsession\n", "bold")
    if not view.turns:
        text.append("  no answers yet\n", "dim")
        return
    _row(text, "answers", str(view.turns))
    _row(text, "acceptance", f"{session.acceptance_rate:.0%}" if session.drafted else "–")
    _row(text, "tokens/pass", f"{session.mean_tokens_per_pass:.2f}" if session.target_passes else "–")
    _row(text, "tok/s", f"{session.tokens_per_second:.1f}")
