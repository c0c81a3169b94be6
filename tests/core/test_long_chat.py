"""Long chats past a full context (issue #10) on the real llama.cpp: context shifting, its fallbacks, exactness.

Where the memory can move positions, the oldest turns are dropped from BOTH caches by removing their span
and shifting the rest back, so a turn after the fill decodes only its new tokens. Recurrent memory (Mamba),
sliding-window caches that are not full-size, and templates whose rendering changes when turns are dropped
fall back to dropping a block of turns and re-reading the rest once. Either way each cache holds exactly its
token list, and that list is a prefix of a fresh rendering of the shortened conversation.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import GREEDY, divergence
from support.lawcheck import check_law, expected_tv

from localspec.core.engine import Engine
from localspec.core.kv import KVSequence, common_prefix
from localspec.core.params import SpeculativeParams
from localspec.core.sampling import SamplingParams
from localspec.core.session import ChatSession, Message
from localspec.core.window import plan_shift
from localspec.llama.context import Context
from localspec.llama.model import Model

SPEC = SpeculativeParams(draft_max=4, adaptive=False)
PLAIN = SpeculativeParams(draft_max=0)
WORDS = [
    "the",
    "man",
    "said",
    "that",
    "the",
    "water",
    "was",
    "hot",
    "and",
    "the",
    "house",
    "was",
    "near",
    "the",
    "old",
    "world",
]


def question(i: int) -> str:
    """A user message of 10-16 words that differs from turn to turn."""
    rng = np.random.default_rng(i)
    return f"turn {i}: " + " ".join(rng.choice(WORDS, size=10 + i % 7).tolist())


def sequences(engine: Engine) -> list[KVSequence]:
    return list(engine.caches)


def assert_caches_hold_the_fresh_rendering(session: ChatSession, gen) -> None:
    """Each cache holds its token list, and that list is the fresh rendering of the window + the answer."""
    engine = session.engine
    engine.check_invariants()
    n_sys = 1 if session.messages[0].role == "system" else 0
    window = session.messages[:n_sys] + session.messages[n_sys + session.dropped : -1]  # [-1]: the answer
    assert session.format.tokens(window) == gen.prompt
    history = gen.prompt + gen.tokens  # a step may have cached accepted drafts past a stop token: not compared
    for seq in sequences(engine):
        n = min(seq.n_past, len(history))
        assert seq.tokens[:n] == history[:n] and n >= len(gen.prompt) - 1 - (seq is not engine.target)


def chat(session: ChatSession, turns: range, *, spec=SPEC, max_tokens=16, check=True):
    """Send one message per turn; return each turn's generation."""
    gens = []
    for i in turns:
        gen = session.send(question(i), sampling=GREEDY, spec=spec, max_tokens=max_tokens)
        "".join(event.text for event in gen)
        if check:
            assert_caches_hold_the_fresh_rendering(session, gen)
        gens.append(gen)
    return gens


# --- the cache operation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "swa_full"), [("target", False), ("swa", True), ("swa", False)])
def test_drop_keeps_the_relative_positions_of_the_kept_cells(tiny_models, model, swa_full):
    """Removing a span and shifting the rest back gives the logits of leaving the rest where it was.

    Attention with RoPE sees only relative positions, so a cache whose first cells were removed WITHOUT a
    shift (positions then start at n) must give the same next-token logits as the shifted one. A shift that
    moved positions but not the keys' rotation would not.
    """
    rng = np.random.default_rng(1)
    tokens = [1, *rng.integers(261, 800, 99).tolist()]
    with Model(getattr(tiny_models, model)) as model:
        with Context(model, n_ctx=256, swa_full=swa_full) as ctx:
            seq = KVSequence(ctx)
            seq.append(tokens, outputs=0)
            assert seq.can_drop and seq.drop(0, 40)
            assert seq.tokens == tokens[40:] and seq.n_dropped == 40
            seq.check()
            assert ctx.pos_range() == (0, 59)
            seq.append([300], outputs=1)
            shifted = ctx.logits(-1).copy()
        with Context(model, n_ctx=256, swa_full=swa_full) as ctx:
            ctx.decode(tokens, 0, outputs=0)
            assert ctx.remove_span(0, 40) and ctx.pos_range() == (40, 99)
            ctx.decode([300], 100, outputs=1)
            in_place = ctx.logits(-1).copy()
            ctx.clear()
            ctx.decode(tokens[40:] + [300], 0, outputs=1)
            fresh = ctx.logits(-1).copy()
    assert np.abs(shifted - in_place).max() < 0.05  # F16 keys re-rotated: a few 1e-3
    assert np.abs(fresh - in_place).max() > 0.5  # the kept cells still carry what they attended to


def test_drop_in_the_middle_updates_tokens_and_positions(tiny_models):
    with Model(tiny_models.target) as model, Context(model, n_ctx=256) as ctx:
        seq = KVSequence(ctx)
        seq.append(list(range(300, 400)), outputs=0)
        assert seq.drop(10, 30)
        assert seq.tokens == list(range(300, 310)) + list(range(340, 400))
        seq.check()
        seq.append([5, 6], outputs=1)  # decodes after a shift, at the shifted positions
        seq.check()
        assert ctx.pos_range() == (0, 71)


def test_recurrent_memory_cannot_drop_a_span(tiny_models):
    with Model(tiny_models.recurrent) as model, Context(model, n_ctx=256) as ctx:
        seq = KVSequence(ctx)
        seq.append(list(range(300, 360)), outputs=0)
        assert not seq.can_drop
        assert not seq.drop(5, 10)
        assert seq.tokens == list(range(300, 360))
        seq.check()


@pytest.mark.parametrize(
    ("n_ctx", "swa_full", "shifts"), [(1024, True, True), (1024, False, False), (256, False, True)]
)
def test_sliding_window_cache_shifts_where_llama_cpp_says_it_can(tiny_models, n_ctx, swa_full, shifts):
    """A window cache smaller than n_ctx cannot shift; a full-size one can (swa_full, or a short n_ctx)."""
    with Model(tiny_models.swa) as model, Context(model, n_ctx=n_ctx, swa_full=swa_full) as ctx:
        seq = KVSequence(ctx)
        seq.append(list(range(300, 360)), outputs=0)
        assert seq.can_drop is shifts
        assert seq.drop(5, 10) is shifts
        seq.check()
        if shifts and not swa_full:  # never a span that the next token's window (8) still needs
            assert not seq.drop(40, 5) and len(seq.tokens) == 50


def test_plan_shift_finds_the_dropped_span_and_checks_it():
    sys_, a, b, c = [1, 7, 7], [10, 11, 12], [20, 21], [30, 31, 32, 33]
    old, new = sys_ + a + b + c, sys_ + b + c
    answer = [40, 41]
    plan = plan_shift(old + answer, old, new)
    assert (plan.start, plan.n, plan.reused, plan.exact) == (3, 3, len(new) + 0, True)
    # The cache lost the end of the old rendering (a re-tokenized answer): reuse stops there.
    plan = plan_shift(old[:-2] + [99], old, new)
    assert plan.exact and plan.reused == len(new) - 2
    # The shortened rendering differs from the kept tokens (a template that numbers turns, say).
    renumbered = sys_ + [20, 22] + c
    plan = plan_shift(old, old, renumbered)
    assert not plan.exact and plan.reused == common_prefix(sys_ + b + c, renumbered)
    assert plan_shift(sys_ + a[:2], old, new) is None  # the cache does not hold all that the cut drops
    assert plan_shift(old, old, old) is None


# --- chats ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_turns_after_the_fill_decode_only_their_new_tokens_on_both_models(tiny_models):
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512) as engine:
        session = ChatSession(engine, system="Be brief.")
        gens = chat(session, range(40))
        first_cut = next(i for i, g in enumerate(gens) if g.notices)
        after = gens[first_cut:]
        assert len(after) >= 10 and session.shifts >= 2 and session.block_drops == 0
        assert session.render_mismatches == 0 and session.shift_fallback is None
        for gen in after:  # the window holds 200+ tokens (half the room or more); a turn adds a few dozen
            assert gen.stats.prompt_tokens > 200
            assert gen.stats.prefill_decoded < 80, gen.stats.prefill_decoded
            assert gen.stats.draft_prefill_decoded < 80, gen.stats.draft_prefill_decoded
        assert engine.target.n_dropped > 0 and engine.drafter.seq.n_dropped > 0
        assert "left out" in after[-1].notices[0]


@pytest.mark.slow
def test_fitting_renders_the_conversation_a_logarithmic_number_of_times(tiny_models, monkeypatch):
    with Engine.load(tiny_models.target, drafter="none", n_ctx=256) as engine:
        session = ChatSession(engine, system="Be brief.")
        renders = []
        real = session.format.tokens
        monkeypatch.setattr(
            session.format, "tokens", lambda messages, **kw: renders.append(len(messages)) or real(messages, **kw)
        )
        for i in range(60):
            before = len(renders)
            chat(session, range(i, i + 1), spec=PLAIN, max_tokens=8, check=False)
            assert len(renders) - before <= 2 + 5, renders[before:]  # one, or one + a search over ≤ 32 starts
        assert session.dropped > 60  # the history kept growing; each rendering covered only the window
        assert max(renders[-20:]) < 40


@pytest.mark.slow
def test_greedy_speculative_equals_plain_after_a_shift(tiny_models, record_property):
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512) as engine:
        session = ChatSession(engine, system="Be brief.")
        chat(session, range(30))
        for i in range(30, 50):  # until a turn is shifted
            shifts = session.shifts
            gen = session.send(question(i), sampling=GREEDY, spec=SPEC, max_tokens=40)
            list(gen)
            if session.shifts == shifts + 1:
                break
        assert session.shifts == shifts + 1  # this very turn was shifted
        held = list(engine.target.tokens[: len(gen.prompt) - 1])
        again = session.regenerate(sampling=GREEDY, spec=PLAIN, max_tokens=40)
        list(again)
        assert again.prompt == gen.prompt and again.stats.prefill_decoded == 0  # the same shifted cells
        assert engine.target.tokens[: len(held)] == held
    assert gen.stats.accepted > 0 and not any(again.from_draft)
    # Near-ties are judged on a fresh prefill of the shifted tokens: the best reference there is.
    near_tie = divergence(tiny_models.target, gen.prompt, again.tokens, gen.tokens)
    record_property("near_tie_divergence", near_tie)


@pytest.mark.slow
def test_speculative_sampling_follows_the_targets_law_on_the_shifted_cache(tiny_models):
    """T2 on the shifted state: the first two tokens' law, computed from the target's own shifted cache."""
    sampling = SamplingParams(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0, seed=5)
    spec = SpeculativeParams(draft_max=2, adaptive=False, verify="pq")
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=256, n_threads=1) as engine:
        session = ChatSession(engine, system="Be brief.")
        chat(session, range(14), max_tokens=8)
        assert session.shifts > 0
        # The next turn's window (the caches shift to it if needed); its generation is never run: only its prompt.
        prompt = session.answer([*session.messages, Message("user", question(14))], max_tokens=8).prompt
        target = engine.target
        target.sync(prompt[:-1])
        assert target.n_dropped > 0
        law: dict[tuple[int, ...], float] = {}
        n = target.n_past
        target.append([prompt[-1]], outputs=1)
        first = _top4(target.ctx.logits(-1))
        for t1, p1 in first:
            if t1 in engine.eog:
                law[(t1,)] = p1  # the answer ends after one token
                continue
            target.rollback_to(n + 1)
            target.append([t1], outputs=1)
            for t2, p2 in _top4(target.ctx.logits(-1)):
                law[(t1, t2)] = p1 * p2
        target.rollback_to(n)
        outcomes = sorted(law)
        index = {o: i for i, o in enumerate(outcomes)}
        counts = np.zeros(len(outcomes) + 1, dtype=np.int64)
        rng = np.random.default_rng(11)
        runs = 3000
        drafted = accepted = 0
        for _ in range(runs):
            gen = engine.generate(prompt, sampling=sampling, spec=spec, max_tokens=2, rng=rng)
            list(gen)
            assert gen.stats.prefill_decoded == 0  # always the shifted cells, never a re-read
            counts[index.get(tuple(gen.tokens[:2]), len(outcomes))] += 1
            drafted, accepted = drafted + gen.stats.drafted, accepted + gen.stats.accepted
    probs = np.append([law[o] for o in outcomes], 0.0)
    verdict = check_law(counts, probs)
    assert verdict.ok, verdict
    assert verdict.tv < 1.5 * expected_tv(probs, runs), verdict
    assert 0 < accepted < drafted


def _top4(logits) -> list[tuple[int, float]]:
    logits = logits.astype(np.float64)
    top = np.argsort(-logits)[:4]
    weights = np.exp(logits[top] - logits[top].max())
    return list(zip(top.tolist(), (weights / weights.sum()).tolist()))


NUMBERED_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + ' ' + loop.index|string + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.mark.slow
def test_a_template_that_renders_a_shortened_chat_differently_falls_back_to_block_drops(tiny_models):
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512) as engine:
        session = ChatSession(engine, system="Be brief.")
        session.format.template = NUMBERED_TEMPLATE  # turn numbers change when old turns are dropped
        gens = chat(session, range(45))
        assert session.render_mismatches >= 1 and session.shift_fallback is not None
        assert session.shifts == 0 and session.block_drops >= 2
        assert engine.target.n_dropped == 0
        reads = [g.stats.prefill_decoded for g in gens if g.stats.prefill_decoded > 150]
        assert len(reads) <= session.block_drops + 1  # re-reads only at block drops, not every turn


@pytest.mark.parametrize(
    ("model", "n_ctx", "turns"), [("recurrent", 256, 30), pytest.param("swa", 1024, 90, marks=pytest.mark.slow)]
)
def test_fallback_models_keep_answering_correctly_past_a_full_context(tiny_models, model, n_ctx, turns):
    """No shift possible: block drops; each answer equals a fresh engine's answer to the same prompt.

    (A sliding-window cache is smaller than n_ctx at 1024 without swa_full, which is off without a draft.)
    """
    path = getattr(tiny_models, model)
    with (
        Engine.load(path, drafter="none", n_ctx=n_ctx) as engine,
        Engine.load(path, drafter="none", n_ctx=n_ctx) as fresh,
    ):
        session = ChatSession(engine, system="Be brief.")
        assert not engine.target.can_drop
        gens = chat(session, range(turns), spec=PLAIN, max_tokens=12)
        assert session.block_drops >= 2 and session.shifts == 0
        for gen in gens[-4:]:
            fresh.target.rollback_to(0)
            ref = fresh.generate(gen.prompt, sampling=GREEDY, spec=PLAIN, max_tokens=12)
            list(ref)
            divergence(path, gen.prompt, ref.tokens, gen.tokens)  # none, or only at a near-tie


@pytest.mark.slow
def test_swa_pair_shifts_with_the_full_size_window_cache(tiny_models):
    with Engine.load(tiny_models.swa, tiny_models.swa, n_ctx=256) as engine:
        assert engine.target.ctx.swa_full and engine.target.can_drop
        session = ChatSession(engine, system="Be brief.")
        gens = chat(session, range(30), max_tokens=12)
        assert session.shifts >= 2 and session.block_drops == 0
        assert gens[-1].stats.prefill_decoded < 80


def test_smollm2_long_chat_shifts_exactly_and_matches_plain_greedy(smollm2_path, record_property):
    with Engine.load(smollm2_path, smollm2_path, n_ctx=256) as engine:
        session = ChatSession(engine, system="You are a helpful assistant.")
        topics = [
            "cats",
            "the sea",
            "bread",
            "rain",
            "music",
            "trees",
            "stars",
            "bicycles",
            "tea",
            "snow",
            "rivers",
            "clocks",
            "maps",
            "bees",
            "salt",
            "glass",
        ]
        gens = []
        for topic in topics:
            gen = session.send(f"Give me one short fact about {topic}.", sampling=GREEDY, spec=SPEC, max_tokens=16)
            list(gen)
            assert_caches_hold_the_fresh_rendering(session, gen)
            gens.append(gen)
        assert session.shifts >= 2 and session.render_mismatches == 0 and session.block_drops == 0
        assert gens[-1].stats.prefill_decoded < 60
        again = session.regenerate(sampling=GREEDY, spec=PLAIN, max_tokens=16)
        list(again)
        assert again.stats.prefill_decoded == 0
    near_tie = divergence(smollm2_path, gens[-1].prompt, again.tokens, gens[-1].tokens)
    record_property("near_tie_divergence", near_tie)


@pytest.mark.slow
def test_a_long_prefill_reports_progress_and_stops_with_consistent_caches(tiny_models):
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=2048) as engine:
        prompt = engine.tokenize(" ".join(WORDS * 80))
        assert len(prompt) > 1000
        gen = engine.generate(prompt, sampling=GREEDY, spec=SPEC, max_tokens=8)
        seen = []

        def on_prefill(model, done, total):
            seen.append((model, done, total))
            if done >= 512:
                gen.cancel()

        gen.on_prefill = on_prefill
        events = list(gen)
        assert [e.finish_reason for e in events] == ["cancelled"] and gen.tokens == []
        assert seen[0][0] == "target" and seen[-1][1] == 512 and seen[-1][2] == len(prompt) - 1
        engine.check_invariants()
        assert engine.target.tokens == prompt[:512]
        full = engine.generate(prompt, sampling=GREEDY, spec=SPEC, max_tokens=8)
        list(full)
        assert full.stats.prefill_decoded == len(prompt) - 1 - 512  # resumes where it stopped
        assert full.finish_reason == "length"


@pytest.mark.slow
def test_the_chat_app_loop_reports_reading_a_long_prompt(tiny_models):
    from localspec.tui.live import Finished, Reading, stream_generation

    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=2048) as engine:
        prompt = engine.tokenize(" ".join(WORDS * 60))
        items = []
        stream_generation(engine.generate(prompt, sampling=GREEDY, spec=SPEC, max_tokens=4), items.append)
    readings = [item for item in items if isinstance(item, Reading)]
    assert isinstance(items[-1], Finished) and items[-1].finish_reason == "length"
    # The draft reads the prompt's window alone (core/draftread.py): a read that short has no progress line.
    assert {r.model for r in readings} == {"target"}
    assert readings[0].done < readings[0].total and "reading the conversation into the target" in readings[0].status()
    assert readings[-1].done == readings[-1].total and readings[-1].status().startswith("generating")
