"""Which streams of a shared batch draft (core/batchdraft.py): the cost fit, the acceptance estimate, the plan.

Pure logic on numbers: the shared decodes themselves are tested on real llama.cpp in tests/core/test_slots.py.
"""

from __future__ import annotations

import pytest

from localspec.core.acceptance import LONG_MATCH, Acceptance
from localspec.core.batchdraft import MAX_DRAFT, NONE, Candidate, DecodeCosts, StreamDraft, plan


def costs_of(a: float, b: float, shapes=((1, 1), (1, 4), (2, 8))) -> DecodeCosts:
    costs = DecodeCosts()
    for p, r in shapes:
        costs.observe(p, r, a * p + b * r)
    return costs


def test_the_cost_fit_finds_the_pass_and_the_row_apart():
    costs = costs_of(0.010, 0.002)
    assert costs.seconds(1, 4) == pytest.approx(0.018)
    assert costs.seconds(2, 12) == pytest.approx(0.044)


def test_one_slow_decode_does_not_move_the_fit():
    costs = costs_of(0.010, 0.002)
    for _ in range(4):
        costs.observe(1, 4, 0.018)
    costs.observe(1, 4, 0.5)  # another process took the cores once: the shape's median stays
    assert costs.seconds(1, 4) == pytest.approx(0.018)


def test_the_costs_are_unknown_until_two_shapes_were_seen():
    costs = DecodeCosts()
    assert costs.seconds(1, 4) is None
    costs.observe(1, 4, 0.02)
    costs.observe(1, 4, 0.02)
    assert costs.seconds(1, 4) is None
    assert plan([Candidate([5, 6], 12, Acceptance())] * 4, costs, max_rows=512) == [NONE] * 4


def test_rows_that_seem_free_put_the_cost_on_the_pass():
    costs = DecodeCosts()
    costs.observe(1, 1, 0.010)
    costs.observe(1, 4, 0.009)  # noise: more rows measured cheaper
    assert costs.seconds(1, 16) == costs.seconds(1, 1) > 0


def test_acceptance_learns_from_its_steps_and_drifts_back_while_idle():
    acceptance = Acceptance()
    assert acceptance.alpha(3) == 0.5 and acceptance.alpha(LONG_MATCH) == 0.5
    for _ in range(10):
        acceptance.learn(3, 0, True)  # short matches: every first draft rejected
        acceptance.learn(LONG_MATCH, 4, False)  # long ones: all taken
    assert acceptance.alpha(3) < 0.15 < 0.9 < acceptance.alpha(LONG_MATCH)
    low = acceptance.alpha(3)
    for _ in range(30):
        acceptance.idle(3)
    assert low < acceptance.alpha(3) < 0.5
    alpha = acceptance.alpha(LONG_MATCH)
    assert acceptance.expected(3, LONG_MATCH) == pytest.approx(alpha + alpha**2 + alpha**3)


def sure(match: int = LONG_MATCH) -> Acceptance:
    acceptance = Acceptance()
    for _ in range(20):
        acceptance.learn(match, 8, False)
    return acceptance


def test_where_rows_are_nearly_free_every_stream_with_a_copy_drafts_all_of_it():
    gpu = costs_of(0.010, 0.0002)
    copies = [list(range(12)), list(range(6)), [], list(range(12))]
    lengths = [c.d for c in plan([Candidate(c, LONG_MATCH, sure()) for c in copies], gpu, max_rows=512)]
    assert lengths == [12, 6, 0, 12]  # a length a stream: the short copy does not hold the long ones back


def test_a_stream_whose_drafts_are_taken_drafts_further_than_one_whose_drafts_are_not():
    """Each stream drafts as far as its own acceptance pays: two streams whose copies are all taken verify their whole
    copies in the same pass as two whose copies are taken at α 0.74 verify short ones. (With one length for all, the
    poorer two drafted nothing.)"""
    rows_cheap = costs_of(0.010, 0.0003)
    poor = Acceptance()
    for _ in range(20):
        poor.learn(LONG_MATCH, 3, True)
    candidates = [Candidate(list(range(16)), LONG_MATCH, sure())] * 2 + [
        Candidate(list(range(16)), LONG_MATCH, poor)
    ] * 2
    lengths = [c.d for c in plan(candidates, rows_cheap, max_rows=512)]
    assert lengths[0] == lengths[1] == 16 > lengths[2] == lengths[3] > 0
    uniform = max(4 / rows_cheap.seconds(1, 4), *(_rate(candidates, rows_cheap, [d] * 4) for d in range(1, 17)))
    assert _rate(candidates, rows_cheap, lengths) > uniform  # faster than the best single length, as predicted


def _rate(candidates, costs, lengths) -> float:
    tokens = len(candidates) + sum(c.acceptance.expected(d, c.match) for c, d in zip(candidates, lengths) if d)
    return tokens / costs.seconds(1, len(candidates) + sum(lengths))


def test_where_every_row_costs_a_poor_copy_drafts_nothing():
    cpu = costs_of(0.004, 0.005)  # compute-bound: a row costs more than a pass
    poor = Acceptance()
    for _ in range(20):
        poor.learn(3, 0, True)
    assert plan([Candidate(list(range(8)), 3, poor)] * 4, cpu, max_rows=512) == [NONE] * 4


def test_a_plan_beats_the_plain_tick_by_its_margin_or_drafts_nothing():
    cpu = costs_of(0.004, 0.005)
    candidates = [Candidate(list(range(8)), LONG_MATCH, sure())] * 4
    lengths = [c.d for c in plan(candidates, cpu, max_rows=512)]
    d = max(lengths)
    assert d > 0  # copies that are all taken pay even where rows cost
    rows = 4 + sum(lengths)
    tokens = 4 + sum(sure().expected(n, LONG_MATCH) for n in lengths)
    assert tokens / cpu.seconds(1 if all(lengths) else 2, rows) > 1.05 * 4 / cpu.seconds(1, 4)
    assert plan(candidates, cpu, max_rows=512, margin=10.0) == [NONE] * 4


def test_a_plan_keeps_within_the_batch_and_the_longest_draft():
    gpu = costs_of(0.010, 0.0001)
    lengths = [c.d for c in plan([Candidate(list(range(64)), LONG_MATCH, sure())] * 8, gpu, max_rows=40)]
    assert 8 + sum(lengths) <= 40 and max(lengths) <= MAX_DRAFT


def model(alpha_steps: int = 20) -> Acceptance:
    """The draft model's acceptance after `alpha_steps` steps of 3 of 4 drafts taken."""
    acceptance = Acceptance()
    for _ in range(alpha_steps):
        acceptance.learn(0, 3, True)
    return acceptance


def test_where_a_draft_pass_is_cheap_the_model_drafts_for_the_streams_without_a_copy():
    gpu, draft = costs_of(0.010, 0.0002), costs_of(0.001, 0.0001)  # a 1B draft beside a 14B target
    candidates = [
        Candidate([], 0, Acceptance(), room=8, model=model(), catch_up=3),
        Candidate([], 0, Acceptance(), room=8, model=model(), catch_up=1),
    ]
    choices = plan(candidates, gpu, max_rows=512, draft_costs=draft)
    assert all(c.model and c.d > 0 for c in choices) and choices[0].d == choices[1].d  # drafted in lockstep


def test_a_long_sure_copy_and_the_models_drafts_each_take_their_own_length():
    """Over the slots' one pool a batch of any shape is one pass (llama/slots.py `passes`), so each stream drafts its
    own length: the stream with a long sure copy verifies all of it, and the model drafts a shorter length for the two
    without a copy, whose α here is 0.74. (With one length for all, as before, the model drafted nothing here.)"""
    gpu, draft = costs_of(0.010, 0.0002), costs_of(0.001, 0.0001)
    candidates = [
        Candidate([], 0, Acceptance(), room=8, model=model(), catch_up=3),
        Candidate(list(range(8)), LONG_MATCH, sure(), room=8, model=model(), catch_up=2),  # its copy beats the model
        Candidate([], 0, Acceptance(), room=8, model=model(), catch_up=1),
    ]
    first, copied, last = plan(candidates, gpu, max_rows=512, draft_costs=draft)
    assert copied == StreamDraft(8, False)
    assert first.model and last.model and 0 < first.d == last.d < 8


def test_a_stream_that_cannot_draft_costs_the_others_nothing_over_one_pool():
    """Over the slots' one pool a stream that cannot draft (no drafter, its room spent) costs the drafts of the
    others no second pass: they draft beside its plain row, as they draft without it. (With each sequence's cells
    kept apart, as before issue 65, it cost them a whole second pass of the target, and none drafted.)"""
    gpu, draft = costs_of(0.010, 0.0002), costs_of(0.001, 0.0001)
    able = Candidate([], 0, Acceptance(), room=8, model=model(), catch_up=2)
    unable = Candidate([], 0, Acceptance(), room=8)
    assert all(c.model for c in plan([able] * 3, gpu, max_rows=512, draft_costs=draft))
    beside = plan([able, able, unable], gpu, max_rows=512, draft_costs=draft)
    assert beside[0].model and beside[1].model and beside[2] == NONE


def test_where_a_draft_pass_costs_like_the_targets_the_model_does_not_draft_beside_others():
    cpu = costs_of(0.004, 0.005)
    draft = costs_of(0.004, 0.005)  # the demo pair on a CPU: the draft is the target's size
    candidates = [Candidate([], 0, Acceptance(), room=8, model=model(), catch_up=2)] * 4
    assert plan(candidates, cpu, max_rows=512, draft_costs=draft) == [NONE] * 4
    assert plan(candidates, costs_of(0.010, 0.0002), max_rows=512) == [NONE] * 4  # the draft's costs unknown


def test_a_choice_says_its_source():
    assert StreamDraft(4, True).model and not StreamDraft(4).model and NONE.d == 0


def test_a_ticks_time_outside_the_decodes_makes_fewer_longer_ticks_pay():
    cpu, draft = costs_of(0.004, 0.005), costs_of(0.002, 0.004)
    candidates = [Candidate([], 0, Acceptance(), room=8, model=sure_model(), catch_up=2)] * 3
    assert plan(candidates, cpu, max_rows=512, draft_costs=draft) == [NONE] * 3
    assert all(c.model for c in plan(candidates, cpu, max_rows=512, draft_costs=draft, overhead=0.05))


def sure_model() -> Acceptance:
    acceptance = Acceptance()
    for _ in range(20):
        acceptance.learn(0, 4, False)
    return acceptance
