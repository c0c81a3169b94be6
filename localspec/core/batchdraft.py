"""Which streams of a shared batch draft, and how far (`serve --parallel`, DESIGN §8).

With several streams running, each tick decodes one row per stream in one pass of the target. A stream whose text
repeats itself (code edits, quoting, JSON) can add its own n-gram copy to that pass (core/ngram.py: free to draft,
a point law, so verification stays exact) and gain the tokens the target accepts for the rows they add. Whether that
pays depends on the machine: on a CPU every row costs its share of the compute; on a GPU a row is nearly free, but
llama.cpp splits a batch whose sequences bring different numbers of rows into one pass per distinct count
(llama/slots.py `passes`). So `BatchCosts` learns seconds ≈ a·passes + b·rows from the shared decodes themselves,
`Acceptance` learns each stream's per-token acceptance α̂ from its own verified drafts, and `plan` picks ONE draft
length d and the streams that draft it (one more pass at most, not one per length) for the most expected tokens
per second — nothing unless that beats the plain tick by a margin, so sharing never costs the plain tick's speed.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from localspec.llama.slots import passes

MAX_DRAFT = 16  # longest copy a stream verifies beside others: past this its rows cost more than they are likely worth
MARGIN = 0.05  # draft only when the plan is predicted at least this much faster than the plain tick
LONG_MATCH = 8  # matches at least this long are judged apart: they repeat far more reliably than short ones


class BatchCosts:
    """Seconds of one shared decode as a·passes + b·rows, fitted to the medians of the recent decodes of each shape.

    A median per (passes, rows) shape keeps one decode slowed by another process from moving the fit; each shape
    counts as often as it was seen (its last `window`). The warm-up's timings (`SlotPool.warm`) seed the fit so
    it is defined from the first tick: one row alone and one row per slot give a and b apart.
    """

    def __init__(self, window: int = 12) -> None:
        self._window = window
        self._seen: dict[tuple[int, int], deque[float]] = {}
        self._fit: tuple[float, float] | None = None

    def observe(self, passes: int, rows: int, seconds: float) -> None:
        """One shared decode took `seconds` (inside llama_decode)."""
        self._seen.setdefault((passes, rows), deque(maxlen=self._window)).append(seconds)
        self._fit = None

    def seconds(self, passes: int, rows: int) -> float | None:
        """The predicted seconds of a decode of that shape; None until two shapes were seen."""
        fit = self._fit or self._solve()
        if fit is None:
            return None
        a, b = fit
        return a * passes + b * rows

    def _solve(self) -> tuple[float, float] | None:
        # Least squares without intercept, each shape weighted by how often it was seen: the normal equations.
        spp = spr = srr = spt = srt = 0.0
        for (p, r), times in self._seen.items():
            w, t = len(times), statistics.median(times)
            spp, spr, srr = spp + w * p * p, spr + w * p * r, srr + w * r * r
            spt, srt = spt + w * p * t, srt + w * r * t
        det = spp * srr - spr * spr
        if spp == 0 or det <= 1e-9 * spp * srr:
            return None
        a, b = (spt * srr - srt * spr) / det, (srt * spp - spt * spr) / det
        if b < 0:  # rows that seem free: all of it per pass
            a, b = spt / spp, 0.0
        elif a < 0:  # passes that seem free: all of it per row
            a, b = 0.0, srt / srr
        self._fit = (a, b)
        return self._fit


@dataclass(slots=True)
class Acceptance:
    """One stream's per-token acceptance of its copied drafts, short and long matches apart, recent steps weighing
    most; a stream that stops drafting drifts back to the prior, so a bad stretch is re-tried later."""

    prior: float = 0.5
    weight: float = 2.0  # the prior counts as this many verified tokens
    forget: float = 0.1  # share of the older counts forgotten at each verified step (and while not drafting)
    counts: dict[bool, list[float]] = field(default_factory=lambda: {False: [0.0, 0.0], True: [0.0, 0.0]})

    def alpha(self, match: int) -> float:
        accepted, rejected = self.counts[match >= LONG_MATCH]
        return (accepted + self.prior * self.weight) / (accepted + rejected + self.weight)

    def expected(self, d: int, match: int) -> float:
        """Tokens expected from d drafts beyond the one a step always emits: α̂ + α̂² + … + α̂^d."""
        alpha = self.alpha(match)
        return alpha * (1 - alpha**d) / (1 - alpha) if alpha < 1 else float(d)

    def learn(self, match: int, accepted: int, rejected: bool) -> None:
        """A step verified this stream's drafts after a match of that length: `accepted` taken, and whether one was
        rejected (else all were)."""
        counts = self.counts[match >= LONG_MATCH]
        counts[0] = counts[0] * (1 - self.forget) + accepted
        counts[1] = counts[1] * (1 - self.forget) + rejected

    def idle(self, match: int) -> None:
        """A tick in which this stream could have drafted and did not: its counts fade toward the prior."""
        counts = self.counts[match >= LONG_MATCH]
        counts[0] *= 1 - self.forget
        counts[1] *= 1 - self.forget


@dataclass(frozen=True, slots=True)
class Candidate:
    """One stream in a shared tick: its copy (empty: nothing to draft) and the length of the match it follows."""

    copy: Sequence[int]
    match: int
    acceptance: Acceptance


def plan(candidates: Sequence[Candidate], costs: BatchCosts, *, max_rows: int, margin: float = MARGIN) -> list[int]:
    """How many drafts each stream verifies in this tick (0: its plain row only): one length d for all that draft,
    the streams that gain most at d first, the plan with the most expected tokens per predicted second — all
    zeros unless that beats the plain tick by `margin`, or before the costs are known. Rows stay within `max_rows`.
    """
    n = len(candidates)
    none = [0] * n
    plain = costs.seconds(1, n)
    if plain is None or plain <= 0:
        return none
    best_rate, best = (1 + margin) * n / plain, none
    longest = min(MAX_DRAFT, max((len(c.copy) for c in candidates), default=0))
    for d in range(1, longest + 1):
        gains = sorted(
            ((c.acceptance.expected(d, c.match), i) for i, c in enumerate(candidates) if len(c.copy) >= d), reverse=True
        )
        tokens, lengths = float(n), [1] * n
        for gain, i in gains:
            if sum(lengths) + d > max_rows:
                break
            tokens, lengths[i] = tokens + gain, 1 + d
            seconds = costs.seconds(passes(lengths), sum(lengths))
            if seconds and tokens / seconds > best_rate:
                best_rate, best = tokens / seconds, [length - 1 for length in lengths]
    return best
