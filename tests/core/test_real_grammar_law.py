"""T3 under a grammar (issue 46): `localspec generate --n N --grammar FILE` on a real tiny GGUF samples exactly the
target's masked law.

At temperature 1 and top-k 4 the first three tokens' law under a Lark grammar of a few words is computed here from
the target's own logits (one fresh llama.cpp decode per prefix) and llguidance's own matcher (its mask read
directly, not through localspec's `TokenMask`): the top-4 softmax restricted to the allowed tokens, or where none of
the four is allowed the top-4 softmax of the allowed tokens alone; a token the grammar forces has probability 1.
The real CLI with p/q and a draft, and with no drafter, must match it; a draft told its unmasked law must not.
"""

from __future__ import annotations

import json

import llguidance
import numpy as np
import pytest
from support.lawcheck import law_of_runs

from localspec.cli.main import main
from localspec.llama.context import Context
from localspec.llama.model import Model
from localspec.llama.vocab import grammar_pieces, grammar_tokenizer

PROMPT = "the man said what"
TOP_K = 4
N_CTX = 64
THREADS = 1
LARK = 'start: (" " W)+\nW: "the" | "of" | "and" | "to" | "a" | "in" | "is" | "it" | "you" | "that" | "he"\n'
RUNS = 3000


class MaskedReference:
    """The exact law of the first 3 tokens under the grammar."""

    def __init__(self, target_path) -> None:
        self.law: dict[tuple[int, ...], float] = {}
        self.fallbacks = self.forced = 0
        with Model(target_path) as model, Context(model, n_ctx=N_CTX, n_threads=THREADS) as ctx:
            self.prompt = model.tokenize(PROMPT, add_special=True)
            self._ctx = ctx
            eog = sorted(model.eog_tokens())

            class Tok:
                eos_token_id, bos_token_id, tokens = eog[0], None, grammar_pieces(model)
                __call__ = staticmethod(grammar_tokenizer(model))

            tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Tok()), eos_token=eog)
            self._matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(LARK))
            self._n_vocab = model.n_vocab
            self._walk([], 1.0)
        self.outcomes = sorted(self.law)
        self.probs = np.array([self.law[o] for o in self.outcomes])

    def _allowed(self, prefix: list[int]) -> np.ndarray:
        self._matcher.reset()
        assert self._matcher.consume_tokens(prefix)
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[: self._n_vocab].astype(bool)

    def _logits(self, prefix: list[int]) -> np.ndarray:
        ctx, prompt = self._ctx, self.prompt
        ctx.clear()
        ctx.decode(prompt[:-1], 0, outputs=0)
        for i, token in enumerate([prompt[-1], *prefix]):
            ctx.decode([token], len(prompt) - 1 + i, outputs=1)
        return ctx.logits(0).astype(np.float64)

    def _walk(self, prefix: list[int], p: float) -> None:
        if len(prefix) == 3:
            self.law[tuple(prefix)] = p
            return
        allowed, logits = self._allowed(prefix), self._logits(prefix)
        top = np.argsort(-logits)[:TOP_K]
        kept = top[allowed[top]]
        if kept.size == 0:  # none of the row's top 4 is allowed: the top 4 of the allowed tokens
            self.fallbacks += 1
            ids = np.flatnonzero(allowed)
            kept = ids[np.argsort(-logits[ids])[:TOP_K]]
        self.forced += allowed.sum() == 1
        weights = np.exp(logits[kept] - logits[kept].max())
        for token, q in zip(kept.tolist(), weights / weights.sum()):
            self._walk(prefix + [token], p * q)


@pytest.fixture(scope="module")
def reference(tiny_models) -> MaskedReference:
    return MaskedReference(tiny_models.target)


def test_the_reference_is_not_trivial(reference):
    assert abs(reference.probs.sum() - 1) < 1e-9 and len(reference.outcomes) >= 10
    assert reference.forced + reference.fallbacks > 0  # forced tokens or the masked row's law on this prompt


def sample(tiny_models, reference, capsys, tmp_path, *mode: str):
    grammar = tmp_path / "words.lark"
    grammar.write_text(LARK, encoding="utf-8")
    code = main(
        ["generate", PROMPT, "--target", str(tiny_models.target), *mode, "--grammar", str(grammar)]
        + ["--temperature", "1", "--top-k", str(TOP_K), "--top-p", "1", "--min-p", "0", "--max-tokens", "3"]
        + ["--n", str(RUNS), "--seed", "5", "--n-ctx", str(N_CTX), "--threads", str(THREADS), "--json"]
    )
    runs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and len(runs) == RUNS
    return law_of_runs(runs, reference), runs


SPECULATIVE = ["--verify", "pq", "--draft-max", "2", "--no-adaptive"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pq", "none"])
def test_generate_under_a_grammar_samples_the_masked_target_law(
    tiny_models, reference, mode, capsys, localspec_home, tmp_path
):
    flags = ["--draft", str(tiny_models.draft_noisy), *SPECULATIVE] if mode == "pq" else ["--drafter", "none"]
    verdict, runs = sample(tiny_models, reference, capsys, tmp_path, *flags)
    assert verdict.ok, verdict
    if mode == "pq":
        assert 0 < sum(r["stats"]["accepted"] for r in runs) < sum(r["stats"]["drafted"] for r in runs)


@pytest.mark.slow
def test_a_draft_told_its_unmasked_law_fails(tiny_models, reference, capsys, localspec_home, tmp_path, monkeypatch):
    """Negative control: the draft draws from its masked law and tells verification the unmasked one."""
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
    flags = ["--draft", str(tiny_models.draft_noisy), *SPECULATIVE]
    verdict, _ = sample(tiny_models, reference, capsys, tmp_path, *flags)
    assert not verdict.ok, verdict
