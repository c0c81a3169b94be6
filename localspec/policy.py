"""Adaptive draft length (DESIGN §3): choose k each step for the most tokens per second.

`DraftPolicy` keeps an EWMA estimate α̂ of the per-token acceptance and picks k = argmax E(k) / (k·c +
v(k)) from `MeasuredCosts`, this machine's step costs learned from the loop's own timings. When no k ≥ 1
beats plain decoding it decodes plainly and probes again only from a small budget earned while plain.
With a fixed seed the choice must not depend on the clock (it would change the sampled text), so the
costs are then estimated from the model sizes. One policy per `Engine`: it learns across turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .stats import Stats


@dataclass(frozen=True, slots=True)
class PolicyTuning:
    """Constants of the adaptive policy (the defaults are what the engine uses)."""

    alpha_prior: float = 0.5  # α̂ before any draft was verified
    smoothing: float = 0.2  # EWMA weight of the newest step, for α̂ and for the costs
    margin: float = 0.03  # speculate only when predicted at least this much faster than plain
    probe_budget: float = 0.03  # probes may cost at most this fraction of the plain decoding time
    explore_k: int = 1  # k while the costs are still unknown (cheap to lose with a useless draft)
    retime_every: int = 128  # while speculating, one plain step this often keeps its timing fresh


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


class Ewma:
    """A mean that weighs the newest sample by max(1/n, smoothing): exact for the first samples."""

    __slots__ = ("n", "value", "smoothing")

    def __init__(self, smoothing: float) -> None:
        self.n, self.value, self.smoothing = 0, 0.0, smoothing

    def add(self, sample: float) -> None:
        self.n += 1
        self.value += max(1.0 / self.n, self.smoothing) * (sample - self.value)


class MeasuredCosts:
    """Costs measured from the real step timings the loop already takes (`Stats.seconds_*`).

    v(k) is a line through v(0) = 1 fitted to the batch sizes seen so far, so k values never tried
    are extrapolated from those that were. Steps on which the draft caught up on many tokens (its
    prompt, or tokens decoded plainly) time the catch-up, not the drafting.
    """

    def __init__(self, smoothing: float = PolicyTuning().smoothing) -> None:
        self.plain = Ewma(smoothing)  # seconds, target part of a plain step
        self.batch: dict[int, Ewma] = {}  # k -> seconds, target part of a step verifying k drafts
        self.draft = Ewma(smoothing)  # seconds per drafted token
        self.catch_up = Ewma(smoothing)  # seconds per token the draft decoded in a catch-up
        self._smoothing = smoothing

    def missing(self) -> str | None:
        if self.plain.n < 2:
            return "plain"
        return None if self.draft.n and self.batch else "speculative"

    def draft_ratio(self) -> float:
        return self.draft.value / self.plain.value

    def batch_ratio(self, k: int) -> float:
        weighted = [(min(e.n, 8), j, e.value / self.plain.value - 1.0) for j, e in self.batch.items()]
        slope = sum(w * j * extra for w, j, extra in weighted) / sum(w * j * j for w, j, _ in weighted)
        return 1.0 + max(slope, 0.0) * k

    def catch_up_ratio(self) -> float:
        # Unmeasured: assume a batched token costs as much as a drafted one (an upper bound).
        return (self.catch_up.value if self.catch_up.n else self.draft.value) / self.plain.value

    def observe(self, drafted: int, target_seconds: float, draft_seconds: float, draft_decoded: int) -> None:
        if drafted == 0:
            self.plain.add(target_seconds)
            return
        self.batch.setdefault(drafted, Ewma(self._smoothing)).add(target_seconds)
        if draft_decoded <= drafted + 2:  # a regular step: the pending token(s), then one decode per draft
            self.draft.add(draft_seconds / drafted)
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
        return self._draft_ratio

    def observe(self, drafted: int, target_seconds: float, draft_seconds: float, draft_decoded: int) -> None:
        pass


def size_ratio(target_model, drafter) -> float:
    """Draft weight bytes / target weight bytes (0 for a drafter without a model)."""
    seq = getattr(drafter, "seq", None)
    return seq.ctx.model.info.file_size / target_model.info.file_size if seq is not None else 0.0


def expected_tokens(alpha: float, k: int) -> float:
    """E(k) = (1 − α^(k+1)) / (1 − α): tokens emitted per target pass with k drafts."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass(frozen=True, slots=True)
class _Pending:
    """What a step started from, to learn from its outcome in `DraftPolicy.observe`."""

    stats: Stats
    before: tuple[int, int, int, int, float, float, float]  # see `_counters`
    draft_decoded: int
    k: int
    off: bool
    probe: bool


def _counters(stats: Stats) -> tuple[int, int, int, int, float, float, float]:
    return (stats.drafted, stats.accepted, stats.rejections, stats.emitted, stats.seconds_draft,
            stats.seconds_verify, stats.seconds_sampling)


class DraftPolicy:
    """Chooses k for each step and learns from the outcome; one per `Engine`, kept across generations.

    Args:
        drafter: the engine's drafter or None; its `n_decoded` tells drafting from catching up.
        costs: the timed cost model (default: measured on this machine; tests inject fixed ones).
        estimate: the cost model of runs that must not read the clock (default: from `draft_size_ratio`).
        draft_size_ratio: draft weight bytes / target weight bytes (see `size_ratio`).
        tuning: the policy's constants.
    """

    def __init__(self, drafter=None, *, costs: Costs | None = None, estimate: Costs | None = None,
                 draft_size_ratio: float = 1.0, tuning: PolicyTuning = PolicyTuning()) -> None:
        self.drafter = drafter
        self.tuning = tuning
        self.costs: Costs = costs if costs is not None else MeasuredCosts(tuning.smoothing)
        self.estimate: Costs = estimate if estimate is not None else EstimatedCosts(draft_size_ratio)
        self.accepted, self.seen = tuning.alpha_prior, 1.0  # EWMAs of accepted and of accepted + rejected
        self.credit = 0.0  # probing allowed, in plain steps: earned while off, spent by probes
        self.lag = 0  # tokens decoded plainly since the drafter last ran: what a probe must catch up on
        self.off = False  # the latest adaptive choice found plain decoding faster
        self.reason = ""  # and why, in the words stats show
        self._steps_on = 0
        self._unmeasured = 0
        self._pending: _Pending | None = None

    @property
    def alpha(self) -> float:
        """α̂: the EWMA estimate of accepted / (accepted + rejections)."""
        return self.accepted / self.seen

    def speedup(self, k: int, costs: Costs) -> float:
        """Predicted speed with k drafts per step relative to plain decoding: E(k) / (k·c + v(k))."""
        return expected_tokens(self.alpha, k) / (k * costs.draft_ratio() + costs.batch_ratio(k))

    def best(self, limit: int, costs: Costs) -> tuple[int, float]:
        """The k in 1..limit with the highest predicted speed-up, and that speed-up."""
        return max(((k, self.speedup(k, costs)) for k in range(1, limit + 1)), key=lambda pair: pair[1])

    def wants_draft(self, adaptive: bool) -> bool:
        """Whether the drafter should follow the prompt now (not while adaptive speculation is off)."""
        return not (adaptive and self.off)

    def draft_length(self, adaptive: bool, limit: int, stats: Stats, *, timed: bool = True) -> int:
        """k for the next step, at most `limit`; the choice and why it is 0 go into `stats`.

        With `adaptive` off, k is `limit` (the fixed --draft-max, bounded by what is left). With `timed`
        off (a fixed seed), the choice uses the estimated costs, so it never depends on the clock.
        """
        if adaptive and limit > 0:
            k, reason, probe = self._decide(limit, self.costs if timed else self.estimate, timed)
        else:
            k, reason, probe = limit, self.reason if adaptive and self.off else "", False
        stats.record_choice(k, reason, probe=probe)
        n_decoded = getattr(self.drafter, "n_decoded", 0)
        self._pending = _Pending(stats, _counters(stats), n_decoded, k, off=bool(reason), probe=probe)
        return k

    def _decide(self, limit: int, costs: Costs, timed: bool) -> tuple[int, str, bool]:
        tuning = self.tuning
        missing = costs.missing()
        if missing == "plain":
            return 0, "adaptive: timing a plain step", False
        if missing:
            # Explore until a drafted step was timed; a drafter that keeps proposing nothing is retried rarely.
            self._unmeasured += 1
            if self._unmeasured <= 8 or self._unmeasured % 64 == 0:
                return min(limit, tuning.explore_k), "", False
            return 0, "adaptive: the drafter has proposed nothing to time yet", False
        k, speedup = self.best(limit, costs)
        self.off = speedup <= 1.0 + tuning.margin
        if not self.off:
            self.credit = 0.0
            self._steps_on += 1
            if timed and self._steps_on % tuning.retime_every == 0:
                return 0, "adaptive: timing a plain step", False
            return k, "", False
        cost = self._probe_cost(k, costs)
        if self.credit >= cost:
            self.credit -= cost
            return k, "", True
        self.reason = (f"adaptive: plain decoding is faster (α̂ {self.alpha:.2f}, draft cost "
                       f"{costs.draft_ratio():.2f}, best k {k} predicts {speedup:.2f}×)")
        return 0, self.reason, False

    def _probe_cost(self, k: int, costs: Costs) -> float:
        """Plain steps a probe with k drafts is expected to lose, catching up on the lag included."""
        return (self.lag * costs.catch_up_ratio() + k * costs.draft_ratio() + costs.batch_ratio(k)
                - expected_tokens(self.alpha, k))

    def observe(self, stats: Stats) -> None:
        """Learn from the step just run on `stats` (call it right after `speculative_step`)."""
        pending, self._pending = self._pending, None
        if pending is None or pending.stats is not stats:
            return
        now = _counters(stats)
        drafted, accepted, rejected, emitted = (a - b for a, b in zip(now[:4], pending.before[:4]))
        draft_s, verify_s, sampling_s = (a - b for a, b in zip(now[4:], pending.before[4:]))
        decoded = getattr(self.drafter, "n_decoded", 0) - pending.draft_decoded
        self.costs.observe(drafted, verify_s + sampling_s, draft_s, decoded)
        if drafted:
            w = self.tuning.smoothing
            self.accepted += w * (accepted - self.accepted)
            self.seen += w * (accepted + rejected - self.seen)
        self.lag = 0 if pending.k else self.lag + emitted
        if pending.off:
            self.credit += self.tuning.probe_budget
