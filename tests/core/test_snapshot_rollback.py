"""A hybrid target (Qwen3.5's gated delta net + attention) drops a verify pass's rejected tail with llama.cpp's
recurrent-state snapshots (`n_rs_seq`) instead of saving its whole state before every pass.

llama.cpp keeps a snapshot after each token of a decode's batch and overwrites them with the next decode; asked to
roll back past what the last decode wrote, it restores a stale snapshot and says nothing (the second test shows
it). `KVSequence` uses a snapshot only within the last decode, at most `n_rs_seq` back, once; everything else
takes the checkpoint or re-prefill path, and a hybrid's checkpoint saves its recurrent part alone (the last test).
Each rollback is compared with a context that never held the tail, within BATCH_NOISE: the delta net's batched
(chunked) and one-token kernels differ in the last bits (2e-6 measured here), while a stale state is off by more
than 1e-3.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import run_greedy
from support.tinymodels import write_mtp_model

from localspec.core.engine import Engine
from localspec.core.kv import KVSequence
from localspec.llama.context import Context
from localspec.llama.model import Model

BATCH_NOISE = 1e-4
TOKENS = [5, 17, 29, 41, 53, 65, 77, 89, 101, 113, 125, 137, 149, 161, 173, 185]


@pytest.fixture(scope="module")
def hybrid_path(tmp_path_factory):
    return write_mtp_model(tmp_path_factory.mktemp("hybrid") / "tiny-hybrid.gguf", seed=3, output_scale=0.4)


def fresh_logits(model: Model, tokens: list[int]) -> np.ndarray:
    """The row after `tokens` in a context that only ever held them (one token at a time after the first 8)."""
    with Context(model, n_ctx=128) as ctx:
        seq = KVSequence(ctx)
        seq.append(tokens[:8], outputs=0)
        for t in tokens[8:]:
            seq.append([t], outputs=1)
        return ctx.logits(-1).copy()


def test_a_verify_pass_tail_is_dropped_with_snapshots(hybrid_path):
    with Model(hybrid_path) as model:
        with Context(model, n_ctx=128, n_rs_seq=4) as ctx:
            assert ctx.n_rs_seq == 4  # qwen35 keeps them (a mamba model's request is clamped to 0)
            seq = KVSequence(ctx)
            assert seq.mode == "snapshot"
            assert not seq.needs_checkpoint(4) and seq.needs_checkpoint(5)  # a verify pass of ≤ 4 drafts: none
            assert seq.needs_checkpoint(2, one_batch=False)  # drafted one by one: the snapshots do not reach
            seq.append(TOKENS[:8], outputs=0)
            seq.append(TOKENS[8:13], outputs=5)  # a verify pass: the last token + 4 drafts
            seq.rollback_to(10)  # 2 drafts accepted
            assert seq.n_refills == 0 and seq.n_past == 10
            seq.check()
            seq.append([TOKENS[10]], outputs=1)
            rolled = ctx.logits(-1).copy()
        assert np.abs(rolled - fresh_logits(model, TOKENS[:11])).max() < BATCH_NOISE


def test_a_rollback_past_the_last_decode_does_not_trust_a_stale_snapshot(hybrid_path):
    with Model(hybrid_path) as model:
        # llama.cpp itself: after single-token decodes it "removes" 3 tokens and hands back a stale state.
        with Context(model, n_ctx=128, n_rs_seq=4) as ctx:
            ctx.decode(TOKENS[:8], 0, outputs=0)
            for i, t in enumerate(TOKENS[8:12]):
                ctx.decode([t], 8 + i, outputs=1)
            assert ctx.remove_from(9)  # claims success
            ctx.decode([TOKENS[9]], 9, outputs=1)
            stale = ctx.logits(-1).copy()
        right = fresh_logits(model, TOKENS[:10])
        assert np.abs(stale - right).max() > 10 * BATCH_NOISE  # the hazard the guard exists for
        # KVSequence: the same rollback re-reads the prefix instead (no checkpoint was taken), and is right.
        with Context(model, n_ctx=128, n_rs_seq=4) as ctx:
            seq = KVSequence(ctx)
            seq.append(TOKENS[:8], outputs=0)
            for t in TOKENS[8:12]:
                seq.append([t], outputs=1)
            seq.rollback_to(9)
            assert seq.n_refills == 1
            seq.append([TOKENS[9]], outputs=1)
            assert np.abs(ctx.logits(-1) - right).max() < BATCH_NOISE
            # Single use: a second rollback inside the same decode is refused by llama.cpp; it re-reads too.
            seq.append(TOKENS[10:14], outputs=1)
            seq.rollback_to(12)
            seq.rollback_to(11)
            assert seq.n_refills == 2
            seq.append([TOKENS[11]], outputs=1)
            assert np.abs(ctx.logits(-1) - fresh_logits(model, TOKENS[:12])).max() < BATCH_NOISE


def test_an_interrupted_decode_is_repaired_without_a_snapshot(hybrid_path):
    """`repair` after a decode whose bookkeeping never ran: the cache holds more than `tokens`, and removing the
    difference would restore a snapshot that decode did not write."""
    with Model(hybrid_path) as model, Context(model, n_ctx=128, n_rs_seq=4) as ctx:
        seq = KVSequence(ctx)
        seq.append(TOKENS[:8], outputs=0)
        ctx.decode(TOKENS[8:10], 8, outputs=1)  # as if Ctrl+C landed before `tokens` was extended
        seq.repair()
        assert seq.n_refills == 1
        seq.check()
        seq.append([TOKENS[8]], outputs=1)
        assert np.abs(ctx.logits(-1) - fresh_logits(model, TOKENS[:9])).max() < BATCH_NOISE


@pytest.mark.parametrize("rollback", ["auto", "checkpoint"])
def test_speculation_on_a_hybrid_target_matches_plain(hybrid_path, monkeypatch, rollback):
    """The MTP head drafting for its hybrid target: greedy text equals plain decoding both ways. With snapshots
    ("auto") no pass saves the target's state (before: one whole-state copy, attention cache included, per
    speculative step), only the prompt's anchor is kept; forced to checkpoints, each pass saves the recurrent part
    alone."""
    prompt = TOKENS[:6]
    with Engine.load(hybrid_path, None, drafter="none", n_ctx=256, n_threads=1) as engine:
        plain = run_greedy(engine, prompt, 0, n=40)
    saved = []
    real = Context.save_state
    monkeypatch.setattr(Context, "save_state", lambda self, **kw: saved.append(kw) or real(self, **kw))
    with Engine.load(hybrid_path, None, drafter="mtp", n_ctx=256, n_threads=1, rollback=rollback) as engine:
        assert engine.target.mode == ("snapshot" if rollback == "auto" else "checkpoint")
        saved.clear()  # the load's probe saved once
        spec = run_greedy(engine, prompt, 3, n=40)
        engine.check_invariants()
    assert spec.stats.drafted > 0 and spec.stats.accepted < spec.stats.drafted  # both branches ran
    assert spec.tokens == plain.tokens
    assert saved == [{"partial": True}] * (1 if rollback == "auto" else len(saved))  # auto: the prompt's anchor alone
    assert rollback == "auto" or len(saved) > 1


@pytest.mark.slow
def test_a_hybrid_checkpoint_saves_the_recurrent_part_alone(hybrid_path):
    """Without snapshots (a hybrid draft, or k past them) the checkpoint holds the recurrent state only — the same
    size at 8 and at 40 tokens, where the whole state grows with the attention cache — and restoring it, then
    cutting the attention tail, gives the state a context that never held the tail has."""
    tokens = (TOKENS * 3)[:40]
    with Model(hybrid_path) as model:
        with Context(model, n_ctx=128) as ctx:
            seq = KVSequence(ctx)
            assert seq.mode == "checkpoint" and seq.needs_checkpoint(1, one_batch=False)
            seq.append(tokens[:8], outputs=0)
            seq.checkpoint()
            small = len(seq._checkpoint.state)
            seq.append(tokens[8:40], outputs=0)
            seq.checkpoint()
            assert len(seq._checkpoint.state) == small < len(ctx.save_state())  # the whole state: 40 tokens' KV
            for t in [3, 7, 11]:  # drafted one by one
                seq.append([t], outputs=1)
            seq.rollback_to(41)  # one accepted
            assert seq.n_refills == 0 and seq.tokens == [*tokens, 3]
            seq.check()
            seq.append([9], outputs=1)
            restored = ctx.logits(-1).copy()
        assert np.abs(restored - fresh_logits(model, [*tokens, 3, 9])).max() < BATCH_NOISE
        assert np.abs(restored - fresh_logits(model, [*tokens, 7, 9])).max() > 10 * BATCH_NOISE  # another history


@pytest.mark.parametrize("which", ["hybrid", "recurrent"])
def test_the_next_turn_restores_the_last_prompt_instead_of_rereading_the_chat(hybrid_path, tiny_models, which):
    """A chat's next prompt keeps the last prompt and rewrites what came after it (a template that drops the
    reply's reasoning). Memory that cannot drop an arbitrary tail restores the state saved after the last prompt
    (`KVSequence.anchor`) and reads only what follows; before, it re-read the whole conversation. The second turn's
    greedy text equals a fresh engine's on the same prompt."""
    path = hybrid_path if which == "hybrid" else tiny_models.recurrent
    draft, drafter = (None, "mtp") if which == "hybrid" else (path, "model")  # a recurrent draft anchors too
    first = TOKENS[:12]
    second = [*first, 7, 19, 31, 43]  # not what the first turn generated
    with Engine.load(path, draft, drafter=drafter, n_ctx=256, n_threads=1) as engine:
        assert engine.target.mode == ("snapshot" if which == "hybrid" else "checkpoint")
        run_greedy(engine, first, 3, n=24)
        again = run_greedy(engine, second, 3, n=24)
        assert [seq.n_refills for seq in engine.caches] == [0] * len(engine.caches)  # before: each re-read it all
        assert again.stats.prefill_decoded <= len(second) - len(first) + 1
        engine.check_invariants()
    with Engine.load(path, draft, drafter=drafter, n_ctx=256, n_threads=1) as engine:
        fresh = run_greedy(engine, second, 3, n=24)
    assert again.tokens == fresh.tokens
