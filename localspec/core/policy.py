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
from dataclasses import dataclass

from .acceptance import Acceptance, expected_tokens
from .costs import Costs, EstimatedCosts, MeasuredCosts, RecentMedian
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
class DraftLength:
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
        # α̂: its prior worth two drafted tokens, fading as drafts are verified
        self.acceptance = Acceptance(prior=tuning.alpha_prior, forget=tuning.forget, fades=True)
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
        self._last = DraftLength(0)
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
        return self.acceptance.alpha()

    @property
    def seen(self) -> float:
        """The discounted drafted tokens behind α̂ (the prior's remainder included)."""
        return self.acceptance.evidence()

    @property
    def alpha_high(self) -> float:
        """An optimistic α: α̂ plus 1.28 standard errors of its discounted evidence (a one-sided 90 % bound)."""
        return self.acceptance.alpha_high()

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

    def choose(self, adaptive: bool, limit: int, *, timed: bool = True, cap: int | None = None) -> DraftLength:
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
                choice = DraftLength(k if speedup > 1.0 or choice.probe else 0, probe=choice.probe)
        else:
            choice = DraftLength(cap, self.reason if adaptive and self.off else "")
        self._last = choice
        return choice

    def _decide(self, limit: int, costs: Costs, timed: bool) -> DraftLength:
        tuning = self.tuning
        missing = costs.missing()
        if missing == "plain":
            return DraftLength(0, "adaptive: timing a plain step")
        if missing:
            # Explore until enough drafted steps were timed; a drafter that proposes nothing is retried rarely.
            self._unmeasured += 1
            if self._unmeasured <= 16 or self._unmeasured % 64 == 0:
                return DraftLength(min(limit, tuning.explore[self._unmeasured % len(tuning.explore)]))
            return DraftLength(0, "adaptive: the drafter has proposed nothing to time yet")
        cheap = self.off and not (self._start_probes or self._probed)
        if cheap and self.credit < self._probe_price + self.lag * costs.catch_up_ratio():
            self.state = PolicyState.OFF
            return DraftLength(0, self.reason)  # off, nothing new learnt, no probe affordable yet: nothing to weigh
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
                return DraftLength(0, "adaptive: timing a plain step")
            return DraftLength(k)
        self._probe_price = max(self.probe_cost(k, costs, lag=0), 0.0)
        cost = self.probe_cost(k, costs)
        if self.credit >= cost or self._start_probes:  # a probe, paid from the credit (a start probe, once judged
            # affordable, runs its course: what it costs beyond the credit is repaid before the next one)
            self.credit -= cost
            self._start_probes = max(self._start_probes - 1, 0)
            self.state = PolicyState.PROBING
            return DraftLength(k, probe=True)
        self.state = PolicyState.OFF
        self._start_probes = 0
        self.reason = (
            f"adaptive: plain decoding is faster (α̂ {self.alpha:.2f}, draft cost "
            f"{costs.draft_ratio():.2f}, best k {k} predicts {speedup:.2f}×)"
        )
        return DraftLength(0, self.reason)

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

    def observe(self, step: Step, *, timed: bool = True) -> None:
        """Learn from the step just run (call it with what `speculative_step` returned). `timed` off: its verify
        rows came from a shared batch (`serve --parallel`), which cost it no decode of its own — its acceptance is
        learned, its seconds are not (counted as a lone step's they made verifying look free)."""
        last, self._last = self._last, DraftLength(0)
        timing = step.timing
        if timed:
            self.costs.observe(
                step.drafted, timing.seconds_verify + timing.seconds_sampling, timing.seconds_draft, step.draft_decoded
            )
        self.verified += step.drafted
        if step.drafted:
            self.acceptance.learn(0, step.accepted, step.rejected)
        if timed and timing.seconds > 0 and step.draft_decoded <= step.drafted + 2:  # a catch-up says nothing of speed
            (self._spec_rate if step.drafted else self._plain_rate).add(step.emitted / timing.seconds)
        self.lag = 0 if last.k else self.lag + step.emitted
        self._probed = self._probed or step.drafted > 0  # the next choice weighs what the drafts showed
        if last.reason and self.off:
            # Credit carries from one generation to the next, up to what the probe that opens one costs: probes
            # come spread out, never in a burst paid by a long quiet spell.
            cap = max(self.tuning.start_probe_steps * self._probe_price, self.tuning.probe_budget)
            self.credit = min(self.credit + self.tuning.probe_budget, cap)
