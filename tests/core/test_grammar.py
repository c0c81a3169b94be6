"""A grammar as a law (core/grammar.py, issue 46): exactness under a mask, with negative controls.

T1 on the kernel: a draft drawn from its masked law and verified by p/q against the target's masked law emits the
masked target law; told the unmasked draft law instead, it does not. T2 by enumeration: the real loop (`Engine`,
`Generation`, `speculative_step`, every drafter) over a numpy model with known conditionals and a real llguidance
matcher on a six-token vocabulary, whose grammar forces tokens ("a" must be followed by "b", "d" by "c"): the first
three tokens follow the masked law computed here by hand, forced tokens included; a drafter that masks its draws but
reports the unmasked law fails the same check. Greedy under a grammar: speculative == plain for every drafter.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from support.fakellm import FakeModel, LogitTable, TableContext
from support.lawcheck import check_law
from support.sampling_reference import reference_dense

from localspec.core.drafters import ModelDrafter, make_drafter
from localspec.core.engine import Engine
from localspec.core.grammar import Grammar, GrammarError, GrammarVocab, TokenMask
from localspec.core.kv import KVSequence
from localspec.core.laws import ArrayLaw
from localspec.core.params import SpeculativeParams, needs_draft_model
from localspec.core.policy import DraftPolicy, EstimatedCosts
from localspec.core.sampling import SamplingParams
from localspec.core.verify import verify_pq

LETTERS = "abcde"
END = 5  # the end-of-generation token
VOCAB = 6
PIECES = [c.encode() for c in LETTERS] + [b"\xff<|end|>"]
# Ten units at least (no end within a test's tokens), each "ab", "c", "dc" or "e": after "a" only "b" is allowed,
# after "d" only "c" — forced tokens —, elsewhere a, c, d or e.
LARK = 'start: u u u u u u u u u u+\nu: "ab" | "c" | "dc" | "e"\n'
PROMPT = [1, 3, 0, 4, 1, 3, 2, 0]
TARGET = LogitTable(VOCAB, seed=0)
DRAFT = LogitTable(VOCAB, seed=1, base=TARGET, noise=1.2)
SAMPLING = SamplingParams(temperature=1.0, top_k=4, top_p=0.97, min_p=0.03, repeat_penalty=1.6, repeat_last_n=4)
# top-k 2: a row's two best are often both forbidden, and the law is the transform of the masked row
NARROW = SamplingParams(temperature=1.0, top_k=2, top_p=0.97, min_p=0.03, repeat_penalty=1.6, repeat_last_n=4)
N_RUNS = 4000


def tokenize(text: str) -> list[int]:
    return [LETTERS.index(c) for c in text]


@pytest.fixture(scope="module")
def grammar():
    return GrammarVocab(PIECES, [END], tokenize).compile(Grammar("lark", LARK))


class EndModel(FakeModel):
    def eog_tokens(self) -> frozenset[int]:
        return frozenset([END])


def engine_for(drafter: str) -> Engine:
    target_model = EndModel("target")
    target = KVSequence(TableContext(TARGET, target_model), rollback="seq_rm")
    model = None
    if needs_draft_model(drafter):
        model = ModelDrafter(KVSequence(TableContext(DRAFT, EndModel("draft")), rollback="seq_rm"), size_ratio=1.0)
    engine = Engine(target_model, target, make_drafter(drafter, model))
    engine.policy = DraftPolicy(costs=EstimatedCosts(draft_ratio=0.05, batch_slope=0.1))
    return engine


def allowed_after(generated: list[int]) -> list[int]:
    """The grammar's allowed tokens after `generated`, by hand."""
    if generated and generated[-1] == 0:
        return [1]
    if generated and generated[-1] == 3:
        return [2]
    return [0, 2, 3, 4]


def masked_reference(prefix: list[int], generated: list[int], sampling: SamplingParams) -> np.ndarray:
    """The masked target law after `prefix` (prompt + generated): the row's law restricted and renormalised, or the
    transform of the masked row where none of its support is allowed."""
    logits = TARGET.logits(tuple(prefix))
    allowed = np.zeros(VOCAB, dtype=bool)
    allowed[allowed_after(generated)] = True
    law = reference_dense(logits, prefix, sampling) * allowed
    if law.sum() > 0:
        return law / law.sum()
    return reference_dense(np.where(allowed, logits, -np.inf).astype(np.float32), prefix, sampling)


def exact_law(sampling: SamplingParams, n_tokens: int = 3) -> tuple[np.ndarray, int]:
    """P(first n_tokens) under the grammar, and how many prefixes needed the masked row's fallback."""
    probs, fallbacks = np.zeros(VOCAB**n_tokens), 0
    for outcome in itertools.product(range(VOCAB), repeat=n_tokens):
        p, generated = 1.0, []
        for token in outcome:
            prefix = PROMPT + generated
            restricted = reference_dense(TARGET.logits(tuple(prefix)), prefix, sampling)[allowed_after(generated)]
            fallbacks += p > 0 and restricted.sum() == 0
            p *= masked_reference(prefix, generated, sampling)[token]
            generated.append(token)
        probs[np.ravel_multi_index(outcome, (VOCAB,) * n_tokens)] = p
    return probs, fallbacks


@pytest.fixture(scope="module")
def law() -> np.ndarray:
    return exact_law(SAMPLING)[0]


def first_tokens(
    engine: Engine, grammar, spec: SpeculativeParams, n_runs: int, seed: int, sampling: SamplingParams = SAMPLING
):
    rng = np.random.default_rng(seed)
    counts, stats = np.zeros(VOCAB**3, dtype=np.int64), []
    for _ in range(n_runs):
        gen = engine.generate(
            PROMPT, sampling=sampling, spec=spec, max_tokens=max(4, spec.draft_max + 1), rng=rng, grammar=grammar
        )
        list(gen)
        counts[np.ravel_multi_index(tuple(gen.tokens[:3]), (VOCAB,) * 3)] += 1
        stats.append(gen.stats)
    return counts, stats


def test_the_masked_law_is_not_trivial(law):
    probs, fallbacks = exact_law(SAMPLING)
    assert np.count_nonzero(probs) >= 8 and probs.max() < 0.35
    assert exact_law(NARROW)[1] > 0  # rows that keep no allowed token after top-k 2: the masked row's law
    forbidden = [o for o in itertools.product(range(VOCAB), repeat=3) if o[0] == 0 and o[1] != 1]
    assert all(probs[np.ravel_multi_index(o, (VOCAB,) * 3)] == 0 for o in forbidden)


def test_mask_bits_read_like_a_bool_array(grammar):
    constraint = grammar.start()
    mask = constraint.mask()
    assert isinstance(mask, TokenMask)
    assert mask.dense(VOCAB).tolist() == [True, False, True, True, True, False]
    assert mask[np.array([0, 1, 4, 5, 9])].tolist() == [True, False, True, False, False]  # 9: past the vocabulary
    assert mask.count == 4 and mask.single() is None
    assert constraint.push(0) and constraint.mask().single() == 1  # after "a", "b" is forced
    assert not constraint.push(2)  # "c" is not allowed after "a": nothing consumed
    assert constraint.forced(5, frozenset([END])) == [1]
    constraint.end_step(0, 3)  # back to the start, then "d"
    assert constraint.mask().single() == 2


def test_a_grammar_the_library_cannot_compile_is_one_line_naming_it():
    vocab = GrammarVocab(PIECES, [END], tokenize)
    with pytest.raises(GrammarError, match="cannot be compiled") as e:
        vocab.compile(Grammar("lark", "start: undefined_rule\n"))
    assert "\n" not in str(e.value)
    with pytest.raises(GrammarError, match="not JSON"):
        Grammar.json_schema("{nope")


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.slow
def test_t1_pq_against_the_masked_target_emits_it_and_a_lying_draft_does_not(seed):
    """T1: the draft drawn from its masked law; verification told that law emits the masked target law. Told the
    unmasked draft law (the control: the target masked, the draft's law not), it emits something else."""
    rng = np.random.default_rng(seed)
    target = ArrayLaw.from_weights(np.arange(8), rng.random(8) ** 2)
    draft = ArrayLaw.from_weights(np.arange(8), rng.random(8) ** 2)
    allowed = np.array([True, False, True, True, False, True, False, True])
    target_masked, draft_masked = target.restricted(allowed), draft.restricted(allowed)
    for told, exact in ((draft_masked, True), (draft, False)):
        counts = np.zeros(8, dtype=np.int64)
        for _ in range(60_000):
            x = draft_masked.sample(rng)
            n, token = verify_pq([x], [told], [target_masked, target_masked], rng)
            counts[x if n else token] += 1
        verdict = check_law(counts, target_masked.dense(8))
        assert verdict.ok == exact, verdict


@pytest.mark.slow
@pytest.mark.parametrize("drafter,k", [("none", 0), ("model", 1), ("model", 3), ("ngram", 3), ("model+ngram", 3)])
def test_t2_the_loop_under_a_grammar_emits_the_masked_target_law(law, grammar, drafter, k):
    engine = engine_for(drafter)
    counts, stats = first_tokens(engine, grammar, SpeculativeParams(draft_max=k, adaptive=False), N_RUNS, seed=k)
    verdict = check_law(counts, law)
    assert verdict.ok, verdict
    assert sum(s.emitted for s in stats) > sum(s.target_passes for s in stats)  # forced tokens came free
    if drafter == "model":
        drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
        assert 0.2 * drafted < accepted < drafted


@pytest.mark.slow
def test_t2_where_top_k_keeps_no_allowed_token_the_masked_row_is_the_law(grammar):
    narrow = exact_law(NARROW)[0]
    spec = SpeculativeParams(draft_max=3, adaptive=False)
    counts, _ = first_tokens(engine_for("model"), grammar, spec, N_RUNS, seed=9, sampling=NARROW)
    verdict = check_law(counts, narrow)
    assert verdict.ok, verdict


@pytest.mark.slow
def test_t2_a_draft_that_masks_its_draws_but_reports_its_unmasked_law_fails(law, grammar, monkeypatch):
    """Negative control: the draft samples from its masked law and tells verification its unmasked one."""
    import localspec.core.drafting as drafters

    real = drafters.masked

    class Lying:
        def __init__(self, told, drawn):
            self.told, self.drawn = told, drawn

        def __getattr__(self, name):
            return getattr(self.told, name)

        def sample(self, rng):
            return self.drawn.sample(rng)

    monkeypatch.setattr(drafters, "masked", lambda law, *a: Lying(law, real(law, *a)))
    counts, _ = first_tokens(engine_for("model"), grammar, SpeculativeParams(draft_max=3, adaptive=False), N_RUNS, 5)
    verdict = check_law(counts, law)
    assert not verdict.ok, f"a draft law that ignores the mask passed: {verdict}"


GREEDY_PENALISED = SamplingParams(temperature=0.0, repeat_penalty=1.3, repeat_last_n=6)


@pytest.mark.parametrize("drafter", ["model", "ngram", "model+ngram"])
def test_greedy_speculative_equals_plain_under_a_grammar(grammar, drafter):
    for prompt in ([1, 3, 0, 4], [2, 2, 2], [0, 1, 2, 3, 4, 0, 1]):
        plain = engine_for("none").generate(prompt, sampling=GREEDY_PENALISED, max_tokens=30, grammar=grammar)
        list(plain)
        text = "".join(LETTERS[t] for t in plain.tokens if t != END)
        assert len(plain.tokens) == 30 or (plain.tokens[-1] == END and len(plain.tokens) > 10)
        assert "a" not in text.replace("ab", "") and "d" not in text.replace("dc", "")
        for spec in [SpeculativeParams(draft_max=k, adaptive=False) for k in (1, 3, 5)] + [SpeculativeParams()]:
            gen = engine_for(drafter).generate(
                prompt, sampling=GREEDY_PENALISED, spec=spec, max_tokens=30, grammar=grammar
            )
            list(gen)
            assert gen.tokens == plain.tokens, (prompt, spec)
