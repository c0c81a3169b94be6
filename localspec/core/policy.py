"""Adaptive draft length (DESIGN §3): choose k each step for the most tokens per second.

`DraftPolicy` keeps a recency-weighted estimate α̂ of the per-token acceptance and picks k = argmax
E(k) / (k·c + v(k)) with `MeasuredCosts`, this machine's step costs learned from the loop's own timings, and
keeps the k in use unless another is predicted `PolicyTuning.hold` faster: a verify pass of a new size costs
llama.cpp its graph reuse, and on CUDA its captured graph (replayed only after two passes of one shape), so a k that
follows every wobble of α̂ pays that on most passes (docs/benchmarks.md "On a GPU": adaptive 1.32× where fixed
k = 8 gave 1.63×).
When no k ≥ 1 beats plain decoding it decodes plainly; each new generation opens with a short probe, and
inside an answer probes are paid from a small budget earned while plain, so "off" is never final.
It learns from the `Step` records the loop returns (one writer of the counters: the loop).
With a fixed seed the choice must not depend on the clock (it would change the sampled text), so the
costs are then estimated from the model sizes. One policy per `Engine`: it learns across turns.
"""

from __future__ import annotations

import enum
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from .stats import Decision, Step


@dataclass(frozen=True, slots=True)
class PolicyTuning:
    """Constants of the adaptive policy (the defaults are what the engine uses)."""

    alpha_prior: float = 0.5  # α̂ before any draft was verified (worth two drafted tokens of evidence)
    min_evidence: int = 8  # drafted tokens verified before the draft may be judged not worth it
    # share of the older acceptance counts α̂ forgets at each verified step: about the last 12 steps count. At 0.2
    # (5 steps) α̂ of a steady α = 0.8 swung from 0.5 to 0.9, and each dip turned speculation off for an answer
    # (benchmarks/policy_sim.py: 0.84-0.90 of the best fixed k on a GPU-like pair, 0.94-0.98 at 0.08)
    forget: float = 0.08
    margin: float = 0.03  # turn speculation (back) on only when predicted at least this much faster than plain
    # and leave it on until predicted this much slower: off is sticky inside an answer (a draft model that fell
    # behind costs its catch-up to probe again), so a pair that gains a few percent must not leave on one noisy
    # estimate (the demo pair on 2 cores, predicted 1.05 ± 0.04, was off for whole answers at margin 0.03 both ways)
    keep_margin: float = 0.01
    hold: float = 0.05  # keep the draft length in use unless another is predicted at least this much faster
    probe_budget: float = 0.03  # probes may cost at most this fraction of the plain decoding time
    explore: tuple[int, ...] = (1, 2)  # k, in turn, while the costs are unknown (cheap with a useless draft)
    retime_every: int = 96  # while speculating, one plain step this often keeps its timing current
    start_probe_steps: int = 2  # speculative steps that open a generation while off, when the credit pays for them
    window: int = 12  # timings per kind of step that the medians look at
    keep_on_start: int = 1  # newest timings kept when a generation starts (the probe's own soon outvote them)


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
        for estimator in (*self.target.values(), self.draft, self.catch_up):
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


def expected_tokens(alpha: float, k: int) -> float:
    """E(k) = (1 − α^(k+1)) / (1 − α): tokens emitted per target pass with k drafts."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def draft_decodes(alpha: float, k: int) -> float:
    """d(k) = k + α^k: the draft's decodes per step with k drafts — the token the last step left it (the correction,
    or after a full acceptance the last draft and the bonus: one more, with probability α^k), then k − 1 drafts."""
    return k + min(alpha, 1.0) ** k


class PolicyState(enum.Enum):
    """Where the adaptive policy stands; only `DraftPolicy._decide` moves it.

    TIMING → ON or OFF once both costs are timed (a plain step, then a few small k) and the verdict is weighed;
    ON → OFF when the predicted speed-up E(k) / (k·c + v(k)) falls under 1 − keep_margin (on enough evidence),
    OFF → ON when it passes 1 + margin;
    OFF → PROBING for a step paid from the credit earned while plain, or for the probe that opens a generation;
    PROBING → ON or OFF at the next verdict. ON stays ON through the plain step that keeps its timing current.
    """

    TIMING = "timing"  # a cost is not measured yet: no verdict
    ON = "on"  # speculating with the best k
    OFF = "off"  # decoding plainly: plain decoding was predicted faster; credit accrues for probes
    PROBING = "probing"  # off, drafting a step to re-check the draft


@dataclass(frozen=True, slots=True)
class Choice:
    """The policy's draft length for the next step, and why it is 0 when it chose plain decoding."""

    k: int
    reason: str = ""  # "" when speculating (or when k is fixed)
    probe: bool = False  # a speculative step taken while off, to re-check the draft


class DraftPolicy:
    """Chooses k for each step and learns from each `Step`; one per `Engine`, kept across generations.

    No verdict is final: every generation starts with a short probe (`start`), so one bad moment — cold
    caches, another process on the cores — cannot switch a good draft off for the session. Timings are
    medians of recent steps, and a new generation keeps only the newest few, so the probe's own timings
    decide. Inside a long answer, probes are paid from a budget earned while decoding plainly.

    Args:
        costs: the timed cost model (default: measured on this machine; tests inject fixed ones).
        estimate: the cost model of runs that must not read the clock (default: from `draft_size_ratio`).
        draft_size_ratio: draft weight bytes / target weight bytes (`Drafter.size_ratio`).
        tuning: the policy's constants.
    """

    def __init__(
        self,
        *,
        costs: Costs | None = None,
        estimate: Costs | None = None,
        draft_size_ratio: float = 1.0,
        tuning: PolicyTuning = PolicyTuning(),
    ) -> None:
        self.tuning = tuning
        self.costs: Costs = costs if costs is not None else MeasuredCosts()
        self.estimate: Costs = estimate if estimate is not None else EstimatedCosts(draft_size_ratio)
        self.accepted, self.seen = 2 * tuning.alpha_prior, 2.0  # discounted counts: accepted, accepted + rejected
        self.verified = 0  # drafted tokens verified so far (not discounted)
        self.credit = 0.0  # probing allowed, in plain steps: earned while off, spent by probes
        self.lag = 0  # tokens decoded plainly since the drafter last ran: what a probe must catch up on
        self.state = PolicyState.TIMING
        self.reason = ""  # why it is off, in the words stats show
        self.decision = Decision()
        self._start_probes = 0  # speculative steps still owed to the probe that opens a generation
        self._probed = False  # drafts were verified since the costs and α̂ were last weighed
        self._recheck = False  # speculation went off during this generation: the next one opens with a probe
        self._probe_price = 0.0  # plain steps the latest probe was expected to lose (without catching up)
        self._steps_on = 0
        self._unmeasured = 0
        self._last = Choice(0)
        self._held = 0  # the draft length speculation last ran with (`hold`)
        self._plain_rate = RecentMedian(tuning.window)  # tokens/s of recent plain steps
        self._spec_rate = RecentMedian(tuning.window)  # tokens/s of recent speculative steps

    @property
    def off(self) -> bool:
        """The latest verdict found plain decoding faster (probes may still run)."""
        return self.state in (PolicyState.OFF, PolicyState.PROBING)

    @property
    def alpha(self) -> float:
        """α̂ = accepted / (accepted + rejections), over exponentially discounted recent steps."""
        return self.accepted / self.seen

    @property
    def alpha_high(self) -> float:
        """An optimistic α: α̂ plus 1.28 standard errors of its discounted evidence (a one-sided 90 % bound)."""
        alpha = self.alpha
        return min(1.0, alpha + 1.28 * (alpha * (1.0 - alpha) / (self.seen + 1.0)) ** 0.5)

    def speedup(self, k: int, costs: Costs, alpha: float | None = None) -> float:
        """Predicted speed with k drafts per step relative to plain decoding: E(k) / (d(k)·c + v(k)) (at α̂, or
        `alpha`), d(k) the draft's decodes per step (`draft_decodes`)."""
        alpha = self.alpha if alpha is None else alpha
        return expected_tokens(alpha, k) / (draft_decodes(alpha, k) * costs.draft_ratio() + costs.batch_ratio(k))

    def best(self, limit: int, costs: Costs, alpha: float | None = None) -> tuple[int, float]:
        """The k in 1..limit with the highest predicted speed-up, and that speed-up."""
        return max(((k, self.speedup(k, costs, alpha)) for k in range(1, limit + 1)), key=lambda pair: pair[1])

    def start(self) -> None:
        """A new generation begins: if speculation is off and the probe credit pays for it, the generation opens
        with a probe (the draft follows its prompt, batched, as part of the prefill), and old timings give way to
        the probe's (conditions may have changed: the caches are warm now, or the other process on the cores is
        gone). A draft as costly as the target is re-checked rarely; a cheap one at nearly every generation."""
        if not self.off:
            return  # speculation is on: nothing to re-check
        self.lag = 0
        # The generation after the one that turned speculation off re-checks for free (that verdict may have come
        # from one bad moment: cold caches, another process on the cores); later ones when the credit pays.
        affordable = self._recheck or self.credit >= self.tuning.start_probe_steps * self._probe_price
        self._recheck = False
        self._start_probes = self.tuning.start_probe_steps if affordable else 0
        if affordable:
            for estimator in (self._plain_rate, self._spec_rate):
                estimator.keep_newest(self.tuning.keep_on_start)
            self.costs.keep_newest(self.tuning.keep_on_start)

    def wants_draft(self, adaptive: bool) -> bool:
        """Whether the drafter should follow the prompt now (not while adaptive speculation is off)."""
        return not (adaptive and self.off) or self._start_probes > 0

    def choose(self, adaptive: bool, limit: int, *, timed: bool = True, cap: int | None = None) -> Choice:
        """The draft length for the next step, at most `limit` (--draft-max) and `cap`.

        With `adaptive` off, k is the smaller of the two. With `timed` off (a fixed seed), the choice uses the
        estimated costs, so it never depends on the clock. `cap` (None: `limit`) is what this step may verify — the
        answer's last tokens, the context's room: k stays within it, but the verdict weighs `limit`, so an answer
        that ends does not turn speculation off (its last steps, only k = 1 or 2 allowed, predicted a loss and did,
        and the next answer opened with a probe instead of drafting).
        """
        cap = limit if cap is None else min(cap, limit)
        if adaptive and cap > 0:
            costs = self.costs if timed else self.estimate
            choice = self._decide(limit, costs, timed)
            if choice.k > cap:
                k, speedup = self.best(cap, costs)
                choice = Choice(k if speedup > 1.0 or choice.probe else 0, probe=choice.probe)
        else:
            choice = Choice(cap, self.reason if adaptive and self.off else "")
        self._last = choice
        return choice

    def _decide(self, limit: int, costs: Costs, timed: bool) -> Choice:
        tuning = self.tuning
        missing = costs.missing()
        if missing == "plain":
            return Choice(0, "adaptive: timing a plain step")
        if missing:
            # Explore until enough drafted steps were timed; a drafter that proposes nothing is retried rarely.
            self._unmeasured += 1
            if self._unmeasured <= 16 or self._unmeasured % 64 == 0:
                return Choice(min(limit, tuning.explore[self._unmeasured % len(tuning.explore)]))
            return Choice(0, "adaptive: the drafter has proposed nothing to time yet")
        cheap = self.off and not (self._start_probes or self._probed)
        if cheap and self.credit < self._probe_price + self.lag * costs.catch_up_ratio():
            self.state = PolicyState.OFF
            return Choice(0, self.reason)  # off, nothing new learnt, no probe affordable yet: nothing to weigh
        self._probed = False
        k, speedup = self.best(limit, costs)
        if 0 < self._held <= limit and k != self._held:
            kept = self.speedup(self._held, costs)
            if speedup <= kept * (1.0 + tuning.hold):
                k, speedup = self._held, kept
        self._record_decision(k, speedup, costs)
        was_off = self.off
        if was_off:  # back on only when the estimate itself predicts a clear gain
            off = speedup <= 1.0 + tuning.margin
        else:  # off only when even an optimistic α predicts a loss: one noisy α̂ must not end a gain
            off = self.best(limit, costs, self.alpha_high)[1] <= 1.0 - tuning.keep_margin
        off = off and self.verified >= tuning.min_evidence
        self._recheck = self._recheck or (off and not was_off)
        if not off:
            self.state = PolicyState.ON
            self._start_probes = 0
            self._held = k
            self._steps_on += 1
            if timed and self._steps_on % tuning.retime_every == 0:
                return Choice(0, "adaptive: timing a plain step")
            return Choice(k)
        self._probe_price = max(self.probe_cost(k, costs, lag=0), 0.0)
        cost = self.probe_cost(k, costs)
        if self.credit >= cost or self._start_probes:  # a probe, paid from the credit (a start probe, once judged
            # affordable, runs its course: what it costs beyond the credit is repaid before the next one)
            self.credit -= cost
            self._start_probes = max(self._start_probes - 1, 0)
            self.state = PolicyState.PROBING
            return Choice(k, probe=True)
        self.state = PolicyState.OFF
        self._start_probes = 0
        self.reason = (
            f"adaptive: plain decoding is faster (α̂ {self.alpha:.2f}, draft cost "
            f"{costs.draft_ratio():.2f}, best k {k} predicts {speedup:.2f}×)"
        )
        return Choice(0, self.reason)

    def _record_decision(self, k: int, speedup: float, costs: Costs) -> None:
        plain, spec = self._plain_rate, self._spec_rate
        measured = spec.value / plain.value if plain.n and spec.n and plain.value > 0 else 0.0
        self.decision = Decision(
            draft_cost=costs.draft_ratio(),
            verify_cost=costs.batch_ratio(k),
            alpha=self.alpha,
            predicted_speedup=speedup,
            measured_speedup=measured,
        )

    def probe_cost(self, k: int, costs: Costs, *, lag: int | None = None) -> float:
        """Plain steps a probe with k drafts is expected to lose, catching up on the lag included.

        Probes are paid from `credit`, so their total cost stays within the probe budget.
        """
        return (
            (self.lag if lag is None else lag) * costs.catch_up_ratio()
            + draft_decodes(self.alpha, k) * costs.draft_ratio()
            + costs.batch_ratio(k)
            - expected_tokens(self.alpha, k)
        )

    def observe(self, step: Step) -> None:
        """Learn from the step just run (call it with what `speculative_step` returned)."""
        last, self._last = self._last, Choice(0)
        timing = step.timing
        self.costs.observe(
            step.drafted, timing.seconds_verify + timing.seconds_sampling, timing.seconds_draft, step.draft_decoded
        )
        self.verified += step.drafted
        if step.drafted:
            keep = 1.0 - self.tuning.forget
            self.accepted = keep * self.accepted + step.accepted
            self.seen = keep * self.seen + step.accepted + step.rejected
        if timing.seconds > 0 and step.draft_decoded <= step.drafted + 2:  # a catch-up step says nothing of speed
            (self._spec_rate if step.drafted else self._plain_rate).add(step.emitted / timing.seconds)
        self.lag = 0 if last.k else self.lag + step.emitted
        self._probed = self._probed or step.drafted > 0  # the next choice weighs what the drafts showed
        if last.reason and self.off:
            # Credit carries from one generation to the next, up to what the probe that opens one costs: probes
            # come spread out, never in a burst paid by a long quiet spell.
            cap = max(self.tuning.start_probe_steps * self._probe_price, self.tuning.probe_budget)
            self.credit = min(self.credit + self.tuning.probe_budget, cap)
