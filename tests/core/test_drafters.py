"""The n-gram (prompt lookup) drafter and the model+ngram combination: what they propose, and that they
load, draft and stay exact in the real engine and CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import GREEDY
from support.fakellm import LogitTable, fake_engine
from support.tinymodels import write_mtp_model

from localspec.cli.main import main
from localspec.core import kv
from localspec.core.drafters import (
    BUILDERS,
    Drafter,
    DraftRequest,
    ModelDrafter,
    NgramDrafter,
    NgramFirst,
    NoDrafter,
    Proposal,
    make_drafter,
)
from localspec.core.engine import Engine
from localspec.core.ngram import NgramIndex
from localspec.core.params import DRAFTERS, SpeculativeParams, needs_draft_model
from localspec.errors import InvalidParamsError

FIXED = SpeculativeParams(draft_max=6, adaptive=False)


@pytest.mark.parametrize(
    "history, k, n_min, want",
    [
        ([1, 2, 3, 4, 5, 1, 2, 3], 4, 2, [4, 5, 1, 2]),  # the 3-gram "1 2 3" seen before
        ([1, 2, 3, 4, 5, 9, 2, 3], 4, 2, [4, 5, 9, 2]),  # only the 2-gram "2 3"
        ([1, 2, 3, 4, 5, 9, 8, 3], 4, 2, []),  # only the 1-gram "3", which n_min 2 does not take
        ([7, 1, 2, 8, 1, 2, 9, 1, 2], 2, 2, [9, 1]),  # the latest occurrence wins
        ([1, 2, 1, 2], 5, 2, [1, 2, 1, 2, 1]),  # the copy runs on into its own tokens: a repeat is drafted to k
        ([5, 6, 7, 5, 6, 7, 8, 1, 5, 6, 7], 2, 2, [8, 1]),  # the 3-gram's latest occurrence, not an older one
        ([5], 3, 2, []),
    ],
)
def test_the_index_continues_the_latest_longest_match(history, k, n_min, want):
    index = NgramIndex()
    index.follow(history)
    assert index.continuation(k, n_min)[0] == want


def request(history: list[int], k: int, *, pq: bool = False, p_min: float = 0.0) -> DraftRequest:
    return DraftRequest(history=history, k=k, sampling=GREEDY, pq=pq, p_min=p_min, rng=np.random.default_rng(0))


def test_ngram_proposals_are_one_hot():
    proposal = NgramDrafter().propose(request([1, 2, 3, 1, 2], 3, pq=True, p_min=0.9))
    assert proposal.tokens == [3, 1, 2] and proposal.laws == [None, None, None]
    assert proposal.cost.decoded == 0  # no model ran


def test_no_drafter_proposes_nothing_and_owns_nothing():
    drafter = NoDrafter()
    assert isinstance(drafter, Drafter) and drafter.kind == "none" and drafter.caches == ()
    assert drafter.propose(request([1, 2, 1], 4)).tokens == [] and drafter.prefill([1, 2]) == 0


def test_model_plus_ngram_uses_the_model_without_a_match():
    target = LogitTable(5, seed=0)
    engine = fake_engine(target, LogitTable(5, seed=1, base=target, noise=0.3), "model+ngram")
    assert isinstance(engine.drafter, NgramFirst) and isinstance(engine.drafter.inner, ModelDrafter)
    (draft,) = engine.drafter.caches
    with_match = engine.drafter.propose(request([1, 2, 3, 4, 1, 2], 3))
    assert with_match.tokens == [3, 4, 1] and draft.n_past == 0 and with_match.cost.decoded == 0  # no model ran
    without = engine.drafter.propose(request([0, 1, 2, 3, 4], 3))
    assert len(without.tokens) == 3 and draft.n_past > 0
    assert without.cost.decoded == draft.n_decoded  # the model's own report: the history, then two drafts


REPEAT = "the man said what the man said what the man said what the man said"


@pytest.mark.parametrize("drafter", ["ngram", "model+ngram"])
@pytest.mark.slow
def test_lookup_drafters_in_the_real_engine_equal_plain_greedy(tiny_models, drafter):
    draft = tiny_models.draft_unrelated if drafter == "model+ngram" else None
    with Engine.load(tiny_models.target, draft, drafter=drafter, n_ctx=256) as engine:
        prompt = engine.tokenize(REPEAT)
        plain = engine.generate(prompt, sampling=GREEDY, spec=SpeculativeParams(draft_max=0), max_tokens=40)
        list(plain)
        spec = engine.generate(prompt, sampling=GREEDY, spec=FIXED, max_tokens=40)
        list(spec)
    assert spec.tokens == plain.tokens  # tiny F32 models: no near-tie on this prompt
    assert spec.stats.drafted > 0  # a random-weight model rarely repeats the prompt: acceptance is for bench_sampling


@pytest.mark.slow
def test_cli_ngram_drafter_and_its_errors(tiny_models, capsys, localspec_home):
    code = main(
        [
            "generate",
            REPEAT,
            "--target",
            str(tiny_models.target),
            "--drafter",
            "ngram",
            "--max-tokens",
            "12",
            "--seed",
            "1",
            "--no-adaptive",
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and json.loads(out)["stats"]["drafted"] > 0
    code = main(["generate", "hi", "--target", str(tiny_models.target), "--drafter", "model+ngram"])
    err = capsys.readouterr().err
    assert code == 1 and "--drafter model+ngram needs --draft PATH" in err
    with pytest.raises(InvalidParamsError, match="unknown drafter"):
        Engine.load(tiny_models.target, drafter="lookup")


@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.slow
def test_real_drafters_declare_what_they_need_and_own(tiny_models, tiny_gemma4, kind, tmp_path):
    draft = tiny_models.draft_noisy if needs_draft_model(kind) else None
    # The MTP head runs on the target's own model: a tiny qwen35 that carries one; the assistant is a Gemma 4
    # target's sidecar, which owns no cache (it reads the target's).
    target = write_mtp_model(tmp_path / "tiny-mtp.gguf") if kind == "mtp" else tiny_models.target
    if kind == "assistant":
        target, draft = tiny_gemma4.target, tiny_gemma4.assistant
    with Engine.load(target, draft, drafter=kind, n_ctx=256) as engine:
        drafter = engine.drafter
        assert isinstance(drafter, Drafter) and drafter.kind == kind
        if kind == "none":
            assert engine.caches == (engine.target,)
            return
        assert drafter.needs_model == (kind in ("model", "model+ngram"))
        # A drafter with a model owns exactly its cache, in the draft's context; a head its own on the target's
        # model; a lookup owns none.
        owned = [seq.ctx.model.path for seq in drafter.caches]
        assert owned == ([draft] if drafter.needs_model else [target] if kind == "mtp" else [])
        assert engine.caches == (engine.target, *drafter.caches)
        assert all(isinstance(seq.ctx, kv.Context) for seq in engine.caches)
        gen = engine.generate(engine.tokenize(REPEAT), sampling=GREEDY, spec=FIXED, max_tokens=8)
        list(gen)
        # The engine times and checks every declared cache: each one decoded and holds its tokens.
        assert all(seq.ctx.seconds_decoding > 0 and seq.n_past > 0 for seq in engine.caches)
        engine.check_invariants()


class Wrapped:
    """A drafter that is no `ModelDrafter` (no `seq`) but owns the draft's cache: only the protocol says so."""

    kind = "wrapped"
    needs_model = True
    drafts = True
    batched = True
    after_target_decode = None

    def __init__(self, inner: ModelDrafter) -> None:
        self.inner, self.caches, self.n_ctx, self.size_ratio = inner, inner.caches, inner.n_ctx, inner.size_ratio
        self.propose, self.keep, self.prefill, self.describe = inner.propose, inner.keep, inner.prefill, inner.describe


def test_the_engine_asks_the_protocol_not_the_class():
    target = LogitTable(5, seed=0)
    model = fake_engine(target, LogitTable(5, seed=1, base=target, noise=0.3), draft_size=250)
    drafter = Wrapped(model.drafter)
    assert isinstance(drafter, Drafter) and not hasattr(drafter, "seq")
    engine = Engine(model.target_model, model.target, drafter)
    (draft,) = drafter.caches
    assert engine.caches == (engine.target, draft)
    assert drafter.size_ratio == 0.25  # the draft's weights over the target's (what the policy estimates from)
    list(engine.generate([1, 2, 3, 4, 0], sampling=GREEDY, spec=FIXED, max_tokens=10))
    assert draft.n_past > 0  # the wrapped drafter ran
    draft.tokens.append(0)  # the token list runs ahead of the cache, as after a cut-short decode
    with pytest.raises(AssertionError, match="tokens say"):
        engine.check_invariants()
    engine.repair()
    engine.check_invariants()


class Head:
    """A stand-in for the target's MTP head (`MtpDrafter`, which needs a real target): what `make_drafter` reads."""

    kind = "mtp"
    needs_model = False
    drafts = True
    batched = False
    caches = ()
    n_ctx = 64
    size_ratio = 0.05
    after_target_decode = None

    def describe(self) -> str:
        return "draft head: 1 MTP layer"

    def propose(self, request: DraftRequest) -> Proposal:
        return Proposal()

    def keep(self, n: int) -> None:
        pass

    def prefill(self, prompt: list[int], *, progress=None) -> int:
        return 0


class Sidecar(Head):
    """A stand-in for a Gemma 4 assistant (`AssistantDrafter`, which needs a real target)."""

    kind = "assistant"
    size_ratio = 0.1

    def describe(self) -> str:
        return "draft: a Gemma 4 assistant"


def test_every_kind_has_a_builder():
    assert set(BUILDERS) == set(DRAFTERS)
    with pytest.raises(InvalidParamsError, match="unknown drafter 'lookup': one of model, ngram"):
        make_drafter("lookup")


@pytest.mark.parametrize("kind", DRAFTERS)
def test_make_drafter_builds_each_kind_or_says_why_not_in_one_line(kind):
    target = LogitTable(5, seed=0)
    model = fake_engine(target, LogitTable(5, seed=1, base=target, noise=0.3), draft_size=250).drafter
    head, sidecar = Head(), Sidecar()
    right = {"model": model, "model+ngram": model, "mtp": head, "assistant": sidecar}.get(kind)
    drafter = make_drafter(kind, right)
    assert isinstance(drafter, Drafter) and drafter.kind == kind
    assert drafter.drafts == (kind != "none") and drafter.needs_model == needs_draft_model(kind)
    assert drafter.size_ratio == {"model": 0.25, "model+ngram": 0.25, "mtp": 0.05, "assistant": 0.1}.get(kind, 0.0)
    assert drafter.describe() == right.describe() if kind in ("mtp", "assistant") else drafter.describe() == ""
    assert drafter.caches == (right.caches if right is not None else ())
    for wrong in (None, model, head, sidecar):
        if wrong is right:
            continue
        with pytest.raises(InvalidParamsError) as refused:
            make_drafter(kind, wrong)
        message = str(refused.value)
        assert message.startswith(f"the drafter {kind!r} drafts with") and "\n" not in message
        assert message.endswith("was given none" if wrong is None else f"was given the drafter {wrong.kind!r}")
