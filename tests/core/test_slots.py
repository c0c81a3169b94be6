"""Slots of one target context (`serve --parallel`): which slot a prompt takes, and streams stepped together.

On the real tiny pair: the next tokens of several streams go through ONE llama_decode per step, and each stream's
greedy text is the text it gets alone; a row decoded in the shared batch that no step takes is removed again.
"""

from __future__ import annotations

from contextlib import contextmanager

import llama_cpp
import numpy as np
import pytest
from support.fixedcosts import FixedCosts

from localspec.core.costs import MeasuredCosts
from localspec.core.engine import Engine
from localspec.core.kv import KVSequence
from localspec.core.params import SpeculativeParams
from localspec.core.policy import DraftPolicy
from localspec.core.sampling import SamplingParams
from localspec.core.slots import SlotPool
from localspec.errors import InvalidParamsError, NoRoomError
from localspec.llama.context import Context
from localspec.llama.model import Model
from localspec.llama.slots import SeqContext, decode_shared, passes

PROMPTS = [[1, 5, 9, 13, 2], [1, 7, 7, 3], [1, 4, 8, 15, 16, 23, 42], [1, 2]]


@pytest.fixture(scope="module")
def engine(tiny_models):
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=256, n_seq=3) as engine:
        yield engine


def test_a_prompt_takes_the_free_slot_that_shares_most_of_it(engine):
    pool = SlotPool(engine, 3)
    first = pool.acquire([1, 2, 3])
    first.target.sync([1, 2, 3])
    pool.release(first)
    second = pool.acquire([9, 9])  # shares nothing: the least recently used slot, not the one holding [1, 2, 3]
    assert second is not first
    again = pool.acquire([1, 2, 3, 4])
    assert again is first and pool.busy == 2
    third = pool.acquire([1, 2])
    assert pool.busy == 3
    with pytest.raises(RuntimeError):
        pool.acquire([1])
    for slot in (second, again, third):
        pool.release(slot)
    assert pool.busy == 0


def test_more_slots_than_sequences_is_refused(tiny_models):
    with (
        Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=256) as one,
        pytest.raises(InvalidParamsError, match="sequences"),
    ):
        SlotPool(one, 2)


FIXED_K = SpeculativeParams(draft_max=4, adaptive=False)  # drafts every step (the tiny noisy draft does not pay)


def _alone(engine, pool, prompt, max_tokens):
    slot = pool.acquire(prompt)
    try:
        gen = engine.generate(
            prompt, sampling=SamplingParams(temperature=0), spec=FIXED_K, max_tokens=max_tokens, target=slot.target
        )
        for _ in gen:
            pass
        return gen.tokens
    finally:
        pool.release(slot)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_streams_stepped_together_decode_once_per_step_and_match_their_texts_alone(engine, temperature):
    """Greedy: the text alone (speculating) equals the text in a shared batch. At T > 0 with a seed and draft-max 0
    (plain decoding alone too), the same seed gives the same text alone and together: each stream its own RNG."""
    pool = SlotPool(engine, 3)
    sampling = SamplingParams(temperature=temperature, seed=7)
    spec = FIXED_K if temperature == 0 else SpeculativeParams(draft_max=0)
    lengths = [12, 30, 21]

    def start(prompt, n, slot):
        return engine.generate(prompt, sampling=sampling, spec=spec, max_tokens=n, target=slot.target)

    alone = []
    for prompt, n in zip(PROMPTS, lengths, strict=False):
        slot = pool.acquire(prompt)
        gen = start(prompt, n, slot)
        alone.append([e.token for e in gen])
        pool.release(slot)
    slots = [pool.acquire(p) for p in PROMPTS[:3]]
    gens = [start(p, n, s) for p, n, s in zip(PROMPTS, lengths, slots, strict=False)]
    for gen in gens:
        gen.shared = pool
    events = [iter(g) for g in gens]
    streams = list(zip(slots, gens, strict=True))
    assert pool.begin(streams) == 0  # no prompt read yet: no rows; each reads its own in the tick
    together: list[list[int | None]] = [[next(e).token] for e in events]  # each prompt read, first step taken
    pool.end(streams)
    parent = engine.target.ctx
    live, lone = set(range(3)), set()
    while live:
        before = parent.decodes
        streams = [(slots[i], gens[i]) for i in sorted(live)]
        decoded = pool.begin(streams)
        assert parent.decodes == before + 1  # ONE llama_decode for every live stream
        if len(live) > 1:
            assert decoded == len(live)  # one row each: the plan drafts nothing for this noisy draft
        else:  # the last one left: a tick of one stream, which drafts as alone (its fixed k, its own drafter)
            lone.update(live)
            assert pool.tick is not None and pool.tick.solo is gens[min(live)]
        for i in sorted(live):
            while True:  # its step's tokens (one each while several run, its accepted drafts too when alone)
                event = next(events[i])
                together[i].append(event.token)
                if event.finish_reason is not None:
                    live.discard(i)
                    with pytest.raises(StopIteration):
                        next(events[i])
                    break
                if not gens[i].pending:
                    break
        assert parent.decodes == before + 1  # no stream decoded on its own
        pool.end(streams)
    assert together == alone[:3]
    assert lone and all(g.stats.drafted == 0 for i, g in enumerate(gens) if i not in lone)
    assert all((gens[i].stats.drafted > 0) == (temperature == 0) for i in lone)  # draft_max 0 at T > 0
    for slot, gen in zip(slots, gens, strict=True):
        slot.target.check()
        assert slot.target.n_past == len(gen.prompt) + len(gen.tokens) - 1
        pool.release(slot)


def test_a_row_decoded_ahead_that_no_step_takes_is_removed(engine):
    pool = SlotPool(engine, 3)
    slot = pool.acquire(PROMPTS[0])
    gen = engine.generate(PROMPTS[0], sampling=SamplingParams(temperature=0), max_tokens=5, target=slot.target)
    gen.shared = pool
    events = iter(gen)
    pool.begin([(slot, gen)])
    next(events)
    pool.end([(slot, gen)])
    assert pool.begin([(slot, gen)]) == 1
    assert slot.view.pos_range()[1] == slot.target.n_past  # one cell past the tokens: the pending row
    gen.cancel()
    assert next(events).finish_reason == "cancelled"
    pool.release(slot)  # discards it
    slot.target.check()
    assert not slot.view.pending


def test_a_step_that_decodes_something_else_undoes_the_row_decoded_ahead(engine):
    """A stream that turns to speculating (it is alone now) decodes its verify pass itself: the row decoded in the
    shared batch is removed first, and its text is still its text alone."""
    pool = SlotPool(engine, 3)
    expected = _alone(engine, pool, PROMPTS[1], 20)
    slot = pool.acquire(PROMPTS[1])
    gen = engine.generate(
        PROMPTS[1], sampling=SamplingParams(temperature=0), spec=FIXED_K, max_tokens=20, target=slot.target
    )
    gen.shared = pool
    events = iter(gen)
    pool.begin([(slot, gen)])
    tokens = [next(events).token]
    pool.end([(slot, gen)])
    pool.begin([(slot, gen)])
    pool.end([(slot, gen)])  # the tick ends before the step: it speculates, k drafts + 1 rows, not the pending row
    tokens += [e.token for e in events]
    assert tokens == expected
    slot.target.check()
    assert gen.stats.drafted > 0
    pool.release(slot)


class _CountingContext(Context):
    """A context that counts the graph nodes llama.cpp computes (its eval callback is asked once per node)."""

    def _configure(self, params) -> None:
        self.nodes = 0

        def asked(_tensor, ask, _user_data) -> bool:
            self.nodes += 1
            return False  # only counting: llama.cpp computes the graph in one go

        self._asked = llama_cpp.ggml_backend_sched_eval_callback(asked)  # kept alive with the context
        params.cb_eval = self._asked


@contextmanager
def counted_views(tiny_models, n: int = 4):
    """A counting context of the tiny target with n sequences, each holding [1, 5, 9]: (the context, their views)."""
    model = Model(tiny_models.target)
    ctx = _CountingContext(model, n_ctx=64, n_seq=n, n_threads=1)
    try:
        views = [SeqContext(ctx, seq) for seq in range(n)]
        for view in views:
            view.decode([1, 5, 9], 0)
        yield ctx, views
    finally:
        ctx.close()
        model.close()


def test_streams_in_any_order_are_one_batch_of_the_model(tiny_models):
    """Rows for slots 2, 0, 3, 1 go through the model in one pass, as 0, 1, 2, 3 do (a cache keeping each
    sequence's cells apart split a batch at every sequence id out of ascending order: four passes, and four clients'
    steps cost up to 2.2× what they should, demo pair, 2026-11-27), and each sequence reads its own row."""
    with counted_views(tiny_models) as (ctx, views):
        nodes = []
        for order in ([0, 1, 2, 3], [2, 0, 3, 1], [3, 2, 1, 0]):
            for view in views:
                view.remove_from(3)  # the row the last order decoded
            before = ctx.nodes
            decode_shared([(views[seq], [7], 3) for seq in order])
            nodes.append(ctx.nodes - before)
            rows = {seq: views[seq].logits(0).copy() for seq in order}
            for seq in order:  # each sequence reads its own row, whatever the order it was given in
                views[seq].decode([7], 3)
                assert (views[seq].logits(0) == rows[seq]).all()
        assert nodes[0] > 0 and nodes == [nodes[0]] * 3, f"graph nodes per order: {nodes}"


def test_a_step_that_took_a_shared_row_teaches_the_draft_policy_nothing(engine):
    """A stream left alone mid-tick (the other ended) takes the row decoded for it in the shared batch: its step cost
    no decode of its own, and counted as a lone plain step it made plain decoding look free — `serve --parallel 4`
    then all but stopped speculating for a lone client (4-11 drafts an answer against ~100 with one slot)."""
    pool = SlotPool(engine, 3)
    slots = [pool.acquire(p) for p in PROMPTS[:2]]
    plain = SpeculativeParams(draft_max=0)  # k = 0 every step: the lone step takes the shared row
    gens = [
        engine.generate(p, sampling=SamplingParams(temperature=0), spec=plain, max_tokens=8, target=s.target)
        for p, s in zip(PROMPTS, slots, strict=False)
    ]
    for gen in gens:
        gen.shared = pool
    events = [iter(g) for g in gens]
    streams = list(zip(slots, gens, strict=True))
    pool.begin(streams)
    for e in events:
        next(e)
    pool.end(streams)
    timed = engine.policy.costs.verify
    plain_steps = timed.seen(1, 1)
    pool.begin(streams)
    pool.end(streams)  # the other stream ended earlier in this tick (a lone step, which takes its shared row)
    next(events[0])
    assert slots[0].view.row_shared  # it took its row from the shared batch
    assert timed.seen(1, 1) == plain_steps
    next(events[0])  # its next step decodes alone, and is timed
    assert not slots[0].view.row_shared and timed.seen(1, 1) == plain_steps + 1
    for gen, slot in zip(gens, slots, strict=True):
        gen.cancel()
        pool.release(slot)


def test_a_lone_step_is_a_tick_of_one_stream(engine):
    """One stream in a tick (`serve --parallel`, the only request running) steps as it would alone: its own drafter
    and policy draft its k before the tick's one decode, which holds its rows and its drafts; its step decodes
    nothing more; the policy is taught the seconds of that decode and of the drafting (before, a row of a shared
    batch taught it nothing: a lone stream's policy never timed a step); its greedy text is the text alone."""
    pool = SlotPool(engine, 3)
    alone = _alone(engine, pool, PROMPTS[2], 24)
    slot = pool.acquire(PROMPTS[2])
    policy = DraftPolicy(costs=MeasuredCosts())
    gen = engine.generate(
        PROMPTS[2],
        sampling=SamplingParams(temperature=0),
        spec=FIXED_K,
        max_tokens=24,
        target=slot.target,
        policy=policy,
    )
    gen.shared = pool
    events, parent, ticks = iter(gen), engine.target.ctx, []
    pool.begin([(slot, gen)], running=1)
    text = [next(events).token]  # a first step where no other runs: alone, before any tick decoded for it
    while gen.pending:
        text.append(next(events).token)
    pool.end([(slot, gen)])
    verify, decoding = gen.stats.seconds_verify, 0.0  # the steps' verify time, and the ticks' decodes'
    while gen.finish_reason is None:
        before, seconds = parent.decodes, parent.seconds_decoding
        rows = pool.begin([(slot, gen)], running=1)
        decoding += parent.seconds_decoding - seconds
        assert pool.tick is not None and pool.tick.solo is gen
        while True:
            text.append(next(events).token)
            if gen.finish_reason is not None or not gen.pending:
                break
        assert parent.decodes == before + 1 and not slot.view.row_shared  # its one decode: the tick's, its own
        ticks.append(rows)
        pool.end([(slot, gen)])
    assert text == alone
    assert max(ticks) == 1 + FIXED_K.draft_max  # its drafts were in the tick's batch
    drafted = [rows for rows in ticks if rows > 1]
    assert drafted and policy.costs.verify.seen(1, 1 + FIXED_K.draft_max) >= len(drafted) - 1  # timed, as alone
    assert gen.stats.seconds_verify - verify >= decoding > 0  # each step counts its decode, made in its tick
    assert policy.costs.draft.value > 0
    pool.release(slot)


def test_a_batch_of_several_rows_per_sequence_takes_one_pass_whatever_the_counts(tiny_models):
    """What `core/batchdraft.py` prices drafts in a shared batch by (`passes`): over the one pool the slots share,
    llama.cpp takes a batch whose sequences bring different numbers of rows in one pass over the weights (cells kept
    apart per sequence took one pass per distinct count), counted here from the graph nodes it computes."""
    with counted_views(tiny_models) as (ctx, views):
        per_pass = None
        for lengths in ([1, 1, 1, 1], [5, 1, 1, 1], [5, 5, 1, 1], [5, 3, 1, 1], [1, 5, 1, 3], [5, 5, 5, 5], [3]):
            for view in views:
                view.remove_from(3)
            before = ctx.nodes
            decode_shared([(views[seq], [7 + j for j in range(n)], 3) for seq, n in enumerate(lengths)])
            per_pass = per_pass or ctx.nodes - before
            assert ctx.nodes - before == passes(lengths) * per_pass, lengths
            for view in views:
                view.discard()
        assert passes([1, 1, 1, 1]) == 1 and passes([5, 3, 1, 1]) == 1


def test_each_sequence_reads_its_own_rows_of_a_shared_batch(tiny_models):
    """Rows decoded in the shared batch for a step that verifies drafts: the step's decode of exactly those tokens
    takes them, row i (or -1 from its last) is the shared batch's row for that token, whatever the other sequences
    brought."""
    model = Model(tiny_models.target)
    ctx = Context(model, n_ctx=64, n_seq=3, n_threads=1)
    try:
        views = [SeqContext(ctx, seq) for seq in range(3)]
        for view in views:
            view.decode([1, 5, 9], 0)
        asked = {2: [11, 12, 13, 14], 0: [7], 1: [8, 9]}
        decode_shared([(views[seq], tokens, 3) for seq, tokens in asked.items()])
        shared = ctx.logits_block(7, 0).copy()  # sequence order: 0 (1 row), 1 (2 rows), 2 (4 rows)
        first = {0: 0, 1: 1, 2: 3}
        for seq, tokens in asked.items():
            views[seq].decode(tokens, 3, outputs=len(tokens))
            assert views[seq].row_shared and ctx.decodes == 4  # taken, not decoded again
            block = views[seq].logits_block(len(tokens), 0)
            assert (block == shared[first[seq] : first[seq] + len(tokens)]).all()
            assert (views[seq].logits(-1) == shared[first[seq] + len(tokens) - 1]).all()
        assert len({row.tobytes() for row in shared}) == 7  # distinct rows: a wrong mapping would show
        with pytest.raises(AssertionError):
            views[0].logits(1)  # sequence 0 brought one row
    finally:
        ctx.close()
        model.close()


REPEATING = [
    "Copy this list twice: apple, banana, cherry, date, elderberry, fig, grape. apple, banana, cherry,",
    "Say it again: one two three four five six seven eight nine ten. one two three four",
    "The code: for i in range(10): print(i). The same code: for i in range(10):",
]


def test_streams_beside_others_verify_their_own_ngram_copies_and_keep_their_greedy_text(smollm2_path):
    """Where drafting in the shared batch is predicted to pay, each stream's n-gram copy goes into the ONE decode
    of the tick and its step verifies it: the greedy text is the stream's text alone (speculating with its n-grams),
    drafts were verified and accepted, and no stream decoded on its own."""
    with Engine.load(smollm2_path, drafter="ngram", n_ctx=512, n_seq=3) as engine:
        pool = SlotPool(engine, 3)
        pool.costs = FixedCosts()
        prompts = [engine.tokenize(text) for text in REPEATING]
        spec = SpeculativeParams(draft_max=8, adaptive=False)
        greedy = SamplingParams(temperature=0)

        def start(prompt, slot):
            return engine.generate(prompt, sampling=greedy, spec=spec, max_tokens=24, target=slot.target)

        alone = []
        for prompt in prompts:
            slot = pool.acquire(prompt)
            alone.append([e.token for e in start(prompt, slot)])
            pool.release(slot)
        slots = [pool.acquire(p) for p in prompts]
        gens = [start(p, s) for p, s in zip(prompts, slots, strict=True)]
        together, ticks = _run_together(pool, engine, gens, slots)
        for prompt, mine, its in zip(prompts, together, alone, strict=True):
            _same_but_at_a_near_tie(engine.target_model, prompt, mine, its)
        assert sum(g.stats.drafted for g in gens) > 0 and sum(g.stats.accepted for g in gens) > 0
        assert ticks < max(len(t) for t in together)  # fewer ticks than the longest stream has tokens
        for slot, gen in zip(slots, gens, strict=True):
            slot.target.check()
            assert slot.target.n_past == len(gen.prompt) + len(gen.tokens) - 1
            pool.release(slot)


NEAR_TIE = 1.0  # logits: the order of cells in the pool moves SmolLM2 Q4_1's by up to 0.55 (test_unified_cache.py)


def _same_but_at_a_near_tie(model, prompt, together, alone) -> None:
    """`together` is `alone`, or leaves it where the two tokens' logits alone are closer than NEAR_TIE: the order of a
    stream's cells in the pool the slots share rounds its logits (DESIGN §8, "One pool"), as llama-server's do."""
    n = next((i for i, (a, b) in enumerate(zip(together, alone)) if a != b), None)
    if n is None:
        assert len(together) == len(alone)
        return
    with Context(model, n_ctx=512) as ctx:
        ctx.decode(prompt + alone[:n], 0)
        row = ctx.logits(-1)
        assert abs(row[alone[n]] - row[together[n]]) < NEAR_TIE, f"token {n}: {together[n]} beside others"


def _run_together(pool, engine, gens, slots) -> tuple[list[list[int | None]], int]:
    """Step the generations together as the scheduler does (their rows decoded in the shared batch, then one step
    each) until all end: (their tokens, the ticks); asserts ONE target decode per tick."""
    for gen in gens:
        gen.shared = pool
    events = [iter(g) for g in gens]
    pool.begin(list(zip(slots, gens, strict=True)))
    together: list[list[int | None]] = [[next(e).token] for e in events]
    pool.end(list(zip(slots, gens, strict=True)))
    parent, live, ticks = engine.target.ctx, set(range(len(gens))), 0
    while live:
        streams = [(slots[i], gens[i]) for i in sorted(live)]
        before = parent.decodes
        pool.begin(streams)
        ticks += 1
        for i in sorted(live):
            while True:  # one step: its events until the step's last
                event = next(events[i])
                together[i].append(event.token)
                if event.finish_reason is not None:
                    live.discard(i)
                    assert next(events[i], None) is None
                    break
                if gens[i].pending == 0:
                    break
        assert parent.decodes == before + 1  # the tick's one decode of the target
        pool.end(streams)
    return together, ticks


@pytest.fixture(scope="module")
def same_engine(tiny_models):
    """The tiny target with an identical draft (every greedy draft is the target's token), three sequences."""
    with Engine.load(tiny_models.target, tiny_models.draft_same, n_ctx=256, n_seq=3) as engine:
        yield engine


def test_the_draft_model_drafts_for_streams_beside_others_and_they_keep_their_greedy_text(same_engine):
    """Where the draft model is predicted to pay in a shared batch, it drafts for every stream together (its own context
    with a sequence per slot, one batch per drafted token) and each step verifies its stream's drafts in the shared
    batch: the greedy text is the stream's text alone, the drafts were accepted, the target decoded once a tick."""
    engine = same_engine
    pool = SlotPool(engine, 3)
    pool.costs, pool.draft_costs = FixedCosts(), FixedCosts(0.001, 0.0001)
    greedy, spec = SamplingParams(temperature=0), SpeculativeParams(draft_max=4, adaptive=False)

    def start(prompt, slot):
        return engine.generate(prompt, sampling=greedy, spec=spec, max_tokens=30, target=slot.target)

    alone = []
    for prompt in PROMPTS[:3]:
        slot = pool.acquire(prompt)
        alone.append([e.token for e in start(prompt, slot)])
        pool.release(slot)
    slots = [pool.acquire(p) for p in PROMPTS[:3]]
    gens = [start(p, s) for p, s in zip(PROMPTS, slots, strict=False)]
    draft_decodes = pool._drafts.decodes
    together, ticks = _run_together(pool, engine, gens, slots)
    assert together == alone
    assert all(g.stats.drafted > 0 for g in gens) and sum(g.stats.accepted for g in gens) > 0
    assert ticks < 30  # drafts accepted: fewer ticks than tokens
    assert pool._drafts.decodes - draft_decodes <= ticks * 4  # a catch-up and 3 drafted tokens a tick, for all
    for slot in slots:
        slot.target.check()
        slot.draft.check()
        pool.release(slot)


def test_sampled_drafts_beside_others_carry_the_law_they_were_drawn_from(same_engine):
    """At T > 0 (no seed: which streams draft depends on timings) each model draft is verified by p/q against the law
    the stream drew it from: with an identical draft the laws agree and nearly every draft is accepted."""
    engine = same_engine
    pool = SlotPool(engine, 3)
    pool.costs, pool.draft_costs = FixedCosts(), FixedCosts(0.001, 0.0001)
    sampling, spec = SamplingParams(temperature=0.8), SpeculativeParams(draft_max=4, adaptive=False)
    slots = [pool.acquire(p) for p in PROMPTS[:3]]
    gens = [
        engine.generate(p, sampling=sampling, spec=spec, max_tokens=30, target=s.target)
        for p, s in zip(PROMPTS, slots, strict=False)
    ]
    _run_together(pool, engine, gens, slots)
    drafted, accepted = sum(g.stats.drafted for g in gens), sum(g.stats.accepted for g in gens)
    assert drafted > 20 and accepted >= 0.8 * drafted, (drafted, accepted)
    for slot in slots:
        slot.target.check()
        slot.draft.check()
        pool.release(slot)


def test_the_draft_model_is_probed_beside_others_while_its_acceptance_is_unknown(same_engine):
    """Where the costs say the model does not pay at the prior's acceptance, it drafts PROBE_DRAFTS for each stream
    anyway while there is too little evidence to judge it — at the first tick, then one in PROBE_EVERY (a cold
    server whose first requests come together would otherwise never learn it, or only after their first answers):
    the greedy texts stay the texts alone."""
    from localspec.core.slots import PROBE_DRAFTS, PROBE_EVERY

    engine = same_engine
    pool = SlotPool(engine, 2)
    pool.costs, pool.draft_costs = FixedCosts(0.004, 0.005), FixedCosts(0.004, 0.005)  # the model does not pay
    greedy, spec = SamplingParams(temperature=0), SpeculativeParams(draft_max=4, adaptive=False)
    n = PROBE_EVERY + 6  # one probe (its drafts accepted: four tokens a stream in that tick)

    def start(prompt, slot):
        return engine.generate(prompt, sampling=greedy, spec=spec, max_tokens=n, target=slot.target)

    alone = []
    for prompt in PROMPTS[:2]:
        slot = pool.acquire(prompt)
        alone.append([e.token for e in start(prompt, slot)])
        pool.release(slot)
    engine.use_drafter(engine.drafter)  # a fresh policy: nothing measured alone (the first requests came together)
    slots = [pool.acquire(p) for p in PROMPTS[:2]]
    gens = [start(p, s) for p, s in zip(PROMPTS, slots, strict=False)]
    together, _ = _run_together(pool, engine, gens, slots)
    assert together == alone
    assert [g.stats.drafted for g in gens] == [PROBE_DRAFTS, PROBE_DRAFTS]  # one probe: then it is measured
    for gen in gens:  # the probe was the first tick: the prompt's token, then the probe's drafts
        assert gen.from_draft[: 1 + PROBE_DRAFTS] == [False] + [True] * PROBE_DRAFTS
    assert pool.model_alpha.seen >= 2 * PROBE_DRAFTS - 1
    for slot in slots:
        pool.release(slot)


def test_drafting_beside_others_stops_where_its_ticks_measure_slower_than_plain_ones(same_engine):
    """The plan's costs and acceptances are estimates; the ticks' own tokens per second are what happened: while the
    recent drafting ticks of n streams are slower than the plain ones, the plan is overruled (but for one tick in
    RECHECK_EVERY, which keeps the drafting figure current)."""
    from collections import deque

    from localspec.core.batchdraft import NONE, StreamDraft
    from localspec.core.slots import RECHECK_EVERY

    pool = SlotPool(same_engine, 2)
    drafts = [StreamDraft(2), NONE]
    pool._ticks = 1
    assert pool._checked(2, drafts) == drafts  # nothing measured yet
    pool._rates[(2, False)] = deque([100.0] * 4)
    pool._rates[(2, True)] = deque([60.0] * 4)
    assert pool._checked(2, drafts) == [NONE, NONE]
    pool._ticks = RECHECK_EVERY
    assert pool._checked(2, drafts) == drafts  # the recheck
    pool._ticks = 1
    pool._rates[(2, True)] = deque([140.0] * 4)
    assert pool._checked(2, drafts) == drafts
    assert pool._checked(3, drafts) == drafts  # three streams: nothing measured of them


def _until_all_end(pool, gens, slots, events):
    """Step `gens` (each in its slot, `events` their iterators) in shared ticks until all end, each slot given back as
    its stream ends, as the scheduler does. Returns each stream's tokens from here on."""
    live = set(range(len(gens)))
    tokens: list[list[int]] = [[] for _ in gens]
    while live:
        streams = [(slots[i], gens[i]) for i in sorted(live)]
        pool.begin(streams)
        for i in sorted(live, key=lambda i: not slots[i].view.pending):
            event = next(events[i])
            if event.token is not None:
                tokens[i].append(event.token)
            if event.finish_reason is not None:
                assert next(events[i], None) is None  # the generation is over (its caches checked)
                live.discard(i)
                pool.release(slots[i])
        pool.end(streams)
    return tokens


def test_a_stream_that_runs_out_of_the_shared_pool_ends_and_the_other_goes_on(tiny_models):
    """Two slots share one pool of 256 cells: the long answer grows into the free room until none is left, then ends
    ("length", one line saying the slots' pool is full and what to change), its cache consistent; the other, beside
    it, gets the cells it frees and answers exactly as alone."""
    with Engine.load(tiny_models.target, None, n_ctx=256, n_seq=2, drafter="none") as engine:
        pool = SlotPool(engine, 2)
        greedy = SamplingParams(temperature=0)
        long_prompt, short_prompt = [1, 5, 9, 13, 2, 7, 3, 4, 8, 6], [1, *(7 + i % 60 for i in range(149))]
        alone = _alone(engine, pool, short_prompt, 60)
        for slot in pool.slots:
            slot.target.rollback_to(0)
        slots = [pool.acquire(long_prompt), pool.acquire(short_prompt)]
        gens = [
            engine.generate(long_prompt, sampling=greedy, max_tokens=400, target=slots[0].target),
            engine.generate(short_prompt, sampling=greedy, max_tokens=60, target=slots[1].target),
        ]
        events = [iter(gen) for gen in gens]
        head_start = [next(events[0]).token for _ in range(20)]  # the long answer alone first
        for gen in gens:
            gen.shared = pool
        tokens = _until_all_end(pool, gens, slots, events)
        long, short = gens
        assert long.finish_reason == "length" and len(long.tokens) < 400 and long.tokens == head_start + tokens[0]
        assert long.notices == [
            "the answer was cut short: the slots' shared KV pool is full (256 cells for 2 slots): raise --n-ctx or "
            "lower --parallel"
        ]
        assert short.finish_reason == "length" and tokens[1] == alone
        for slot in slots:
            slot.target.check()


def test_a_prompt_that_does_not_fit_beside_the_running_streams_is_refused(tiny_models):
    """A prompt longer than the room the busy slots leave: one line, nothing decoded, the other slot untouched."""
    with Engine.load(tiny_models.target, None, n_ctx=256, n_seq=2, drafter="none") as engine:
        pool = SlotPool(engine, 2)
        busy = pool.acquire([1, 2])
        busy.target.sync([3 + i % 50 for i in range(200)])
        slot = pool.acquire([1])
        prompt = [4 + i % 50 for i in range(80)]
        gen = engine.generate(prompt, sampling=SamplingParams(temperature=0), max_tokens=4, target=slot.target)
        with pytest.raises(NoRoomError, match=r"the slots' shared KV pool is full \(256 cells for 2 slots\)"):
            list(gen)
        assert busy.target.n_past == 200 and slot.target.n_past == 0
        busy.target.check()
        slot.target.check()


def test_idle_slots_give_their_cells_to_the_prompt_cache_and_a_prompt_coming_back_is_restored(tiny_models):
    """A pool of 256 cells and two slots: a prompt too long for the cells left frees the idle slot's (its state kept
    in the prompt cache), and when the first prompt comes back its state is restored — making room the same way —
    and answers as it did."""
    with Engine.load(tiny_models.target, None, n_ctx=256, n_seq=2, drafter="none", cache_ram=2**30) as engine:
        pool = SlotPool(engine, 2)
        prompt_a, prompt_b = [1, *(5 + i % 40 for i in range(99))], [3, *(50 + i % 30 for i in range(199))]

        def answer(prompt):
            slot = pool.acquire(prompt)
            restored = slot.target.n_restored
            gen = engine.generate(prompt, sampling=SamplingParams(temperature=0), max_tokens=8, target=slot.target)
            tokens = [event.token for event in gen]
            pool.release(slot)
            return tokens, slot.target.n_restored - restored

        first, _ = answer(prompt_a)
        answer(prompt_b)  # 199 cells to read, 149 free: the idle slot's 107 go to the prompt cache
        assert sum(slot.target.n_past for slot in pool.slots) <= 256
        again, restored = answer(prompt_a)
        assert restored == len(prompt_a) - 1 and again == first
        for slot in pool.slots:
            slot.target.check()


def test_the_chat_window_drops_a_span_on_a_slot_and_leaves_the_other_slots_cells(tiny_models):
    """Context shifting (`KVSequence.drop`, the chat's long-chat window) on a slot of the pool: its tokens and next
    logits are those of the same drop on a context of its own (within the pool's rounding, DESIGN §8), and the other
    slot's cells stay as they were."""
    with Engine.load(tiny_models.target, None, n_ctx=256, n_seq=2, drafter="none") as engine:
        pool = SlotPool(engine, 2)
        mine, other = pool.acquire([1]), pool.acquire([3])
        tokens = [1, *(5 + i % 40 for i in range(99))]
        other.target.sync([3, *(7 + i % 30 for i in range(59))])
        mine.target.sync(tokens)
        with Context(engine.target_model, n_ctx=256) as ctx:
            alone = KVSequence(ctx, rollback="seq_rm")
            alone.sync(tokens)
            assert alone.drop(10, 30)
            alone.append([9])
            expected = ctx.logits(-1).copy()
        assert mine.target.drop(10, 30)
        mine.target.append([9])
        assert mine.target.tokens == alone.tokens
        assert np.abs(mine.view.logits(-1) - expected).max() < 0.01
        assert other.target.n_past == 60 and other.view.pos_range() == (0, 59)
        for slot in (mine, other):
            slot.target.check()
            pool.release(slot)
