"""The engine on the real llama.cpp with tiny GGUF models: greedy speculation equals plain greedy,
rollback/checkpoint/refill equal a fresh context, cancellation leaves both caches consistent.

Batched and one-at-a-time logits may differ in the last bits (DESIGN §7), so a divergence between
two greedy runs is allowed only at a near-tie of the reference model (top-2 logit gap < NEAR_TIE);
such divergences are counted and reported, never hidden.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import GREEDY, PROMPT, assert_identical, run_greedy
from support.fakellm import FakeModel, LogitTable, TableContext, fake_engine

from localspec.core.engine import Engine
from localspec.core.kv import KVSequence
from localspec.core.laws import ArrayLaw
from localspec.core.params import SpeculativeParams
from localspec.core.sampling import SamplingParams, penalty_window, sampling_law
from localspec.core.step import TargetArgmax, TargetLaws
from localspec.errors import ContextError
from localspec.llama.context import Context
from localspec.llama.model import Model

FIXED4 = SpeculativeParams(draft_max=4, adaptive=False)


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.slow
def test_greedy_speculative_equals_plain(tiny_models, k, record_property):
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512) as engine:
        prompt = engine.tokenize(PROMPT)
        plain = run_greedy(engine, prompt, k=0)
        spec = run_greedy(engine, prompt, k=k)
    assert spec.stats.drafted > 0 and 0 < spec.stats.accepted < spec.stats.drafted  # partial acceptance
    assert spec.stats.target_passes < plain.stats.target_passes
    assert_identical(tiny_models.target, prompt, plain.tokens, spec.tokens)
    assert any(spec.from_draft) and not any(plain.from_draft)


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.slow
def test_greedy_with_the_in_graph_sampler_equals_plain_on_the_host(tiny_models, k):
    """The device path (llama.cpp's greedy sampler in the graph, read back as a token id) drafts and verifies
    the same tokens as the host argmax: speculative on the device equals plain on the host."""
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512, device_sampling="off") as host:
        prompt = host.tokenize(PROMPT)
        plain = run_greedy(host, prompt, k=0)
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512, device_sampling="on") as device:
        assert all(seq.ctx.device_greedy for seq in device.caches)
        spec = run_greedy(device, prompt, k=k)
    assert spec.stats.drafted > 0 and 0 < spec.stats.accepted < spec.stats.drafted
    assert_identical(tiny_models.target, prompt, plain.tokens, spec.tokens)


@pytest.mark.parametrize(
    ("choice", "greedy", "topk"), [("off", False, False), ("auto", False, False), ("on", True, True)]
)
@pytest.mark.slow
def test_which_sampling_runs_in_the_graph(tiny_models, choice, greedy, topk):
    """`auto` on this CPU keeps everything on the host; the draft's top-k law in the graph is for `on` alone (it
    measured slower on a CPU and on an H100), while `on` also takes greedy tokens in the graph."""
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512, device_sampling=choice) as engine:
        assert [(seq.ctx.device_greedy, seq.ctx.device_topk) for seq in engine.caches] == [(greedy, topk)] * 2


@pytest.mark.slow
def test_a_wrong_in_graph_token_is_caught(tiny_models, monkeypatch):
    """The negative control: a device path that reads the wrong row gives other tokens than plain decoding."""
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512, device_sampling="off") as host:
        prompt = host.tokenize(PROMPT)
        plain = run_greedy(host, prompt, k=0)
    monkeypatch.setattr(Context, "sampled_token", lambda self, i: int(np.argsort(self.logits(i))[-2]))
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512, device_sampling="on") as device:
        broken = run_greedy(device, prompt, k=4)
    with pytest.raises(AssertionError, match="greedy runs differ"):
        assert_identical(tiny_models.target, prompt, plain.tokens, broken.tokens)


def test_the_in_graph_argmax_of_every_verified_row_is_the_logits_argmax(tiny_models):
    with Model(tiny_models.target) as model, Context(model, n_ctx=256, device_greedy=True) as ctx:
        tokens = model.tokenize(PROMPT, add_special=True, parse_special=False)
        assert len(tokens) > 9
        ctx.decode(tokens, 0, outputs=9)  # nine output rows in one batch, as a k = 8 verification
        for i in range(-9, 0):
            assert ctx.sampled_token(i) == int(np.argmax(ctx.logits(i)))
        with pytest.raises(ContextError, match="no sampled token for row 0"):
            ctx.decode(tokens[:2], len(tokens), outputs=1)
            ctx.sampled_token(0)


@pytest.mark.slow
def test_the_in_graph_top_k_law_is_the_hosts_top_k_law(tiny_models):
    """The draft's law at T > 0 on a device: llama.cpp's top-k + temperature chain hands over k candidates and their
    scaled logits; their softmax is the host's law with the same top-k and temperature (and nothing else), and the
    full logits stay in the graph meanwhile."""
    sampling = SamplingParams(temperature=0.7, top_k=6, top_p=1.0, min_p=0.0)
    with (
        Model(tiny_models.target) as model,
        Context(model, n_ctx=256) as host,
        Context(model, n_ctx=256, device_greedy=True) as device,
    ):
        tokens = model.tokenize(PROMPT, add_special=True, parse_special=False)
        device.device_law(6, 0.7)
        for n in range(4, len(tokens)):
            for ctx in (host, device):
                ctx.clear()
                ctx.decode(tokens[:n], 0, outputs=1)
            law = ArrayLaw.from_logits(*device.sampled_candidates(-1))
            reference = sampling_law(host.logits(-1), [], sampling)
            assert law.ids.tolist() == reference.ids.tolist()
            np.testing.assert_allclose(law.probs, reference.probs, rtol=1e-5)
        with pytest.raises(AssertionError, match="logits stay in the graph"):
            device.logits(-1)
        device.device_law(0)  # the greedy chain again: the logits come back
        device.decode(tokens[n : n + 1], n, outputs=1)
        assert device.sampled_token(-1) == int(np.argmax(device.logits(-1)))


def test_identical_draft_is_always_accepted(tiny_models):
    with Engine.load(tiny_models.target, tiny_models.draft_same, n_ctx=512) as engine:
        gen = run_greedy(engine, engine.tokenize(PROMPT), k=4, n=60)
    assert gen.stats.acceptance_rate >= 0.95
    assert gen.stats.mean_tokens_per_pass > 4.5


@pytest.mark.slow
def test_unrelated_draft_still_gives_the_target_output(tiny_models):
    with Engine.load(tiny_models.target, tiny_models.draft_unrelated, n_ctx=512) as engine:
        prompt = engine.tokenize(PROMPT)
        plain, spec = run_greedy(engine, prompt, 0), run_greedy(engine, prompt, 4)
    assert spec.stats.drafted > 0 and spec.stats.acceptance_rate < 0.2  # it did draft, and was mostly rejected
    assert_identical(tiny_models.target, prompt, plain.tokens, spec.tokens)


@pytest.mark.parametrize("mode", ["checkpoint", "refill"])
@pytest.mark.slow
def test_forced_rollback_paths_equal_tail_removal(tiny_models, mode):
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512) as engine:
        prompt = engine.tokenize(PROMPT)
        reference = run_greedy(engine, prompt, k=4)
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512, rollback=mode) as engine:
        assert engine.target.mode == mode
        forced = run_greedy(engine, prompt, k=4)
        assert engine.target.n_refills > 0 if mode == "refill" else engine.target.n_refills == 0
    assert forced.stats.accepted > 0
    assert_identical(tiny_models.target, prompt, reference.tokens, forced.tokens)


@pytest.mark.slow
def test_recurrent_model_speculates_through_checkpoints(tiny_models):
    with Engine.load(tiny_models.recurrent, drafter="none", n_ctx=256) as engine:
        assert engine.target.mode == "checkpoint"  # mamba cannot drop a partial tail
        prompt = engine.tokenize(PROMPT)
        plain = run_greedy(engine, prompt, k=0, n=32)
    with Engine.load(tiny_models.recurrent, tiny_models.recurrent, n_ctx=256) as engine:
        spec = run_greedy(engine, prompt, k=3, n=32)
        assert engine.target.n_refills == 0 and engine.drafter.seq.n_refills == 0
    assert spec.stats.acceptance_rate > 0.9
    assert_identical(tiny_models.recurrent, prompt, plain.tokens, spec.tokens)


def test_sliding_window_rollback_past_the_window_is_detected(tiny_models):
    """Without swa_full, removing cells back past the window would leave wrong logits: we re-prefill."""
    with Model(tiny_models.swa) as model, Context(model, n_ctx=1024) as ctx:
        seq = KVSequence(ctx)
        tokens = model.tokenize("the man said " * 300, add_special=True)[:800]
        seq.append(tokens, outputs=0)  # the window cache keeps ~n_swa + n_ubatch cells: not position 20
        assert ctx.pos_range()[0] > 20
        seq.rollback_to(20)
        assert seq.n_refills == 1
        seq.append([tokens[20]], outputs=1)
        rolled = ctx.logits(-1).copy()
        seq.check()
    with Model(tiny_models.swa) as model, Context(model, n_ctx=1024) as ctx:
        fresh = KVSequence(ctx)
        fresh.append(tokens[:20], outputs=0)
        fresh.append([tokens[20]], outputs=1)
        assert np.array_equal(rolled, ctx.logits(-1))


def test_sliding_window_model_speculates_with_full_cache(tiny_models):
    with Engine.load(tiny_models.swa, tiny_models.swa, n_ctx=512) as engine:
        assert engine.target.ctx.swa_full  # chosen automatically when speculating on an SWA model
        prompt = engine.tokenize(PROMPT)
        plain, spec = run_greedy(engine, prompt, 0, n=40), run_greedy(engine, prompt, 4, n=40)
    assert_identical(tiny_models.swa, prompt, plain.tokens, spec.tokens)


def test_rollback_then_regenerate_equals_fresh_context(tiny_models):
    """Same decode path, so the logits must be bit-identical."""
    with Model(tiny_models.target) as model:
        tokens = model.tokenize(PROMPT * 3, add_special=True)
        with Context(model, n_ctx=512) as ctx:
            seq = KVSequence(ctx)
            seq.append(tokens[:10], outputs=0)
            for t in tokens[10:30]:
                seq.append([t], outputs=1)
            seq.rollback_to(20)
            seq.append([tokens[20]], outputs=1)
            seq.check()
            rolled = ctx.logits(-1).copy()
        with Context(model, n_ctx=512) as ctx:
            seq = KVSequence(ctx)
            seq.append(tokens[:10], outputs=0)
            for t in tokens[10:21]:
                seq.append([t], outputs=1)
            assert np.array_equal(rolled, ctx.logits(-1))


def test_checkpoint_restore_equals_fresh_context(tiny_models):
    with Model(tiny_models.target) as model:
        tokens = model.tokenize(PROMPT * 3, add_special=True)
        with Context(model, n_ctx=512) as ctx:
            seq = KVSequence(ctx, rollback="checkpoint")
            seq.append(tokens[:12], outputs=0)
            seq.checkpoint()
            seq.append(tokens[12:20], outputs=8)
            seq.rollback_to(15)  # restore the checkpoint, re-decode tokens 12..14
            seq.append([tokens[15]], outputs=1)
            seq.check()
            restored = ctx.logits(-1).copy()
        with Context(model, n_ctx=512) as ctx:
            seq = KVSequence(ctx)
            seq.append(tokens[:12], outputs=0)
            seq.append(tokens[12:15], outputs=0)
            seq.append([tokens[15]], outputs=1)
            assert np.array_equal(restored, ctx.logits(-1))


def test_cancel_leaves_both_caches_consistent(tiny_models):
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512) as engine:
        prompt = engine.tokenize(PROMPT)
        gen = engine.generate(prompt, sampling=GREEDY, spec=FIXED4, max_tokens=200)
        events = []
        for event in gen:
            events.append(event)
            if len(events) == 5:
                gen.cancel()
        assert events[-1].finish_reason == "cancelled" and events[-1].token is None
        assert 5 <= len(gen.tokens) < 200
        engine.check_invariants()
        assert engine.target.tokens == (prompt + gen.tokens)[: engine.target.n_past]
        again = run_greedy(engine, prompt, k=4)
        fresh_first = run_greedy(engine, prompt, k=0)
    assert_identical(tiny_models.target, prompt, fresh_first.tokens, again.tokens)


def test_breaking_out_of_the_loop_leaves_caches_consistent(tiny_models):
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512) as engine:
        prompt = engine.tokenize(PROMPT)
        gen = engine.generate(prompt, sampling=GREEDY, spec=FIXED4, max_tokens=100)
        for i, _ in enumerate(gen):
            if i == 7:
                break
        gen_iter = iter(gen)
        del gen_iter
        engine.check_invariants()
        assert engine.drafter.seq.tokens == (prompt + gen.tokens)[: engine.drafter.seq.n_past]


def test_stop_strings_and_max_tokens(tiny_models):
    with Engine.load(tiny_models.target, drafter="none", n_ctx=512) as engine:
        prompt = engine.tokenize(PROMPT)
        full = run_greedy(engine, prompt, k=0, n=40)
        stop = full.text[10:14]
        gen = engine.generate(prompt, sampling=GREEDY, max_tokens=40, stop=[stop])
        streamed = "".join(e.text for e in gen)
    assert gen.finish_reason == "stop"
    assert streamed == gen.text == full.text[: full.text.index(stop)]
    assert len(full.tokens) == 40 and full.stats.emitted == 40


def test_context_full_ends_generation_cleanly(tiny_models):
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=64) as engine:
        prompt = engine.tokenize(PROMPT)
        gen = engine.generate(
            prompt, sampling=GREEDY, spec=SpeculativeParams(draft_max=8, adaptive=False), max_tokens=500
        )
        events = list(gen)
        assert gen.finish_reason == "length" and events[-1].finish_reason == "length"
        assert engine.target.n_past == engine.n_ctx  # every cell used (llama.cpp may round n_ctx up)
        assert len(prompt) + len(gen.tokens) == engine.n_ctx + 1
        engine.check_invariants()


def test_memory_that_cannot_roll_back_decodes_plainly_and_says_why(tiny_models):
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512) as loaded:
        loaded.target.mode = "refill"  # as if the probe had found neither tail removal nor state restore
        engine = Engine(loaded.target_model, loaded.target, loaded.drafter)
        prompt = engine.tokenize(PROMPT)
        gen = run_greedy(engine, prompt, k=4, n=16)
        plain = run_greedy(engine, prompt, k=0, n=16)
    assert gen.stats.drafted == 0 and "neither drop a KV tail nor restore" in gen.stats.speculation_off
    assert gen.tokens == plain.tokens


@pytest.mark.parametrize("stop_after", [None, 3])  # run to the end; break out after 3 events
def test_a_generation_runs_once(stop_after):
    target = LogitTable(5, seed=0)
    engine = fake_engine(target, LogitTable(5, seed=1, base=target, noise=0.5))
    gen = engine.generate([1, 3, 0, 4, 1], sampling=GREEDY, spec=FIXED4, max_tokens=12)
    finished: list = []
    gen.on_finish = finished.append
    events = iter(gen)
    for i, _ in enumerate(events):
        if i == stop_after:
            break
    events.close()
    held = list(engine.target.tokens), list(engine.drafter.seq.tokens)
    tokens, reason = list(gen.tokens), gen.finish_reason
    assert finished == [gen] and reason == ("length" if stop_after is None else "cancelled")
    with pytest.raises(RuntimeError, match="already run"):
        next(iter(gen))
    # The second pass changed nothing: no re-sync of the caches, no second on_finish, same result.
    assert finished == [gen] and (list(engine.target.tokens), list(engine.drafter.seq.tokens)) == held
    assert gen.tokens == tokens and gen.finish_reason == reason
    engine.check_invariants()


@pytest.mark.parametrize("repeat_penalty", [1.0, 1.8])  # the one-block argmax; row by row after the drafts
def test_greedy_and_distribution_views_of_the_verified_rows_agree(repeat_penalty):
    table = LogitTable(7, seed=3)
    ctx = TableContext(table, FakeModel("target"))
    history, drafts = [1, 5, 2, 6], [2, 2, 4]
    ctx.decode(history[:-1], 0, outputs=0)
    ctx.decode([history[-1], *drafts], len(history) - 1, outputs=len(drafts) + 1)  # the verify batch
    sampling = SamplingParams(temperature=0, repeat_penalty=repeat_penalty, repeat_last_n=8)
    recent = penalty_window(history, sampling)
    argmax, laws = TargetArgmax(ctx, recent, drafts, sampling), TargetLaws(ctx, recent, drafts, sampling)
    assert len(argmax) == len(laws) == len(drafts) + 1
    for i in range(len(drafts) + 1):
        token, law = argmax[i], laws[i]
        assert type(token) is int and isinstance(law, ArrayLaw)  # each view has one return type
        assert law.top() == (token, 1.0)
        if repeat_penalty == 1.0:
            assert token == int(np.argmax(table.logits(tuple([*history, *drafts][: len(history) + i]))))


def test_the_first_token_never_waits_for_the_draft_to_read_a_long_prompt(tiny_models):
    """A prompt the draft has not read: the first token comes from a plain step after the target's read alone, the
    draft reads the prompt before the second step, and the answer is the one plain decoding gives (issue 56). A
    prompt the draft mostly holds (the chat's next turn) is read by it first: the first step drafts."""
    with Engine.load(tiny_models.target, tiny_models.draft_same, n_ctx=1024) as engine:
        prompt = engine.tokenize(PROMPT * 20)
        assert len(prompt) > 200
        draft = engine.drafter.caches[0]
        plain = run_greedy(engine, prompt, k=0, n=24)
        draft.rollback_to(0)
        gen = engine.generate(prompt, sampling=GREEDY, spec=FIXED4, max_tokens=24)
        events = iter(gen)
        first = next(events)
        held_at_first = draft.n_past
        second = next(events)
        rest = list(events)
        assert held_at_first == 0 and first.from_draft is False  # the first token came before the draft read
        assert draft.n_past >= len(prompt) - 1 and gen.stats.draft_prefill_decoded >= len(prompt) - 1
        assert [first.token, second.token, *(e.token for e in rest if e.token is not None)] == gen.tokens
        assert gen.stats.accepted > 0  # an identical draft: its drafts accepted once it read the prompt
        assert_identical(tiny_models.target, prompt, plain.tokens, gen.tokens)
        follow = prompt + gen.tokens + engine.tokenize(" and then", add_special=False)
        gen = engine.generate(follow, sampling=GREEDY, spec=FIXED4, max_tokens=8)
        assert next(iter(gen)).from_draft  # the draft held all but a few tokens: it read them and drafted
