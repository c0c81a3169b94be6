"""T3 (DESIGN §6): `localspec generate --n N` on a real tiny GGUF samples exactly the target's law.

At temperature 1 and top-k 4 the first three tokens have 64 possible outcomes; their law is computed here
from the target's own logits (one fresh llama.cpp decode per prefix, top-4 softmax written out by hand,
not through localspec.core.sampling) and compared with N completions of the real CLI with `--verify pq`,
`--verify match` (draft: `draft_noisy`) and `--drafter none`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.lawcheck import LawCheck, drafted_accepted, expected_tv, law_of_runs

from localspec.cli.main import main
from localspec.core.laws import ArrayLaw
from localspec.llama.context import Context
from localspec.llama.model import Model
from localspec.llama.sampler import CHAIN_LAW_ENV, ChainLawBuilder

PROMPT = "the man said what"  # chosen for a spread-out law and no near-tie at the top-4 boundary
TOP_K = 4
N_CTX = 64
THREADS = 1  # these 0.3 MB models decode 10-100× slower on two threads when the cores are shared
RUNS = {"pq": 6000, "pq-numpy": 6000, "pq-device": 6000, "match": 4000, "none": 3000}
MODES = {
    # the target's law from llama.cpp's chain (`ChainLawBuilder`: plain draws in C, verified rows rebuilt from its
    # survivors)
    "pq": ["--verify", "pq"],
    # the target's law from numpy (`sampling_law`), as on a context that samples in the graph
    "pq-numpy": ["--verify", "pq"],
    # the draft's law sampled in llama.cpp's graph (top-k + temperature; only k candidates leave it)
    "pq-device": ["--verify", "pq", "--device-sampling", "on"],
    "match": ["--verify", "match"],
    "none": ["--drafter", "none"],
}


class Reference:
    """The exact law of the first 3 tokens: `probs` over `outcomes` (plus nothing else)."""

    def __init__(self, target_path) -> None:
        self.min_gap = np.inf  # smallest gap between the 4th and 5th logit over the prefixes
        self.law: dict[tuple[int, ...], float] = {}
        with Model(target_path) as model, Context(model, n_ctx=N_CTX, n_threads=THREADS) as ctx:
            self.prompt = model.tokenize(PROMPT, add_special=True)
            self._ctx = ctx
            self._walk([], 1.0)
            self.batch_noise = self._batch_noise()
        self.outcomes = sorted(self.law)
        self.probs = np.array([self.law[o] for o in self.outcomes])  # (64,)

    def logits(self, prefix: list[int]) -> np.ndarray:
        """Row logits after prompt + prefix, decoded the way plain decoding does: one row at a time."""
        ctx, prompt = self._ctx, self.prompt
        ctx.clear()
        ctx.decode(prompt[:-1], 0, outputs=0)
        for i, token in enumerate([prompt[-1], *prefix]):
            ctx.decode([token], len(prompt) - 1 + i, outputs=1)
        return ctx.logits(0).astype(np.float64)  # (n_vocab,)

    def _walk(self, prefix: list[int], p: float) -> None:
        if len(prefix) == 3:
            self.law[tuple(prefix)] = p
            return
        logits = self.logits(prefix)
        order = np.argsort(-logits)  # (n_vocab,)
        self.min_gap = min(self.min_gap, logits[order[TOP_K - 1]] - logits[order[TOP_K]])
        top = order[:TOP_K]
        weights = np.exp(logits[top] - logits[top].max())  # temperature 1
        for token, q in zip(top.tolist(), weights / weights.sum()):
            self._walk(prefix + [token], p * q)

    def _batch_noise(self) -> float:
        """Largest |batched − single-row| logit over the verify batches the loop decodes."""
        ctx, prompt, worst = self._ctx, self.prompt, 0.0
        for first, second, _ in list(self.law)[::7]:
            singles = [self.logits([]), self.logits([first]), self.logits([first, second])]
            ctx.clear()
            ctx.decode(prompt[:-1], 0, outputs=0)
            ctx.decode([prompt[-1], first, second], len(prompt) - 1, outputs=3)
            for row, single in enumerate(singles):
                worst = max(worst, float(np.abs(ctx.logits(row) - single).max()))
        return worst


@pytest.fixture(scope="module")
def reference(tiny_models) -> Reference:
    return Reference(tiny_models.target)


def test_the_reference_is_honest(reference):
    """Why a single-row reference is fair to the batched loop.

    The speculative runs take rows from (k+1)-row verify batches, whose logits differ from single-row ones
    in the last bits (DESIGN §7). That moves each probability by a relative ~1e-3, far below the sampling
    noise at these N, and can change the top-4 set only at a near-tie: we check both, on this prompt.
    """
    assert len(reference.outcomes) == TOP_K**3 and abs(reference.probs.sum() - 1) < 1e-9
    assert reference.batch_noise < 0.01, reference.batch_noise
    assert reference.min_gap > 10 * reference.batch_noise, (reference.min_gap, reference.batch_noise)
    assert np.count_nonzero(reference.probs * min(RUNS.values()) >= 5) >= 15  # enough cells with data


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_generate_n_samples_the_target_law(tiny_models, reference, mode, capsys, localspec_home, monkeypatch):
    if mode == "pq-numpy":
        monkeypatch.setenv(CHAIN_LAW_ENV, "off")
    verdict, expected, drafted, accepted = sample_law(tiny_models, reference, mode, capsys)
    assert verdict.ok, verdict
    assert verdict.tv < 1.5 * expected, verdict
    if mode == "none":
        assert drafted == 0
    else:
        assert 0 < accepted < drafted  # both the accept and the reject path produced tokens


@pytest.mark.slow
def test_a_device_law_that_misstates_the_draws_fails(tiny_models, reference, capsys, localspec_home, monkeypatch):
    """Negative control of "pq-device": drafts drawn from the in-graph candidates' law while verification is told
    a sharper one (their logits doubled) — the bug a wrong temperature in the hand-over would be — fail the check."""
    real = ArrayLaw.from_logits

    class Misstated(ArrayLaw):
        __slots__ = ("drawn",)

        def sample(self, rng):
            return self.drawn.sample(rng)

    def misstated(ids, logits):
        told = real(ids, 2 * np.asarray(logits))
        out = Misstated(told.ids, told.probs)
        out.drawn = real(ids, logits)
        return out

    monkeypatch.setattr(ArrayLaw, "from_logits", staticmethod(misstated))
    verdict, *_ = sample_law(tiny_models, reference, "pq-device", capsys)
    assert not verdict.ok, verdict


@pytest.mark.slow
def test_a_chain_law_that_misstates_the_draws_fails(tiny_models, reference, capsys, localspec_home, monkeypatch):
    """Negative control of "pq": the chain draws the bonus tokens from its law while verification is told a sharper
    one (each probability squared, renormalised) — a rebuilt law that is not the one `dist` draws from fails."""
    real = ChainLawBuilder.law

    def misstated(self, ctx, i):
        ids, probs = real(self, ctx, i)
        squares = [p * p for p in probs]
        return ids, [s / sum(squares) for s in squares]

    monkeypatch.setattr(ChainLawBuilder, "law", misstated)
    verdict, *_ = sample_law(tiny_models, reference, "pq", capsys)
    assert not verdict.ok, verdict


def sample_law(tiny_models, reference, mode: str, capsys) -> tuple[LawCheck, float, int, int]:
    """N completions of `generate --n N` in `mode`: the law check of their first three tokens, the TV distance
    sampling noise alone would give, and the drafted and accepted counts."""
    n = RUNS[mode]
    draft = [] if mode == "none" else ["--draft", str(tiny_models.draft_noisy), "--draft-max", "2", "--no-adaptive"]
    code = main(
        [
            "generate",
            PROMPT,
            "--target",
            str(tiny_models.target),
            *draft,
            *MODES[mode],
            "--temperature",
            "1",
            "--top-k",
            str(TOP_K),
            "--top-p",
            "1",
            "--min-p",
            "0",
            "--max-tokens",
            "3",
            "--n",
            str(n),
            "--seed",
            "3",
            "--n-ctx",
            str(N_CTX),
            "--threads",
            str(THREADS),
            "--json",
        ]
    )
    runs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and len(runs) == n
    return law_of_runs(runs, reference), expected_tv(np.append(reference.probs, 0.0), n), *drafted_accepted(runs)
