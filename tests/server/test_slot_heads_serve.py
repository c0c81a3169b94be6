"""`serve --parallel auto` with a draft head (issue 65): a pair whose drafter is the target's MTP head or a Gemma 4
assistant takes four slots, and requests running beside each other each draft with their slot's head (the real
`Runner` in-process, real llama.cpp: the tiny Gemma 4 pair, a tiny all-attention MTP model)."""

from __future__ import annotations

from support.tinyglm import write_glm_mtp_model

from localspec.models.flags import RunFlags
from localspec.server.request import Request as ServerRequest
from localspec.server.runner import Runner

FIXED = {"temperature": 0.0, "adaptive": False, "draft_max": 3}  # greedy, k fixed: the clock decides nothing
PROMPTS = [
    "the man said what the people who came to the house were there",
    "a cat sat on the mat and the dog was not there",
    "what the man said was that the people came",
    "the water was hot and the man said that",
]


def serve_four(flags: RunFlags, home, kind: str) -> None:
    """Four requests at once on automatic slots: four slots, each request drafted with `kind` and had drafts
    accepted, each text the one it gets on one slot."""
    alone = Runner(flags, home, parallel=1)
    try:
        alone.start()
        expected = [alone.submit(ServerRequest(None, p, max_tokens=40))[1].result(120) for p in PROMPTS]
    finally:
        alone.close()
    runner = Runner(flags, home, parallel=0)
    try:
        served = runner.start()
        assert runner.parallel == 4 and served.engine.target.ctx.n_seq == 4 and not served.engine.slots_note
        futures = [runner.submit(ServerRequest(None, p, max_tokens=40))[1] for p in PROMPTS]
        outcomes = [f.result(120) for f in futures]
        pool = runner.scheduler._pool
        assert pool is not None and pool._ticks > 0  # they stepped beside each other, in shared ticks
    finally:
        runner.close()
    for outcome, reference in zip(outcomes, expected, strict=True):
        stats = outcome.generations[0].stats
        assert stats.drafter == kind and stats.drafted > 0 and stats.accepted > 0
        assert outcome.generations[0].text == reference.generations[0].text


def test_an_assistant_pair_serves_four_slots(chat_home, tiny_gemma4):
    pair = {"target": str(tiny_gemma4.target), "draft": str(tiny_gemma4.assistant)}
    flags = RunFlags(**pair, n_ctx=256, threads=1, overrides=FIXED)
    serve_four(flags, chat_home, "assistant")


def test_an_mtp_pair_serves_four_slots(chat_home, tmp_path):
    path = write_glm_mtp_model(tmp_path / "tiny-glm-mtp.gguf", seed=1, output_scale=0.4)
    flags = RunFlags(target=str(path), drafter="mtp", n_ctx=256, threads=1, overrides=FIXED)
    serve_four(flags, chat_home, "mtp")
