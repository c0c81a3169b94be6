"""What decoding costs on this machine: `DecodeCosts`, the one model of a decode's seconds by its shape (passes over
the weights, rows), which the adaptive policy (policy.py) and a shared batch's plan (batchdraft.py) both learn; and
what a step costs as the policy weighs it, relative to one plain step of the target: the draft's cost per drafted
token, a verify pass of k + 1 rows, and the catch-up after a full acceptance. `MeasuredCosts` learns them from the
loop's own timings; `EstimatedCosts` says them from the model sizes where the clock must not decide (a fixed seed).
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Protocol


class Costs(Protocol):
    """Step costs relative to one plain step of the target (a 1-row decode plus its sampling)."""

    def missing(self) -> str | None:
        """What must still be timed: "plain", "speculative" (a drafted step), or None when all is known."""
        ...

    def draft_ratio(self) -> float:
        """c: one drafted token / one plain target step."""
        ...

    def batch_ratio(self, k: int) -> float:
        """v(k): target part of a step that verifies k drafts (k+1 rows) / one plain target step."""
        ...

    def catch_up_ratio(self) -> float:
        """b: one token the draft decodes to catch up after plain steps / one plain target step."""
        ...

    def observe(self, drafted: int, target_seconds: float, draft_seconds: float, draft_decoded: int) -> None:
        """Record one step: k drafted tokens, the target's and the drafter's seconds, draft tokens decoded."""
        ...

    def keep_newest(self, n: int) -> None:
        """Forget all but the newest n timings of each kind (a new generation begins)."""
        ...


class RecentMedian:
    """The median of the last `window` timings: robust to the moments other processes took the cores, and
    unbiased whatever the number of samples (a low quantile of many samples undercuts one of few)."""

    __slots__ = ("n", "_recent")

    def __init__(self, window: int = 12) -> None:
        self.n = 0
        self._recent: deque[float] = deque(maxlen=window)

    def add(self, sample: float) -> None:
        self.n += 1
        self._recent.append(sample)

    def keep_newest(self, n: int) -> None:
        """Forget all but the newest n timings (a new generation: conditions may have changed)."""
        while len(self._recent) > n:
            self._recent.popleft()

    @property
    def value(self) -> float:
        return statistics.median(self._recent) if self._recent else 0.0

    @property
    def low(self) -> float:
        """The fastest timing kept: for a draft length timed too rarely for a median (a stall only adds time)."""
        return min(self._recent) if self._recent else 0.0


class DraftSpend:
    """The drafter's seconds per draft decode over recent steps, as two medians weighted by their shares: the steps
    on which the draft model decoded (per decode), and those on which it decoded nothing (per drafted token: a
    copy from the history, or the n-gram drafter's lookup), each weighed by its share of the drafted tokens.

    `--drafter model+ngram` mixes the two, and one median of the mix snapped to one kind's cost or the other's as the
    share of copies crossed one half: c read 0.001 and 0.49 on the demo pair at T 0.8 in two runs of one bench, and
    the draft length followed it. Each median keeps what the medians are here for: a stalled step does not move it.
    """

    __slots__ = ("n", "decoding", "copying", "_drafted")

    def __init__(self, window: int = 12) -> None:
        self.n = 0
        self.decoding = RecentMedian(window)  # seconds per decode, on steps the draft model ran
        self.copying = RecentMedian(window)  # seconds per drafted token, on steps it did not
        self._drafted: deque[tuple[int, bool]] = deque(maxlen=window)  # (tokens drafted, the model ran)

    def add(self, seconds: float, decoded: int, drafted: int) -> None:
        self.n += 1
        self._drafted.append((drafted, decoded > 0))
        (self.decoding if decoded else self.copying).add(seconds / (decoded or drafted))

    def keep_newest(self, n: int) -> None:
        """Forget all but the newest n steps (a new generation: conditions may have changed)."""
        for estimator in (self.decoding, self.copying):
            estimator.keep_newest(n)
        while len(self._drafted) > n:
            self._drafted.popleft()

    @property
    def value(self) -> float:
        total = sum(d for d, _ in self._drafted)
        decoded = sum(d for d, ran in self._drafted if ran)
        if not total:
            return self.decoding.value or self.copying.value
        return (self.decoding.value * decoded + self.copying.value * (total - decoded)) / total


TRUSTED = 3  # timings of one shape before its own median is used rather than the line's
FIT_WEIGHT_MAX = 8  # a shape's weight in the line: how often it was timed, up to this


class DecodeCosts:
    """Seconds of one decode by its shape — passes over the weights and rows (llama/slots.py `passes`; a verify pass
    of k drafts is one pass of k + 1 rows) — learnt from the decodes themselves.

    A shape timed `TRUSTED` times or more is predicted by the median of its recent timings (a decode slowed by another
    process does not move it); else by the median of its seeds (`seed`: the warm-up's timings, before any real decode)
    where there are two; else by a line a·passes + b·rows through the shapes seen. A CPU's cost is not linear in rows —
    its kernels take rows in blocks (the demo pair on 2 cores: 3 rows 32 ms, 4 rows 23 ms, 9 rows 50 ms, 10 rows 35 ms)
    — so a shape's own median wins once it has one. In the line each shape weighs as often as it was timed (up to
    `FIT_WEIGHT_MAX`; a seeded shape once), and a shape timed fewer than `TRUSTED` times counts at its fastest: one
    stalled decode among two is half a median, it bent the whole line, and a length never chosen again was never
    corrected (a pair whose best k was 8 stayed at k = 1: optimism explores). Single-row decodes leave the line once two
    shapes of several rows were timed that tell a and b apart: on a GPU going from one row to two costs a jump (v(1) ≈
    1.5 on an H100, 8B shape) and each further row little, and a line through one row missed every point (the policy's
    predicted speed-ups came out some 17 % too high). With two trusted shapes of several rows, only those count.
    """

    def __init__(self, window: int = 12) -> None:
        self.window = window
        self._timed: dict[tuple[int, int], RecentMedian] = {}
        self._seeds: dict[tuple[int, int], list[float]] = {}
        self._fit: tuple[float, float] | None = None
        self._fitted = False

    def seed(self, passes: int, rows: int, seconds: float) -> None:
        """A timing taken before any real decode (the warm-up): it weighs as one decode, whatever comes after."""
        self._seeds.setdefault((passes, rows), []).append(seconds)
        self._fitted = False

    def observe(self, passes: int, rows: int, seconds: float) -> None:
        """One decode of that shape took `seconds`."""
        self._timed.setdefault((passes, rows), RecentMedian(self.window)).add(seconds)
        self._fitted = False

    def seen(self, passes: int, rows: int) -> int:
        """How many decodes of that shape were timed."""
        timed = self._timed.get((passes, rows))
        return timed.n if timed is not None else 0

    def timed(self, rows_above: int = 0) -> int:
        """How many decodes of more than `rows_above` rows a pass were timed."""
        return sum(e.n for (p, r), e in self._timed.items() if r > rows_above * p)

    def median(self, passes: int, rows: int) -> float:
        """The median of that shape's recent timings (0 before any)."""
        timed = self._timed.get((passes, rows))
        return timed.value if timed is not None else 0.0

    def keep_newest(self, n: int) -> None:
        """Forget all but the newest n timings of each shape (conditions may have changed)."""
        for timed in self._timed.values():
            timed.keep_newest(n)
        self._fitted = False

    def seconds(self, passes: int, rows: int) -> float | None:
        """The predicted seconds of a decode of that shape (None while no line can be drawn and it was not timed)."""
        timed = self._timed.get((passes, rows))
        if timed is not None and timed.n >= TRUSTED:
            return timed.value
        seeded = self._seeds.get((passes, rows))
        if seeded is not None and len(seeded) >= 2:
            return statistics.median(seeded)
        fit = self.line()
        if fit is None:
            return None
        a, b = fit
        return a * passes + b * rows

    def line(self) -> tuple[float, float] | None:
        """(a, b) of seconds ≈ a·passes + b·rows, or None while fewer than two shapes tell them apart."""
        if not self._fitted:
            self._fit, self._fitted = self._solve(), True
        return self._fit

    def _solve(self) -> tuple[float, float] | None:
        # (passes, rows, weight, seconds, trusted) of every shape timed or seeded
        points = [
            (p, r, min(e.n, FIT_WEIGHT_MAX), e.value if e.n >= TRUSTED else e.low, e.n >= TRUSTED)
            for (p, r), e in self._timed.items()
            if e.n
        ]
        points += [(p, r, 1, statistics.median(t), len(t) >= 2) for (p, r), t in self._seeds.items()]
        several = [point for point in points if point[1] > point[0]]
        trusted = [point for point in several if point[4]]
        for chosen in (trusted, several, points):  # the first set that tells a and b apart
            fit = _least_squares(chosen) if len({(p, r) for p, r, *_ in chosen}) >= 2 else None
            if fit is not None:
                return fit
        return None


def _least_squares(points: list[tuple[int, int, int, float, bool]]) -> tuple[float, float] | None:
    """(a, b) of seconds ≈ a·passes + b·rows by weighted least squares without intercept (the normal equations), or
    None where the points do not tell a and b apart; neither is negative."""
    spp = spr = srr = spt = srt = 0.0
    for p, r, w, t, _ in points:
        spp, spr, srr = spp + w * p * p, spr + w * p * r, srr + w * r * r
        spt, srt = spt + w * p * t, srt + w * r * t
    det = spp * srr - spr * spr
    if spp == 0 or det <= 1e-9 * spp * srr:
        return None
    a, b = (spt * srr - srt * spr) / det, (srt * spp - spt * spr) / det
    if b < 0:  # rows that seem free: all of it per pass
        return spt / spp, 0.0
    if a < 0:  # passes that seem free: all of it per row
        return 0.0, srt / srr
    return a, b


class MeasuredCosts:
    """Costs measured from the real step timings the loop already takes (each `Step`'s seconds).

    The target's part of a step with k drafts is a decode of one pass and k + 1 rows (with its sampling), learnt by
    `DecodeCosts` (`verify`): c = draft decode / plain step and v(k) = that decode / plain step, extrapolated by its
    line to k never tried; the unit is the plain steps' own median. Steps on which the draft caught up on many tokens
    (its prompt, or tokens decoded plainly) time the catch-up, not the drafting.
    """

    def __init__(self, min_samples: int = 4) -> None:
        self.min_samples = min_samples  # per kind of step, before the costs are trusted
        self.verify = DecodeCosts()  # seconds of the target's part of a step, by its shape (1, k + 1)
        self.draft = DraftSpend()  # seconds per draft decode (a copied token: nearly free)
        self.catch_up = RecentMedian()  # seconds per token the draft decoded in a catch-up
        self._ratios: tuple[float, float] | None = None  # (c, catch-up) / plain, refitted lazily

    def missing(self) -> str | None:
        if self.verify.seen(1, 1) < self.min_samples:
            return "plain"
        return None if min(self.draft.n, self.verify.timed(rows_above=1)) >= self.min_samples else "speculative"

    def _fit(self) -> tuple[float, float]:
        if self._ratios is None:
            plain = self.verify.median(1, 1)
            # Unmeasured catch-up: assume a batched token costs as much as a drafted one (an upper bound).
            catch_up = self.catch_up.value if self.catch_up.n else self.draft.value
            self._ratios = (self.draft.value / plain, catch_up / plain)
        return self._ratios

    def draft_ratio(self) -> float:
        return self._fit()[0]

    def batch_ratio(self, k: int) -> float:
        seconds = self.verify.seconds(1, k + 1)
        plain = self.verify.median(1, 1)
        return max((seconds or plain) / plain, 1.0)  # never cheaper than one row

    def catch_up_ratio(self) -> float:
        return self._fit()[1]

    def keep_newest(self, n: int) -> None:
        self._ratios = None
        self.verify.keep_newest(n)
        self.draft.keep_newest(n)
        self.catch_up.keep_newest(n)

    def observe(self, drafted: int, target_seconds: float, draft_seconds: float, draft_decoded: int) -> None:
        self._ratios = None
        self.verify.observe(1, drafted + 1, target_seconds)
        if drafted == 0:
            return
        if draft_decoded <= drafted + 2:  # a regular step: the pending token(s), then one decode per draft
            # Per decode, not per drafted token: a step decodes k + 1 tokens after a full acceptance (the last draft
            # and the bonus), so per drafted token a k = 1 step cost twice a k = 8 one, and the first answers'
            # short exploring drafts made a draft at 0.45 of the target look like 0.8-1.0 (speculation went off).
            self.draft.add(draft_seconds, draft_decoded, drafted)
        elif draft_decoded >= 8:
            self.catch_up.add(draft_seconds / draft_decoded)


class EstimatedCosts:
    """Costs guessed without a clock: c from the weight bytes a decode step reads, v(k) a fixed line."""

    def __init__(self, draft_ratio: float, batch_slope: float = 0.25) -> None:
        self._draft_ratio, self._batch_slope = draft_ratio, batch_slope

    def missing(self) -> str | None:
        return None

    def draft_ratio(self) -> float:
        return self._draft_ratio

    def batch_ratio(self, k: int) -> float:
        return 1.0 + self._batch_slope * k

    def catch_up_ratio(self) -> float:
        return self._draft_ratio / 2  # a batched token: measured 0.4-0.6 of a drafted one on 2 CPU cores

    def observe(self, drafted: int, target_seconds: float, draft_seconds: float, draft_decoded: int) -> None:
        pass

    def keep_newest(self, n: int) -> None:
        pass
