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
SEEN_ENOUGH = 3  # recent decodes of one shape whose median predicts it, not the fit


class BatchCosts:
    """Seconds of one shared decode as a·passes + b·rows, fitted to the medians of each shape among the recent decodes.

    Only the last `window` decodes count (a decode's cost grows with its streams' contexts: old ones mislead), each
    shape by its median (one decode slowed by another process does not move the fit) and as often as it was seen.
    Seeds (`seed`: the warm-up's one row alone and one row per slot) count once each beside them, so the fit is
    defined from the first tick and two shapes always tell a and b apart.
    """

    def __init__(self, window: int = 48) -> None:
        self._recent: deque[tuple[int, int, float]] = deque(maxlen=window)
        self._seeds: dict[tuple[int, int], list[float]] = {}
        self._shapes: dict[tuple[int, int], list[float]] = {}  # the recent decodes by shape (made by `_solve`)
        self._fit: tuple[float, float] | None = None

    def seed(self, passes: int, rows: int, seconds: float) -> None:
        """A timing taken before any real decode (the warm-up): it weighs as one decode, whatever comes after."""
        self._seeds.setdefault((passes, rows), []).append(seconds)
        self._fit = None

    def observe(self, passes: int, rows: int, seconds: float) -> None:
        """One shared decode took `seconds` (inside llama_decode)."""
        self._recent.append((passes, rows, seconds))
        self._fit = None

    def seconds(self, passes: int, rows: int) -> float | None:
        """The predicted seconds of a decode of that shape: the median of its recent decodes where there are
        `SEEN_ENOUGH` of them, else of its seeds where there are two, else the fit; None until two shapes were seen.
        A shape's own median wins because a CPU's cost is not linear in rows: its kernels take rows in blocks (the
        demo pair on 2 cores: 3 rows 32 ms, 4 rows 23 ms, 9 rows 50 ms, 10 rows 35 ms), and a batch of many rows
        costs far less per row than one of a few (a 1B-shape target: 4 rows 64 ms, where a line through 1 and 4
        rows put 16 at 227 ms)."""
        fit = self._fit or self._solve()
        if fit is None:
            return None
        seen = self._shapes.get((passes, rows))
        if seen is not None and len(seen) >= SEEN_ENOUGH:
            return statistics.median(seen)
        seeded = self._seeds.get((passes, rows))
        if seeded is not None and len(seeded) >= 2:
            return statistics.median(seeded)
        a, b = fit
        return a * passes + b * rows

    def _solve(self) -> tuple[float, float] | None:
        shapes: dict[tuple[int, int], list[float]] = {}
        for p, r, t in self._recent:
            shapes.setdefault((p, r), []).append(t)
        self._shapes = shapes
        points = [(p, r, len(times), statistics.median(times)) for (p, r), times in shapes.items()]
        points += [(p, r, 1, statistics.median(times)) for (p, r), times in self._seeds.items()]
        # Least squares without intercept, each shape weighted by how often it was seen: the normal equations.
        spp = spr = srr = spt = srt = 0.0
        for p, r, w, t in points:
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

    @property
    def evidence(self) -> float:
        """Verified tokens' worth of evidence behind the estimate (both kinds of match; the prior not counted)."""
        return sum(sum(counts) for counts in self.counts.values())

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
    """One stream in a shared tick: its copy (empty: nothing to copy) and the length of the match it follows, and, where
    the draft model may draft for it, that model's acceptance for it and the rows its draft cache must catch up."""

    copy: Sequence[int]
    match: int
    acceptance: Acceptance
    room: int = 0  # most drafts its step may verify (the model drafts at most this many)
    model: Acceptance | None = None  # None: the draft model does not draft for it
    catch_up: int = 1  # tokens the draft decodes before its first draft (its last token at least)
    remaining: int = 0  # tokens it may still emit (capped): what a catch-up far behind is paid back over


@dataclass(frozen=True, slots=True)
class StreamDraft:
    """What one stream verifies in the tick: d drafts, from the draft model or copied (d = 0: its plain row)."""

    d: int = 0
    model: bool = False


NONE = StreamDraft()
LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16)  # draft lengths the plan weighs (all of them: 16 a tick for 64 slots is too slow)
MODEL_STREAMS_MAX = 8  # most streams the plan weighs the draft model for, best first
CATCH_UP_MAX = 64  # a draft cache further behind catches up on its own first, in chunks (`SlotPool.draft_together`)


def plan(
    candidates: Sequence[Candidate],
    costs: BatchCosts,
    *,
    max_rows: int,
    draft_costs: BatchCosts | None = None,
    overhead: float = 0.0,
    margin: float = MARGIN,
) -> list[StreamDraft]:
    """What each stream verifies in this tick: one length d for all that draft; the draft model for the streams where
    it is expected to gain more than their copy (its cost: one pass of the draft over their catch-up rows, all made
    as long as the longest, then d - 1 passes of one row each, from `draft_costs`), copies for others, those that
    gain most first; the plan with the most expected tokens per predicted second — all `NONE` unless it beats the
    plain tick by `margin`, or before the costs are known. The target's rows stay within `max_rows`. `overhead`: the
    seconds of a tick outside the decodes (each stream's step in Python), which fewer, longer ticks pay less often.
    """
    n = len(candidates)
    plain = costs.seconds(1, n)
    if plain is None or plain <= 0:
        return [NONE] * n
    best_rate, best = (1 + margin) * n / (plain + overhead), [NONE] * n
    longest = max((max(len(c.copy), c.room if c.model is not None else 0) for c in candidates), default=0)
    for d in (d for d in LENGTHS if d <= min(MAX_DRAFT, longest)):
        copies, models = [], []
        for i, c in enumerate(candidates):
            copied = c.acceptance.expected(d, c.match) if len(c.copy) >= d else -1.0
            drafted = c.model.expected(d, 0) if c.model is not None and c.room >= d else -1.0
            if drafted > copied:
                models.append((drafted, i))
            if copied >= 0:
                copies.append((copied, i))
        models.sort(reverse=True)
        copies.sort(reverse=True)
        for m in range(min(len(models), MODEL_STREAMS_MAX) + 1):
            chosen = {i for _, i in models[:m]}
            drafting = 0.0
            if m:  # the catch-ups made one length (`SlotPool.draft_together`): one pass, priced as when the model
                # drafts every tick (the tokens emitted since, at most d + 1); a cache further behind catches up once
                # on its own, that cost spread over the ticks left to the stream
                catch_up = max(min(candidates[i].catch_up, d + 1) for i in chosen)
                first = draft_costs.seconds(1, m * catch_up) if draft_costs is not None else None
                rounds = draft_costs.seconds(1, m) if draft_costs is not None else None
                if first is None or rounds is None:
                    break
                drafting = first + (d - 1) * rounds
                for gain, i in models[:m]:
                    behind = candidates[i].catch_up - catch_up
                    if behind > 0:
                        once = draft_costs.seconds(1, behind) or 0.0
                        drafting += once * (1 + gain) / max(1, candidates[i].remaining)
            lengths = [1 + d if i in chosen else 1 for i in range(n)]
            tokens = n + sum(gain for gain, _ in models[:m])
            rows = sum(lengths)
            if rows > max_rows:
                break
            picks = {i: StreamDraft(d, True) for i in chosen}
            for gain, i in [(None, None), *((g, i) for g, i in copies if i not in chosen)]:
                if i is not None:
                    if rows + d > max_rows:
                        break
                    tokens, rows, lengths[i] = tokens + gain, rows + d, 1 + d
                    picks[i] = StreamDraft(d, False)
                if not picks:
                    continue
                seconds = costs.seconds(passes(lengths), rows)
                if seconds and tokens / (seconds + drafting + overhead) > best_rate:
                    best_rate = tokens / (seconds + drafting + overhead)
                    best = [picks.get(j, NONE) for j in range(n)]
    return best
