"""The prompt cache in RAM (core/promptcache.py, issue 56): a sequence that gives its cells to another prompt saves
them, and the prompt coming back is restored, not read again — on real llama.cpp for a plain target, the draft, a
recurrent (mamba) and a hybrid (gated delta net + attention) memory. A restored state must answer as reading the
prompt does: the next row's logits within batch noise (a restored state holds cells decoded in other batch shapes),
and the greedy answer the same. The budget and the rules of reuse as pure logic."""

from __future__ import annotations

import numpy as np
import pytest
from support import GREEDY, run_greedy
from support.tinymodels import write_mtp_model

from localspec.core.engine import Engine
from localspec.core.kv import KVSequence
from localspec.core.params import SpeculativeParams
from localspec.core.promptcache import GAIN_MIN, PromptCache
from localspec.llama.context import Context
from localspec.llama.model import Model

BATCH_NOISE = 1e-3
A = [5 + (7 * i) % 190 for i in range(150)]  # two long prompts that share a short start
B = A[:10] + [9 + (11 * i) % 180 for i in range(160)]


def test_the_budget_drops_the_least_recently_used_and_covered_prefixes():
    cache = PromptCache(budget=300)
    cache.save("t", A, b"x" * 100, trims=True)
    cache.save("t", B, b"y" * 100, trims=True)
    assert cache.best("t", A + [1], held=0, trims=True)[1] == len(A)  # A used: B is now the older
    cache.save("t", list(range(100)), b"z" * 150, trims=True)  # over budget: B goes, not A
    assert cache.best("t", B, held=0, trims=True) is None  # evicted (and A shares too little with it)
    assert cache.best("t", A, held=0, trims=True)[1] == len(A) and cache.used == 250
    cache.save("t", A + [1, 2, 3], b"w" * 100, trims=True)  # A's entry is a prefix of this: covered, replaced
    assert len(cache) == 2 and cache.used == 250
    assert cache.best("d", A, held=0, trims=True) is None  # another namespace's states are not this one's
    cache.save("t", A[:10], b"v", trims=True)  # too short to be worth keeping
    cache.save("t", A, b"u" * 400, trims=True)  # larger than the whole budget
    assert len(cache) == 2


def test_a_memory_that_cannot_trim_restores_only_whole_prefixes():
    cache = PromptCache(budget=10_000)
    cache.save("t", A, b"s" * 10, trims=False)
    assert cache.best("t", A[:120] + [3] * 40, held=0, trims=False) is None  # A's state holds tokens past these
    assert cache.best("t", A[:120] + [3] * 40, held=0, trims=True)[1] == 120
    assert cache.best("t", A + [3] * 40, held=0, trims=False)[1] == len(A)
    assert cache.best("t", A + [3], held=len(A) - GAIN_MIN + 1, trims=True) is None  # spares too little


def _next_row(seq: KVSequence, prompt: list[int]) -> np.ndarray:
    """Read `prompt` as a generation does (all but its last token, the anchor, then the last with its row)."""
    seq.sync(prompt[:-1])
    seq.anchor()
    seq.append(prompt[-1:], outputs=1)
    return seq.ctx.logits(-1).copy()


@pytest.mark.parametrize("which", ["target", "recurrent", "hybrid"])
def test_a_prompt_that_comes_back_is_restored_and_answers_as_read(tiny_models, tmp_path, which):
    path = {"target": tiny_models.target, "recurrent": tiny_models.recurrent}.get(which) or write_mtp_model(
        tmp_path / "hybrid.gguf", seed=3, output_scale=0.4
    )
    with Model(path) as model, Context(model, n_ctx=512) as ctx, Context(model, n_ctx=512) as fresh_ctx:
        seq, fresh = KVSequence(ctx), KVSequence(fresh_ctx)
        seq.use_cache(PromptCache(budget=2**30), "target")
        first = _next_row(seq, A)
        _next_row(seq, B)  # B takes the cells: A is saved first
        decoded = seq.n_decoded
        again = _next_row(seq, A)  # restored: only its last token is decoded again
        assert seq.n_restored == len(A) - 1 and seq.n_decoded - decoded == 1
        seq.check()
        reread = _next_row(fresh, A)
        assert np.abs(again - reread).max() < BATCH_NOISE and np.abs(again - first).max() < BATCH_NOISE
        if which == "target":  # plain KV restores a state longer than the prompt and trims it
            _next_row(seq, B)
            before = seq.n_restored
            shorter = _next_row(seq, A[:100])
            assert seq.n_restored - before == 99
            assert np.abs(shorter - _next_row(fresh, A[:100])).max() < BATCH_NOISE


def test_alternating_prompts_give_the_same_greedy_answers_restored(tiny_models):
    """Two long prompts taking turns on a pair (target and draft both cached): each turn after the first restores
    both models' states, and every answer is the one a fresh engine gives."""
    spec = SpeculativeParams(draft_max=4, adaptive=False)
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=1024, cache_ram=2**30) as engine:
        answers, restored, drafted = {}, [], []
        for turn in range(4):
            prompt = A if turn % 2 == 0 else B
            gen = engine.generate(prompt, sampling=GREEDY, spec=spec, max_tokens=16)
            tokens = [e.token for e in gen if e.token is not None]
            answers.setdefault(turn % 2, tokens)
            assert tokens == answers[turn % 2], turn
            restored.append(gen.stats.prefill_restored)
            drafted.append(gen.stats.draft_prefill_decoded)
        draft = engine.drafter.caches[0]
        assert restored[2:] == [len(A) - 1, len(B) - 1] and restored[:2] == [0, 0]
        assert draft.n_restored > 0 and max(drafted[2:]) < GAIN_MIN  # the draft restored too
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=1024, cache_ram=0) as fresh:
        assert run_greedy(fresh, A, k=4, n=16).tokens == answers[0]
        assert fresh.prompt_cache.budget == 0 and fresh.target.n_restored == 0


def test_two_chats_taken_in_turns_restore_instead_of_reading_again(tiny_models):
    """What the chat app does on F4 (another saved chat) and on a branch: a second conversation takes the caches, and
    going back restores the first's state — the next turn reads its new message, not the whole chat again."""
    from localspec.core.session import ChatSession

    words = " ".join(["the man said that the water was hot and"] * 12)
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=1024, cache_ram=2**30) as engine:
        first = ChatSession(engine, system=f"first: {words}")
        second = ChatSession(engine, system=f"second: {words[::-1]}")
        for gen in (first.send("hello", max_tokens=4), second.send("hello", max_tokens=4)):
            list(gen)
        back = first.send("and then", max_tokens=4)
        list(back)
        assert back.stats.prefill_restored > 100 and back.stats.prefill_decoded < 32, back.stats
