"""The adaptive draft length (localspec/core/policy.py): the k it picks, when it turns speculation off and why,
how often it probes, what it learns from step timings, and that a fixed seed never lets the clock in."""

from __future__ import annotations

import numpy as np
import pytest
from support import run_to_end
from support.fakellm import LogitTable, fake_engine

from localspec.core.acceptance import Acceptance, expected_tokens
from localspec.core.params import SpeculativeParams
from localspec.core.policy import (
    DraftLength,
    DraftPolicy,
    EstimatedCosts,
    MeasuredCosts,
    PolicyState,
    PolicyTuning,
)
from localspec.core.sampling import SamplingParams
from localspec.core.stats import Stats, Step, StepTiming

CHEAP = EstimatedCosts(draft_ratio=0.05, batch_slope=0.1)  # a GPU-like pair: drafting pays off easily


def set_alpha(policy: DraftPolicy, alpha: float, seen: float = 1.0) -> None:
    """α̂ = alpha on `seen` drafted tokens' evidence."""
    policy.acceptance = Acceptance.measured(alpha, seen, forget=policy.tuning.forget)


def policy_with_alpha(alpha: float, costs=CHEAP, **tuning) -> DraftPolicy:
    policy = DraftPolicy(costs=costs, tuning=PolicyTuning(**tuning))
    set_alpha(policy, alpha)
    policy.verified = 100  # as if after 100 verified drafts
    return policy


def test_expected_tokens_per_pass():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_k_grows_with_the_acceptance_estimate():
    ks = [policy_with_alpha(a).choose(True, 8).k for a in (0.5, 0.7, 0.85, 0.95)]
    assert ks == sorted(ks) and ks[0] >= 1 and ks[-1] == 8


def test_fixed_draft_length_when_not_adaptive():
    assert policy_with_alpha(0.0).choose(False, 6) == DraftLength(6, "", probe=False)


def test_not_judged_before_enough_drafts_were_verified():
    policy = policy_with_alpha(0.0, EstimatedCosts(draft_ratio=0.9, batch_slope=0.3))
    policy.verified = 0
    ks = [policy.choose(True, 8).k for _ in range(3)]
    assert ks == [1, 1, 1] and not policy.off  # k is still the best guess; the verdict waits for evidence


def test_off_when_no_k_beats_plain_and_stats_say_why():
    slow = EstimatedCosts(draft_ratio=0.9, batch_slope=0.3)  # a draft as slow as the target
    policy = policy_with_alpha(0.6, slow)
    choice = policy.choose(True, 8)
    assert choice.k == 0 and not choice.probe
    assert choice.reason.startswith("adaptive: plain decoding is faster") and "α̂ 0.60" in choice.reason
    decision = policy.decision  # the inputs of the verdict, as the stats panel and --json show them
    assert (decision.draft_cost, decision.alpha) == (pytest.approx(0.9), pytest.approx(0.6))
    assert decision.verify_cost == pytest.approx(1.3) and decision.predicted_speedup < 1.0


def simulate(policy: DraftPolicy, steps: int, accept_all: bool = False) -> tuple[Stats, list[int], float]:
    """Run the policy against a drafter whose drafts are all rejected (or all accepted)."""
    stats, ks, spent = Stats(), [], 0.0
    for _ in range(steps):
        choice = policy.choose(True, 8)
        stats.record_choice(choice.k, choice.reason, probe=choice.probe)
        k = choice.k
        if k and choice.probe and not accept_all:
            spent += policy.probe_cost(k, policy.costs)
        n_accepted = k if accept_all else 0
        step = Step(((0, False),) * (n_accepted + 1), k, n_accepted)
        stats.record_step(step)
        policy.observe(step)
        ks.append(k)
    return stats, ks, spent


def test_probes_stay_within_the_budget():
    """A useless lookup drafter (nothing to catch up on): probes cost at most 3% of the plain steps."""
    policy = policy_with_alpha(0.0, EstimatedCosts(draft_ratio=0.0, batch_slope=0.3))
    stats, _, spent = simulate(policy, 3000)
    assert stats.probes > 100 and stats.steps_off + stats.probes == 3000
    assert spent <= 0.03 * stats.steps_off + 1.0


def test_no_probe_inside_an_answer_while_catching_up_would_cost_more_than_the_budget():
    """A model draft must decode every plain token before it can draft again; at 10% of a target step per
    token that alone is over budget, so inside one answer it stays off (and the draft stops following the
    text) — until the next generation, which opens with a probe."""
    policy = policy_with_alpha(0.0, EstimatedCosts(draft_ratio=0.1, batch_slope=0.3))
    stats, _, _ = simulate(policy, 3000)
    assert stats.probes == 0 and stats.steps_off == 3000
    assert not policy.wants_draft(True) and policy.wants_draft(False)
    policy.start()  # a new generation: never an absorbing "off"
    assert policy.wants_draft(True)
    stats, ks, _ = simulate(policy, 10)
    assert ks[:2] == [1, 1] and stats.probes == 2 and ks[2:] == [0] * 8  # probed, still useless: off again


def test_a_probe_that_succeeds_turns_speculation_back_on():
    policy = policy_with_alpha(0.0, EstimatedCosts(draft_ratio=0.0, batch_slope=0.3))
    stats, ks, _ = simulate(policy, 400, accept_all=True)  # the drafts became perfect
    assert ks[0] == 0 and stats.probes >= 1 and ks[-50:].count(8) >= 48  # a plain step re-times now and then


def test_measured_costs_fit_the_batch_line_and_skip_catch_up_steps():
    costs = MeasuredCosts(min_samples=2)
    assert costs.missing() == "plain"
    costs.observe(0, 0.010, 0.0, 0)
    costs.observe(0, 0.050, 0.0, 0)  # another process took the cores: the median ignores it
    costs.observe(0, 0.010, 0.0, 0)
    assert costs.missing() == "speculative"
    costs.observe(4, 0.020, 0.200, 40)  # the draft caught up on 36 plain tokens: a catch-up, not drafting
    assert costs.missing() == "speculative" and costs.catch_up_ratio() == pytest.approx(0.5)
    costs.observe(4, 0.020, 0.012, 4)
    costs.observe(2, 0.015, 0.009, 3)  # after a full acceptance: the last draft and the bonus, then one draft
    assert costs.missing() is None
    assert costs.draft_ratio() == pytest.approx(0.3)  # per decode (per drafted token the second step cost 0.45)
    assert costs.batch_ratio(4) == pytest.approx(2.0) and costs.batch_ratio(2) == pytest.approx(1.5)
    assert costs.batch_ratio(8) == pytest.approx(3.0)  # extrapolated


@pytest.mark.parametrize("copies", [5, 7])
def test_a_chains_draft_cost_is_its_average_over_copies_and_model_drafts(copies):
    """`--drafter model+ngram`: a step that copies from the history decodes nothing, one the model drafts decodes k.
    The draft's cost per decode is the model's, times the share of the drafted tokens the model drew (a copy's own
    cost besides): it moves with the share of copies, where one median of the mix read the model's whole cost at 5
    copies in 12 and nothing at 7. A stalled step still moves nothing."""
    costs = MeasuredCosts(min_samples=2)
    for _ in range(3):
        costs.observe(0, 0.010, 0.0, 0)
    for copy in [True] * copies + [False] * (12 - copies):
        costs.observe(4, 0.020, 0.0 if copy else 0.012, 0 if copy else 4)  # 3 ms a decode: c 0.3
    assert costs.draft_ratio() == pytest.approx(0.3 * (12 - copies) / 12)
    costs.observe(4, 0.020, 0.120, 4)  # a stalled model step (ten times the others); the oldest copy leaves
    assert costs.draft_ratio() == pytest.approx(0.3 * (13 - copies) / 12)


def test_measured_costs_see_the_jump_from_one_row_to_two_on_a_gpu():
    """H100-like timings (8B shape): 4 ms plain, 6 ms with one draft, then +0.3 ms a row. A line through plain
    steps (intercept 4.7 ms) misses them all; the line over the draft lengths, against the plain steps' 4 ms, says
    v(1) = 1.5 and v(8) = 2.0."""
    costs = MeasuredCosts(min_samples=1)
    for k, seconds in ((0, 0.004), (1, 0.006), (2, 0.0063), (4, 0.0069)):
        costs.observe(k, seconds, k * 0.0015, k)
    assert costs.batch_ratio(1) == pytest.approx(1.5, abs=0.01)
    assert costs.batch_ratio(8) == pytest.approx(2.03, abs=0.01)
    assert costs.draft_ratio() == pytest.approx(0.375)
    one = MeasuredCosts(min_samples=1)  # one draft length timed: the line runs through plain steps
    one.observe(0, 0.004, 0.0, 0)
    one.observe(2, 0.006, 0.003, 2)
    assert one.batch_ratio(4) == pytest.approx(2.0)


TARGET = LogitTable(5, seed=0)
USELESS = LogitTable(5, seed=99, scale=8.0)  # unrelated to the target, and sure of itself


def run(engine, sampling: SamplingParams, n: int = 40, spec: SpeculativeParams = SpeculativeParams(), rng=None):
    return run_to_end(engine, [1, 2, 3, 4], sampling=sampling, spec=spec, max_tokens=n, rng=rng)


def test_useless_draft_goes_off_through_the_loop():
    engine = fake_engine(TARGET, USELESS)
    engine.policy = DraftPolicy(costs=EstimatedCosts(draft_ratio=0.1, batch_slope=0.2))
    # Unseeded sampling (the policy reads its costs, as in real use), from a seeded stream: no flaky draws.
    rng = np.random.default_rng(11)
    gen = run(engine, SamplingParams(temperature=1.0), n=200, rng=rng)
    assert gen.stats.drafted > 0 and gen.stats.steps_off > 150  # it tried, learnt, and went off
    assert gen.stats.speculation_off.startswith("adaptive: plain decoding is faster")
    assert engine.policy.alpha < 0.34
    second = run(engine, SamplingParams(temperature=1.0), n=20, rng=rng)
    # The next generation opens with a probe (the draft follows the prompt again and drafts), then is off again.
    assert second.stats.probes >= 2 and second.stats.drafted >= 2
    assert second.stats.steps_off >= 10
    assert second.stats.speculation_off.startswith("adaptive: plain decoding is faster")


class ClockCosts(MeasuredCosts):
    """Measured costs that must not be consulted (a seeded run decides without the clock)."""

    def missing(self):
        raise AssertionError("a seeded generation read the timed costs")


def test_a_fixed_seed_never_consults_timed_costs_and_repeats_exactly():
    outputs = []
    for _ in range(2):
        engine = fake_engine(TARGET, LogitTable(5, seed=1, base=TARGET, noise=0.5), draft_size=100)
        engine.policy = DraftPolicy(costs=ClockCosts(), draft_size_ratio=0.1)
        gen = run(engine, SamplingParams(temperature=1.0, seed=5), n=60)
        assert gen.stats.drafted > 0
        outputs.append(gen.tokens)
    assert outputs[0] == outputs[1]


def test_unseeded_runs_use_the_timed_costs():
    engine = fake_engine(TARGET, LogitTable(5, seed=1, base=TARGET, noise=0.5))
    engine.policy = DraftPolicy(costs=ClockCosts())
    with pytest.raises(AssertionError, match="read the timed costs"):
        run(engine, SamplingParams(temperature=1.0))


def test_measured_costs_explore_then_decide_on_a_real_clock():
    """Timings of the fake contexts (draft as costly as the target): exploration, then a decision."""
    engine = fake_engine(TARGET, USELESS)
    gen = run(engine, SamplingParams(temperature=1.0), n=120)
    counts = gen.stats.steps_by_draft_length
    assert counts[0] >= 2 and sum(counts[1:]) >= 1  # timed plain steps, then at least one drafted step
    assert engine.policy.costs.missing() is None
    assert np.isfinite(engine.policy.costs.draft_ratio())


class InjectedCosts(MeasuredCosts):
    """Measured costs fed by the steps' own (injected) seconds — the policy's real cost model."""


def timed_step(k: int, accepted: int, *, plain: float, draft_token: float, slope: float = 0.2) -> Step:
    """A step with injected timings: target part plain·(1 + slope·k), draft part k·draft_token."""
    return Step(
        ((0, False),) * (accepted + 1),
        k,
        accepted,
        draft_decoded=k,
        timing=StepTiming(seconds_draft=k * draft_token, seconds_verify=plain * (1 + slope * k)),
    )


def run_turn(
    policy: DraftPolicy, steps: int, *, draft_token: float, alpha: float, plain: float = 0.010
) -> list[DraftLength]:
    """One generation against a draft that is accepted with rate `alpha` (deterministically spread)."""
    policy.start()
    choices, credit = [], 0.0
    for _ in range(steps):
        choice = policy.choose(True, 8)
        accepted = 0
        for _ in range(choice.k):
            credit += alpha
            if credit < 1:
                break
            credit -= 1
            accepted += 1
        policy.observe(timed_step(choice.k, accepted, plain=plain, draft_token=draft_token))
        choices.append(choice)
    return choices


def test_a_slow_first_turn_does_not_decide_the_session():
    """Cold caches and a busy core make the first turn's drafting look 1.7× a target step: speculation goes
    off. The next turn opens with a probe, its timings are normal again, and speculation is back on within it."""
    policy = DraftPolicy(costs=InjectedCosts(), tuning=PolicyTuning())
    first = run_turn(policy, 60, draft_token=0.017, alpha=0.96)
    assert policy.off and first[-1].k == 0 and "plain decoding is faster" in first[-1].reason
    second = run_turn(policy, 60, draft_token=0.001, alpha=0.96)
    on_from = next(i for i, c in enumerate(second) if c.k and not c.probe)
    assert on_from <= 10 and not policy.off
    assert sum(c.k > 0 for c in second[on_from:]) >= 0.9 * len(second[on_from:])
    assert policy.decision.predicted_speedup > 1.5 and policy.decision.measured_speedup > 1.5


def test_a_useless_draft_stays_off_and_costs_under_five_percent():
    """α = 0 over many short generations: each opens with a 2-step probe, and the time lost to probing and
    exploring stays under 5% of plain decoding (costs from the injected timings: plain 10 ms, draft 3 ms)."""
    policy = DraftPolicy(costs=InjectedCosts(), tuning=PolicyTuning())
    plain, draft_token, slope = 0.010, 0.003, 0.2
    spent = tokens = 0
    for _ in range(30):
        for choice in run_turn(policy, 40, draft_token=draft_token, alpha=0.0, plain=plain):
            spent += plain * (1 + slope * choice.k) + choice.k * draft_token
            tokens += 1  # nothing is ever accepted: one token per step
    assert policy.off
    assert (tokens * plain) / spent >= 0.95


def test_a_draft_as_costly_as_the_target_costs_under_five_percent():
    """A draft as costly as the target that is always right (a model drafting for itself, c = 1, α = 1): no k
    pays, and over many 64-token answers the probes, paid from a credit at their measured price, cost about the
    3% budget (with the first answer's exploration: under 3%; opening every answer with a probe cost 3.3% here).
    Verification as costly as on CPU for a small quantized model: a k-row pass costs 1 + k plain steps."""
    policy = DraftPolicy(costs=InjectedCosts(), tuning=PolicyTuning())
    plain, slope = 0.010, 1.0
    spent = tokens = probes = 0
    for _ in range(40):
        emitted = 0
        policy.start()
        while emitted < 64:
            choice = policy.choose(True, min(8, 63 - emitted))
            step = timed_step(choice.k, choice.k, plain=plain, draft_token=plain, slope=slope)
            policy.observe(step)
            spent += step.timing.seconds
            emitted += step.emitted
            probes += choice.probe
        tokens += emitted
    assert policy.off and probes > 0  # it keeps looking, rarely
    assert (tokens * plain) / spent >= 0.97


def test_the_policy_names_its_state_at_every_choice():
    """TIMING until both costs are timed, then ON with a cheap good draft; a costly one turns it OFF, and the
    probe that opens the next generation is PROBING, which a cheap draft turns ON again."""
    policy = DraftPolicy(costs=InjectedCosts(), tuning=PolicyTuning())
    assert policy.state is PolicyState.TIMING and not policy.off
    states = []
    for _ in range(12):
        choice = policy.choose(True, 8)
        states.append(policy.state)
        policy.observe(timed_step(choice.k, choice.k, plain=0.010, draft_token=0.001))
    assert states[0] is PolicyState.TIMING and states[-1] is PolicyState.ON
    assert states.index(PolicyState.ON) == len(states) - states[::-1].index(PolicyState.TIMING)  # no other state
    run_turn(policy, 60, draft_token=0.017, alpha=0.5)
    assert policy.state is PolicyState.OFF and policy.off
    policy.start()
    choice = policy.choose(True, 8)
    assert choice.probe and policy.state is PolicyState.PROBING and policy.off
    policy.observe(timed_step(choice.k, choice.k, plain=0.010, draft_token=0.001))
    for _ in range(10):
        choice = policy.choose(True, 8)
        policy.observe(timed_step(choice.k, choice.k, plain=0.010, draft_token=0.001))
    assert policy.state is PolicyState.ON and not policy.off


def test_the_draft_length_in_use_holds_until_another_is_clearly_faster():
    # A draft length that follows every wobble of α̂ changes the verify pass's shape, which costs llama.cpp its
    # graph reuse (and on CUDA its captured graph) on most passes: the one in use stays unless another is
    # predicted `hold` faster.
    costs = EstimatedCosts(draft_ratio=0.1, batch_slope=0.15)
    policy = policy_with_alpha(0.8, costs)
    first = policy.choose(True, 8).k
    ks = []
    for alpha in (0.79, 0.81, 0.78, 0.82, 0.8):  # wobbles whose best k differ by one or two at most
        set_alpha(policy, alpha)
        ks.append(policy.choose(True, 8).k)
    fresh = {policy_with_alpha(a, costs).choose(True, 8).k for a in (0.79, 0.81, 0.78, 0.82, 0.8)}
    assert len(fresh) > 1  # without the hold, k would move with these wobbles
    assert ks == [first] * 5
    set_alpha(policy, 0.95)  # a real change: the best k is now predicted well over `hold` faster
    assert policy.choose(True, 8).k > first
    set_alpha(policy, 0.5)
    assert policy.choose(True, 8).k < first


def test_without_a_hold_the_best_k_is_taken_at_every_step():
    costs = EstimatedCosts(draft_ratio=0.1, batch_slope=0.15)
    policy = policy_with_alpha(0.8, costs, hold=0.0)
    for alpha in (0.78, 0.82, 0.9, 0.6):
        set_alpha(policy, alpha)
        assert policy.choose(True, 8).k == policy_with_alpha(alpha, costs).choose(True, 8).k


def test_a_stalled_step_at_a_rarely_used_length_does_not_bend_the_cost_line():
    # Seen in the policy's simulation of a GPU pair (benchmarks/policy_sim.py): two timings of k = 6, one of them
    # stalled, made a median of 1.9× its truth; the line through it rose steeply, v(1) fell under its own measured
    # value, and the policy settled on k = 1 where k = 4 was 15 % faster.
    costs = MeasuredCosts()
    truth = {0: 1.0, 1: 1.37, 2: 1.48, 3: 1.58, 4: 1.69}  # a GPU: a jump from one row to two, then little per row
    for _ in range(10):
        for k, v in truth.items():
            costs.observe(k, 0.010 * v, 0.0022 * k, k)
    costs.observe(6, 0.010 * 1.91, 0.0132, 6)
    costs.observe(6, 0.010 * 1.91 * 3, 0.0132, 6)  # another process took the cores
    for k, v in truth.items():
        if k:
            assert costs.batch_ratio(k) == pytest.approx(v, rel=0.01)  # each timed length: its own median
    assert costs.batch_ratio(6) == pytest.approx(1.26 + 0.108 * 6, rel=0.05)  # the line, over what stands
    policy = DraftPolicy(costs=costs)
    set_alpha(policy, 0.8)
    policy.verified = 100
    assert policy.choose(True, 8).k in (3, 4)


def simulated(name: str, tokens: int, seeds: int = 3) -> tuple[float, float]:
    """(adaptive, best fixed k) ×plain in benchmarks/policy_sim.py's scenario `name` (medians over seeds)."""
    import importlib.util
    import statistics
    import sys
    from pathlib import Path

    path = Path(__file__).parents[2] / "benchmarks" / "policy_sim.py"
    spec = importlib.util.spec_from_file_location("policy_sim", path)
    sim = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("policy_sim", sim)  # its dataclasses look their module up there
    spec.loader.exec_module(sys.modules["policy_sim"])
    sim = sys.modules["policy_sim"]
    scenario = next(s for s in sim.SCENARIOS if s.name == name)
    runs = [sim.run(scenario, 6, tokens, seed) for seed in range(seeds)]
    adaptive = statistics.median(r["adaptive"] for r in runs)
    best = max(statistics.median(r[n] for r in runs) for n in runs[0] if n != "adaptive")
    return adaptive, best


@pytest.mark.parametrize("name", ["14B on a GPU", "14B on 8 GB", "changing text", "useless draft"])
def test_adaptive_is_within_five_percent_of_the_best_fixed_length_on_simulated_pairs(name):
    # The steady α = 0.8 of a GPU pair gave 0.84-0.90 of the best fixed k before α̂ kept ~12 steps (it kept 5 and
    # each dip turned speculation off for an answer), and the H100 measured the same gap (1.09× against 1.28×).
    adaptive, best = simulated(name, tokens=128)
    assert adaptive >= 0.95 * best, (adaptive, best)


def test_a_marginal_gain_is_not_switched_off_by_one_noisy_estimate():
    # A pair that gains ~7 % at k = 2 (α 0.95, a draft decode 0.45 of a plain step): one rejection at k = 1 dipped
    # α̂ enough to predict a loss, speculation went off, and a draft model switched off inside an answer is not
    # probed again there. Off now needs even an optimistic α (a 90 % bound on α̂'s evidence) to predict a loss.
    costs = EstimatedCosts(draft_ratio=0.45, batch_slope=0.18)
    policy = policy_with_alpha(0.95, costs)
    assert policy.choose(True, 8).k >= 1 and not policy.off
    set_alpha(policy, 0.80, 12)  # a dip, on about a dozen steps' evidence
    assert policy.speedup(1, costs) < 1.0  # the point estimate alone predicts a loss…
    assert policy.choose(True, 8).k >= 1 and not policy.off  # …the bound does not: speculation stays on
    set_alpha(policy, 0.5, 40)  # much evidence of a poor draft: off
    choice = policy.choose(True, 8)
    assert choice.k == 0 and policy.off and "α̂ 0.50" in choice.reason


def test_an_answers_last_tokens_do_not_turn_speculation_off():
    """Near the end of an answer a step may verify only 1 or 2 drafts (`cap`), which here predicts a loss: those
    steps decode plainly or draft little, but the verdict weighs --draft-max, so speculation stays on and the next
    answer drafts from its first step (judged on the cap, it went off and the next answer opened with a probe)."""
    policy = DraftPolicy(costs=InjectedCosts(), tuning=PolicyTuning())
    run_turn(policy, 40, draft_token=0.004, alpha=0.9)
    assert policy.state is PolicyState.ON
    assert policy.best(1, policy.costs)[1] < 1.0 < policy.best(8, policy.costs)[1]  # k = 1 alone would lose
    for cap in (2, 1):
        choice = policy.choose(True, 8, cap=cap)
        assert choice.k <= cap and not choice.reason
        policy.observe(timed_step(choice.k, choice.k, plain=0.010, draft_token=0.004))
    assert policy.state is PolicyState.ON
    policy.start()
    first = policy.choose(True, 8)
    assert first.k > 2 and not first.probe and not policy.off
