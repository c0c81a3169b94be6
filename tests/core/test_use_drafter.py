"""`Engine.use_drafter`: switching drafters between generations (the server's per-request drafter) on the real
llama.cpp with the tiny pair — the greedy text stays the plain one, the caches stay consistent, each drafter's
policy comes back when it is used again."""

from __future__ import annotations

from support import PROMPT, assert_identical, run_greedy

from localspec.core.drafters import make_drafter
from localspec.core.engine import Engine
from localspec.core.params import needs_draft_model


def test_drafters_share_the_draft_cache_and_keep_their_policies(tiny_models):
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512) as engine:
        prompt = engine.tokenize(PROMPT)
        plain = run_greedy(engine, prompt, k=0)
        model_drafter, model_policy = engine.drafter, engine.policy
        draft_seq = model_drafter.caches[0]
        for kind in ("ngram", "model+ngram", "none", "model"):
            drafter = make_drafter(kind, model_drafter if needs_draft_model(kind) else None)
            policy = engine.use_drafter(drafter, model_policy if kind == "model" else None)
            assert engine.caches == (engine.target, *drafter.caches)
            assert (policy is model_policy) == (kind == "model")
            gen = run_greedy(engine, prompt, k=4)
            assert_identical(tiny_models.target, prompt, plain.tokens, gen.tokens)
            if kind == "none":
                assert gen.stats.drafted == 0
            elif kind != "ngram":  # the lookup finds a match only where the text repeats
                assert gen.stats.drafted > 0
            engine.check_invariants()
            draft_seq.check()  # the shared draft cache holds exactly its token list, whoever used it last
