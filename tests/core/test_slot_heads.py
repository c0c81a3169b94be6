"""A draft head drafts for every slot (issue 65): the target's MTP head and a Gemma 4 assistant each keep one
context with a sequence per slot, and each slot's stream drafts with its own drafter over its own sequence, fed its
own rows of the shared batch — greedy texts as alone, drafts accepted for every stream (real llama.cpp: the tiny
Gemma 4 pair, a tiny all-attention MTP model)."""

from __future__ import annotations

import numpy as np
import pytest
from core.test_slot_drafters import alone, generate, together
from support.tinyglm import write_glm_mtp_model

from localspec.core.engine import Engine
from localspec.core.kv import common_prefix
from localspec.core.slots import SlotPool
from localspec.llama import assistant
from localspec.llama.context import Context
from localspec.llama.model import Model

TEXTS = [
    "the man said what the people who came to the house were there",
    "a cat sat on the mat and the dog was not there",
    "what the man said was that the people came",
]


def test_the_assistant_reads_each_sequence_of_a_shared_target(tiny_gemma4):
    """The native part, measured: an assistant made with the target's sequences drafts for sequence 1 at that
    sequence's next position exactly what it drafts over a target holding that sequence alone; the hidden rows of a
    shared batch are each sequence's own, in batch order."""
    with Model(tiny_gemma4.target) as target_model, Model(tiny_gemma4.assistant) as model:
        prompts = [target_model.tokenize(text, add_special=True) for text in TEXTS[:2]]

        def draft(target: Context, ctx: assistant.AssistantContext, seq: int, tokens: list[int]):
            assistant.emit_output_hidden(target)
            n = len(tokens) - 1
            target.decode(tokens[:-1], 0, outputs=1, seq=seq)
            row = assistant.output_hidden(target)[-1:]
            ctx.stage(row, n)
            ctx.decode([tokens[-1]], n, outputs=1, seq=seq)
            return row, ctx.logits(-1).copy()

        with (
            Context(target_model, n_ctx=64, swa_full=True, n_threads=1) as alone_ctx,
            assistant.AssistantContext(model, alone_ctx, n_threads=1) as ctx,
        ):
            expected = draft(alone_ctx, ctx, 0, prompts[1])
        # (Made after the target's decodes, the assistant's context would empty the target's cache: made first.)
        with Context(target_model, n_ctx=64, swa_full=True, n_threads=1, n_seq=2) as shared:
            with assistant.AssistantContext(model, shared, n_threads=1) as ctx:
                shared.decode(prompts[0][:-1], 0, outputs=1, seq=0)
                got = draft(shared, ctx, 1, prompts[1])
            assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
            assert shared.pos_range(0) == (0, len(prompts[0]) - 2)  # sequence 0 untouched
            shared.decode_rows([(seq, p[-1], len(p) - 1) for seq, p in enumerate(prompts)])
            rows = assistant.output_hidden(shared)
            assert rows.shape == (2, target_model.info.n_embd) and not np.array_equal(rows[0], rows[1])


def beside_each_other(engine: Engine, kind: str) -> tuple[SlotPool, list]:
    """TEXTS alone, then as three streams drafting with `kind` in one shared batch: the same texts, each stream's
    drafter reported and its drafts drafted and accepted. Returns the pool and its slots."""
    pool = SlotPool(engine, 3)
    prompts = [engine.tokenize(text) for text in TEXTS]
    expected = [alone(engine, pool, p, kind, max_tokens=40) for p in prompts]
    slots = [pool.acquire(p) for p in prompts]
    gens = [generate(engine, pool, s, p, kind, max_tokens=40) for s, p in zip(slots, prompts, strict=True)]
    assert together(engine, pool, gens, slots) == expected
    assert all(g.stats.drafter == kind and g.stats.drafted > 0 and g.stats.accepted > 0 for g in gens)
    return pool, slots


@pytest.fixture(scope="module")
def gemma4_slots(tiny_gemma4):
    with Engine.load(tiny_gemma4.target, tiny_gemma4.assistant, n_ctx=256, n_seq=3, n_threads=1) as engine:
        yield engine


def test_assistant_streams_draft_beside_each_other_with_their_text_alone(gemma4_slots):
    """Three streams drafting with the assistant in one shared batch, each over its own sequence: the texts of
    each alone (past the sliding window), drafts accepted for each, every cache consistent."""
    engine = gemma4_slots
    assert engine.drafter.kind == "assistant"
    pool, slots = beside_each_other(engine, "assistant")
    drafters = {id(pool.drafting(s, "assistant")[0]) for s in slots}
    assert len(drafters) == 3 and id(engine.drafter) not in drafters


@pytest.fixture(scope="module")
def mtp_slots(tmp_path_factory):
    """A tiny all-attention target with one MTP block (support.tinyglm), three sequences."""
    path = write_glm_mtp_model(tmp_path_factory.mktemp("glm") / "tiny-glm-mtp.gguf", seed=1, output_scale=0.4)
    with Engine.load(path, None, drafter="mtp", n_ctx=256, n_seq=3, n_threads=1) as engine:
        yield engine


def test_mtp_streams_draft_beside_each_other_with_their_text_alone(mtp_slots):
    """Three streams drafting with the target's MTP head in one shared batch, each over its own sequence of the
    head's one context and fed its own rows of the batch: the texts of each alone, drafts accepted for each, every
    cache consistent (the heads' too)."""
    engine = mtp_slots
    assert engine.drafter.kind == "mtp" and engine.target.mode == "seq_rm"
    # The slots are reused: each prompt shares its first token with what its slot held, where the head lacks the
    # target's row; the prompt's read starts one token earlier and brings it (no decode of the head's own in a tick).
    pool, slots = beside_each_other(engine, "mtp")
    heads = [pool.drafting(s, "mtp")[0] for s in slots]
    assert len({id(h) for h in heads}) == 3 and engine.drafter not in heads
    assert len({h.head.ctx.parent for h in heads}) == 1  # one head context, a sequence per slot


def test_a_prompt_on_a_reused_slot_is_read_once(mtp_slots):
    """A new prompt on a slot whose last prompt shared only its first token: the head lacks the target's row there,
    so the read starts one token earlier and brings it — one more token than on an empty slot, where the head used
    to have the whole prompt read again."""
    engine = mtp_slots
    prompts = [engine.tokenize(text) for text in TEXTS[:2]]
    decoded = []
    for reused in (False, True):
        pool = SlotPool(engine, 3)  # empty slots
        if reused:
            alone(engine, pool, prompts[0], "mtp", max_tokens=8)
        slot = pool.acquire(prompts[1])
        assert common_prefix(slot.target.tokens, prompts[1]) == (1 if reused else 0)
        before = slot.target.n_decoded
        gen = generate(engine, pool, slot, prompts[1], "mtp", max_tokens=8)
        list(gen)
        assert gen.stats.drafted > 0
        decoded.append(slot.target.n_decoded - before)
        pool.release(slot)
    assert decoded[1] == decoded[0]  # the first token held, one read again: as many as on an empty slot
