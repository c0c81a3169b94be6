"""Context shifting: turn a cache that holds a conversation into one that holds it without its oldest turns.

When a chat outgrows n_ctx the session renders a shorter window of it. Without help the new prompt
shares only the system prompt with the caches, and both models re-read everything after it. Where the
memory can move positions, `plan_shift` finds the one span of the cached tokens that the shorter
rendering lacks, and `shift_caches` removes it from the target and the draft together and moves the
rest back, so only the new turn is decoded. The plan is checked token by token against the fresh
rendering: a template whose rendering changes when turns are dropped gets no shift, only a re-read.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from .kv import KVSequence, common_prefix

log = logging.getLogger(__name__)

MIN_SHIFT_GAIN = 32  # a shift must save at least this many decoded tokens to be worth doing


@dataclass(frozen=True, slots=True)
class Shift:
    """Drop `held[start:start+n]`; the shifted cache then holds `reused` tokens of the new prompt."""

    start: int
    n: int
    reused: int
    exact: bool  # the kept tokens equal the fresh rendering as far as the cache held the old one


def plan_shift(held: Sequence[int], old: Sequence[int], new: Sequence[int]) -> Shift | None:
    """The span to drop from a cache holding `held` so that it becomes a long prefix of `new`.

    Args:
        held: the tokens in the cache (a rendering of the conversation, maybe with an answer after it).
        old: the conversation rendered from the previous cut (what `held` should start with).
        new: the conversation rendered from the new, later cut (old turns left out).

    Returns:
        None when the cache does not hold the turns to drop (another conversation, a cleared cache).
    """
    n = len(old) - len(new)
    start = common_prefix(old, new)
    cached = common_prefix(held, old)
    if n <= 0 or start + n > cached:
        return None
    kept = [*held[:start], *held[start + n :]]
    reused = common_prefix(kept, new)
    return Shift(start, n, reused, exact=reused >= cached - n)


def worth_it(plan: Shift | None, held: Sequence[int], new: Sequence[int]) -> bool:
    """True when the shift saves enough decoding over a plain prefix reuse of `held`."""
    return plan is not None and plan.reused - common_prefix(held, new) >= MIN_SHIFT_GAIN


def can_shift(seqs: Sequence[KVSequence]) -> bool:
    """True when every cache can drop a span from the middle (target and draft move in lockstep)."""
    return all(seq.can_drop for seq in seqs)


def shift_caches(seqs: Sequence[KVSequence], old: Sequence[int], new: Sequence[int]) -> Shift | None:
    """Shift the target (`seqs[0]`) and the other caches for the same cut.

    A cache that does not hold the dropped span (a draft that sat out the last turn) is left alone: its
    next `sync` keeps the common prefix as usual.

    Returns:
        The target's plan when it was applied, else None (nothing changed).
    """
    target = seqs[0]
    plan = plan_shift(target.tokens, old, new)
    if not worth_it(plan, target.tokens, new):
        return None
    plans = [plan_shift(seq.tokens, old, new) for seq in seqs]
    if not all(own is None or seq.can_drop_span(own.start, own.n) for seq, own in zip(seqs, plans)):
        return None
    for seq, own in zip(seqs, plans):
        if own is not None and not seq.drop(own.start, own.n):
            # can_drop said yes; a refusal now means the memory is not what we think: start afresh.
            log.warning("%s: dropping a span failed; re-prefilling", seq.ctx.model.path.name)
            seq.rollback_to(min(own.start, seq.n_past))
    log.info(
        "context shift: dropped %d tokens at %d, %d reused%s",
        plan.n,
        plan.start,
        plan.reused,
        "" if plan.exact else " (the shortened rendering differs from the shifted tokens)",
    )
    return plan
