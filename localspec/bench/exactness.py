"""`localspec bench`'s exactness checks (DESIGN §6, T3 on the user's own pair): where a greedy speculative output
leaves plain decoding, and whether that is a near-tie — the top-2 gap of the plain path's logits there, beside how
far one batched decode and single-row decodes of the same positions land apart on this model and build
(`logit_noise`, DESIGN §8).
"""

from __future__ import annotations

import numpy as np

from localspec.core.engine import Engine

from .report import Divergence


def plain_logits(engine: Engine, prompt: list[int], before: list[int]) -> np.ndarray:
    """The target's logits for the token after `prompt + before`, computed the way plain decoding computed them:
    the prompt prefilled (all but its last token), then one single-row decode per token. A batched decode of the
    same positions can differ in the last bits (see `logit_noise`), enough to turn a near-tie.

    Returns:
        A (n_vocab,) copy.
    """
    target = engine.target
    target.sync(prompt[:-1])
    for token in [prompt[-1], *before]:
        target.append([token], outputs=1)
    return target.ctx.logits(-1).copy()


def top2_gap(engine: Engine, prompt: list[int], before: list[int]) -> float:
    """The gap between the two best logits of the plain path after `prompt + before` (`plain_logits`)."""
    row = plain_logits(engine, prompt, before)
    two = np.partition(row, row.shape[0] - 2)[-2:]
    return float(abs(two[1] - two[0]))


def logit_noise(engine: Engine, prompts: list[list[int]]) -> float:
    """max |Δlogit| between the target's rows of one batched decode of each prompt and single-row decodes of the
    same positions: how far apart "verify k+1 rows in one pass" and "decode them one by one" can land on this
    model and build. A greedy answer that leaves plain decoding where the top-2 gap is below it is a near-tie."""
    target, worst = engine.target, 0.0
    for prompt in prompts:
        rows = prompt[: min(512, target.ctx.n_ctx // 2)]  # the output rows of one decode fit in one batch
        target.rollback_to(0)
        target.append(rows, outputs=len(rows))
        batched = target.ctx.logits_block(len(rows)).copy()  # (n, n_vocab)
        target.rollback_to(0)
        for i, token in enumerate(rows):
            target.append([token], outputs=1)
            worst = max(worst, float(np.abs(target.ctx.logits(-1) - batched[i]).max()))
    return worst


def divergences(
    engine: Engine,
    prompts: list[list[int]],
    plain: dict[tuple[int, int], list[int]],
    outputs: dict[tuple[int, int], list[int]],
) -> tuple[Divergence, ...]:
    """Where each greedy output (by (round, prompt), first round only) leaves plain decoding's, with the top-2 gap of
    the plain path's logits there: below `logit_noise`, a near-tie."""
    found = []
    for (round_, p), tokens in sorted(outputs.items()):
        base = plain.get((round_, p))
        if base is None or round_ > 0:
            continue  # greedy outputs repeat across rounds: the first is enough
        i = next((i for i, (a, b) in enumerate(zip(base, tokens)) if a != b), None)
        if i is not None:
            found.append(Divergence(p, i, top2_gap(engine, prompts[p], base[:i])))
    return tuple(found)
