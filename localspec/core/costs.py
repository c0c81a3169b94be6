"""What a step costs on this machine, as the adaptive policy (policy.py) weighs it: relative to one plain step of the
target, the draft's cost per drafted token, a verify pass of k + 1 rows, and the catch-up after a full acceptance.
`MeasuredCosts` learns them from the loop's own timings (medians of recent steps, a line through the verify passes of
each size); `EstimatedCosts` says them from the model sizes where the clock must not decide (a fixed seed).
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


TRUSTED = 3  # timings of one draft length before its own median is used rather than the line's


class MeasuredCosts:
    """Costs measured from the real step timings the loop already takes (each `Step`'s seconds).

    The target part of a step with k drafts is fitted by a line a + b·k over the k ≥ 1 seen, so c = draft decode /
    plain step and v(k) = (a + b·k) / plain step extrapolate to k never tried; the unit is the plain steps' own
    median. The line leaves plain steps (k = 0) out once two draft lengths were timed: on a GPU, going from one row
    to two costs a jump (v(1) ≈ 1.5 on an H100, 8B shape) and each further row little (v(8) ≈ 2.2). A line through
    k = 0 there misses every point, and measuring against its intercept instead of the plain steps made every
    predicted speed-up some 17 % too high. With one draft length timed, the line runs through plain steps.
    Steps on which the draft caught up on many tokens (its prompt, or tokens decoded plainly) time the catch-up,
    not the drafting.
    """

    def __init__(self, min_samples: int = 4) -> None:
        self.min_samples = min_samples  # per kind of step, before the costs are trusted
        self.target: dict[int, RecentMedian] = {}  # k -> seconds, target part of a step verifying k drafts
        self.draft = DraftSpend()  # seconds per draft decode (a copied token: nearly free)
        self.catch_up = RecentMedian()  # seconds per token the draft decoded in a catch-up
        self._ratios: tuple[float, float, float, float] | None = None  # (c, a, b, catch-up) / plain, refitted lazily

    def missing(self) -> str | None:
        if 0 not in self.target or self.target[0].n < self.min_samples:
            return "plain"
        batches = sum(e.n for k, e in self.target.items() if k)
        return None if min(self.draft.n, batches) >= self.min_samples else "speculative"

    def _line(self) -> tuple[float, float, float]:
        """(plain, a, b): a plain step's seconds and the weighted least-squares line seconds ≈ a + b·k, b ≥ 0, over
        the draft lengths timed often enough for their median to stand (one stalled step among two is half a
        median: it bent the whole line, and the policy chose k = 1 on a GPU where k = 4 was 15 % faster)."""
        plain = self.target[0].value
        timed = [k for k, e in self.target.items() if k and e.n >= TRUSTED]
        drafted = timed if len(timed) >= 2 else [k for k in self.target if k]
        ks = drafted if len(drafted) >= 2 else list(self.target)
        # A length timed once or twice counts at its fastest: one stalled step there bent the line, the policy never
        # chose that length again to correct it, and a pair whose best k was 8 stayed at k = 1 (optimism explores).
        points = [(k, e.value if e.n >= TRUSTED else e.low, min(e.n, 8)) for k in ks for e in [self.target[k]]]
        total = sum(w for _, _, w in points)
        k_mean = sum(w * k for k, _, w in points) / total
        t_mean = sum(w * t for _, t, w in points) / total
        spread = sum(w * (k - k_mean) ** 2 for k, _, w in points)
        b = max(sum(w * (k - k_mean) * (t - t_mean) for k, t, w in points) / spread, 0.0) if spread else 0.0
        a = t_mean - b * k_mean
        return plain, (a if a > 0 else plain), b

    def _fit(self) -> tuple[float, float, float, float]:
        if self._ratios is None:
            plain, a, b = self._line()
            # Unmeasured catch-up: assume a batched token costs as much as a drafted one (an upper bound).
            catch_up = self.catch_up.value if self.catch_up.n else self.draft.value
            self._ratios = (self.draft.value / plain, a / plain, b / plain, catch_up / plain)
        return self._ratios

    def draft_ratio(self) -> float:
        return self._fit()[0]

    def batch_ratio(self, k: int) -> float:
        timed = self.target.get(k)
        if k and timed is not None and timed.n >= TRUSTED:  # this k's own median: the line only extrapolates
            return max(timed.value / self.target[0].value, 1.0)
        _, a, b, _ = self._fit()
        return max(a + b * k, 1.0)  # never cheaper than one row

    def catch_up_ratio(self) -> float:
        return self._fit()[3]

    def keep_newest(self, n: int) -> None:
        self._ratios = None
        estimators: list[RecentMedian | DraftSpend] = [*self.target.values(), self.draft, self.catch_up]
        for estimator in estimators:
            estimator.keep_newest(n)

    def observe(self, drafted: int, target_seconds: float, draft_seconds: float, draft_decoded: int) -> None:
        self._ratios = None
        self.target.setdefault(drafted, RecentMedian()).add(target_seconds)
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
