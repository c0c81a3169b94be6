"""Each stream of a shared batch drafts with its own drafter (issue 65): two drafters side by side, and the streams
that drafted only alone before — under a grammar, seeded at T > 0, with a draft of another vocabulary — drafting in
the shared batch, each with the text it gets alone (real llama.cpp; the tiny pair, and SmolLM2 for a JSON schema)."""

from __future__ import annotations

import json

import pytest
from support import PROMPT, assert_identical
from support.fixedcosts import FixedCosts

from localspec.core.draftread import ALIGN, WIDTH, aligned
from localspec.core.engine import Engine
from localspec.core.grammar import Grammar
from localspec.core.params import SpeculativeParams
from localspec.core.sampling import SamplingParams
from localspec.core.slots import SlotPool

PROMPTS = [[1, 5, 9, 13, 2], [1, 7, 7, 3], [1, 4, 8, 15, 16, 23, 42]]
FIXED_K = SpeculativeParams(draft_max=4, adaptive=False)
GREEDY = SamplingParams(temperature=0)


def generate(engine, pool, slot, prompt, kind, **options):
    """A generation in `slot` with the slot's own drafter of `kind` (as the server starts one)."""
    drafter, policy = pool.drafting(slot, kind)
    options = {"sampling": GREEDY, "spec": FIXED_K, "max_tokens": 24, **options}
    return engine.generate(prompt, target=slot.target, drafter=drafter, policy=policy, **options)


def alone(engine, pool, prompt, kind, **options) -> list[int]:
    slot = pool.acquire(prompt)
    try:
        gen = generate(engine, pool, slot, prompt, kind, **options)
        list(gen)
        return gen.tokens
    finally:
        pool.release(slot)


def together(engine, pool, gens, slots) -> list[list[int]]:
    """Step the generations as the scheduler does — each tick their rows in the shared batch, then one step each —
    until all end; asserts ONE target decode per tick once every prompt is read."""
    for gen in gens:
        gen.shared = pool
    events = [iter(g) for g in gens]
    streams = list(zip(slots, gens, strict=True))
    pool.begin(streams)
    for gen, e in zip(gens, events, strict=True):
        next(e)  # each reads its prompt and takes its first step
        while gen.pending:
            next(e)
    pool.end(streams)
    parent, live = engine.target.ctx, set(range(len(gens)))
    while live:
        streams = [(slots[i], gens[i]) for i in sorted(live)]
        before = parent.decodes
        pool.begin(streams)
        for i in sorted(live):
            while True:
                event = next(events[i])
                if event.finish_reason is not None:
                    live.discard(i)
                    break
                if gens[i].pending == 0:
                    break
        assert parent.decodes == before + 1  # the tick's one decode of the target
        pool.end(streams)
    for slot, gen in zip(slots, gens, strict=True):
        for seq in gen.caches:
            seq.check()
        pool.release(slot)
    return [gen.tokens for gen in gens]


@pytest.fixture(scope="module")
def same_engine(tiny_models):
    """The tiny target with an identical draft (every greedy draft is the target's token), three sequences."""
    with Engine.load(tiny_models.target, tiny_models.draft_same, n_ctx=256, n_seq=3) as engine:
        yield engine


def test_streams_beside_each_other_keep_their_own_drafters(same_engine):
    """Three streams, three drafters — none, the draft model, the model after n-gram copies — in one shared batch: each
    reports its own, the one with none drafted nothing, the two others drafted and had drafts accepted, and every text
    is the stream's text alone. (One stream drafting beside plain ones rarely pays on a CPU: rows of two lengths are
    two passes of the target.)"""
    engine = same_engine
    pool = SlotPool(engine, 3)
    pool.costs, pool.draft_costs = FixedCosts(), FixedCosts(0.001, 0.0001)
    kinds = ["none", "model", "model+ngram"]
    expected = [alone(engine, pool, p, k) for p, k in zip(PROMPTS, kinds, strict=True)]
    slots = [pool.acquire(p) for p in PROMPTS]
    gens = [generate(engine, pool, s, p, k) for s, p, k in zip(slots, PROMPTS, kinds, strict=True)]
    assert together(engine, pool, gens, slots) == expected
    assert [g.stats.drafter for g in gens] == kinds
    assert gens[0].stats.drafted == 0
    assert all(g.stats.drafted > 0 and g.stats.accepted > 0 for g in gens[1:])
    drafters = [pool.drafting(s, k)[0] for s, k in zip(slots, kinds, strict=True)]
    assert len({id(d) for d in drafters}) == 3 and drafters[1] is not engine.drafter  # each slot's own


def test_seeded_streams_draft_beside_others_and_the_clock_never_decides_their_text(same_engine):
    """A seed at T > 0 drafts in the shared batch too — with its own drafter and the k its own policy chooses, never
    the clock's plan: run beside each other twice, with the plan's costs told opposite things, the seeded texts are
    the same. (Alone they may differ at a draw that the last bits of a larger batch move: DESIGN §8.)"""
    engine = same_engine
    options = [{"sampling": SamplingParams(temperature=0.8, seed=s), "max_tokens": 30} for s in (1, 2, 3)]
    runs = []
    for costs in (FixedCosts(), FixedCosts(0.001, 0.010)):  # drafting pays; drafting does not
        pool = SlotPool(engine, 3)
        pool.costs = pool.draft_costs = costs
        slots = [pool.acquire(p) for p in PROMPTS]
        gens = [generate(engine, pool, s, p, "model", **o) for s, p, o in zip(slots, PROMPTS, options, strict=True)]
        runs.append(together(engine, pool, gens, slots))
        assert all(g.stats.drafted > 0 and g.stats.accepted > 0 for g in gens)
    assert runs[0] == runs[1]


def test_bridged_streams_draft_beside_others_with_their_text_alone(tiny_models):
    """A draft of another vocabulary drafts for each stream in the shared batch (through its slot's own bridge and
    draft sequence), greedy texts as alone."""
    with Engine.load(tiny_models.target, tiny_models.vocab_bpe, n_ctx=256, n_seq=2) as engine:
        assert engine.bridge is not None
        pool = SlotPool(engine, 2)
        expected = [alone(engine, pool, p, "model") for p in PROMPTS[:2]]
        slots = [pool.acquire(p) for p in PROMPTS[:2]]
        gens = [generate(engine, pool, s, p, "model") for s, p in zip(slots, PROMPTS, strict=False)]
        assert together(engine, pool, gens, slots) == expected
        assert all(g.stats.drafted > 0 for g in gens)
        assert pool.drafting(slots[0], "model")[0] is not pool.drafting(slots[1], "model")[0]


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
QUESTIONS = ["Describe one employee as JSON.", "Give me a customer record as JSON.", "A JSON person, please."]


@pytest.mark.slow
def test_streams_under_a_schema_draft_beside_each_other_with_their_text_alone(smollm2_path):
    """Three streams under a JSON schema (tools and structured outputs) with the draft model: each drafts in the
    shared batch and has drafts accepted, its grammar's forced tokens decoded with its row, and each answer is the
    greedy text alone, valid JSON."""
    with Engine.load(smollm2_path, smollm2_path, drafter="model", n_ctx=512, n_seq=3) as engine:
        pool = SlotPool(engine, 3)
        pool.costs, pool.draft_costs = FixedCosts(), FixedCosts(0.001, 0.0001)
        prompts = [
            engine.target_model.tokenize(
                f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n", parse_special=True
            )
            for q in QUESTIONS
        ]
        options = {"grammar": Grammar.json_schema(SCHEMA), "max_tokens": 40}
        expected = [alone(engine, pool, p, "model", **options) for p in prompts]
        slots = [pool.acquire(p) for p in prompts]
        gens = [generate(engine, pool, s, p, "model", **options) for s, p in zip(slots, prompts, strict=True)]
        assert together(engine, pool, gens, slots) == expected
        for gen in gens:
            assert gen.stats.accepted > 0, gen.stats
            assert set(json.loads(gen.text)) == {"name", "age"}


def test_with_shared_drafts_off_seeded_streams_draft_only_alone(same_engine):
    """The yardstick of `bench --clients --structured` (`shared_drafts` off, LOCALSPEC_SHARED_DRAFTS=off): streams
    that draft alone in the shared batch by default — here seeded at T > 0 — decode plainly beside others."""
    engine = same_engine
    pool = SlotPool(engine, 3, shared_drafts=False)
    options = [{"sampling": SamplingParams(temperature=0.8, seed=s), "max_tokens": 12} for s in (1, 2, 3)]
    slots = [pool.acquire(p) for p in PROMPTS]
    gens = [generate(engine, pool, s, p, "model", **o) for s, p, o in zip(slots, PROMPTS, options, strict=True)]
    together(engine, pool, gens, slots)
    assert [g.stats.drafted for g in gens] == [0, 0, 0]


@pytest.mark.slow
def test_the_draft_model_reads_a_long_prompts_window_in_the_shared_batch_as_alone(tiny_models):
    """Two streams after long prompts drafted by the model in the shared batch (answers long enough to pay for its
    catch-up): each slot's draft cache catches up with its window of the prompt (core/draftread.py), as the stream's
    drafter alone does, not with the whole prompt (before, the shared batch compared the cache with the whole history
    and re-read all of it); texts as alone."""
    with Engine.load(tiny_models.target, tiny_models.draft_same, n_ctx=2048, n_seq=2) as engine:
        prompts = [engine.tokenize(PROMPT * 50), engine.tokenize("a cat sat on the mat while it rained and " * 50)]
        assert min(len(p) for p in prompts) > 2 * (WIDTH + ALIGN)
        pool = SlotPool(engine, 2)
        pool.costs, pool.draft_costs = FixedCosts(), FixedCosts(0.001, 0.0001)
        expected = [alone(engine, pool, p, "model", max_tokens=160) for p in prompts]
        slots = [pool.acquire(p) for p in prompts]
        gens = [generate(engine, pool, s, p, "model", max_tokens=160) for s, p in zip(slots, prompts, strict=True)]
        drafts = [slot.draft for slot in slots]
        for prompt, tokens, alone_tokens in zip(prompts, together(engine, pool, gens, slots), expected, strict=True):
            assert_identical(tiny_models.target, prompt, alone_tokens, tokens)
        assert all(g.stats.drafted > 0 and g.stats.accepted > 0 for g in gens)
        for draft, gen, prompt in zip(drafts, gens, prompts, strict=True):
            window = aligned(prompt)
            assert window.start > 0 and draft.n_past <= len(prompt) - window.start + len(gen.tokens)
            assert draft.tokens[:WIDTH] == prompt[window.start :][:WIDTH]
