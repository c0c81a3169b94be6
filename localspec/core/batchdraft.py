"""Which streams of a shared batch draft, and how far (`serve --parallel`, DESIGN §8).

With several streams running, each tick decodes one row per stream in one pass of the target. A stream whose text
repeats itself (code edits, quoting, JSON) can add its own n-gram copy to that pass (core/ngram.py: free to draft,
a point law, so verification stays exact) and gain the tokens the target accepts for the rows they add. Whether that
pays depends on the machine: on a CPU every row costs its share of the compute; on a GPU a row is nearly free, but
llama.cpp splits a batch whose sequences bring different numbers of rows into one pass per distinct count
(llama/slots.py `passes`). So `DecodeCosts` (core/costs.py) learns each shape's seconds from the shared decodes,
`Acceptance` (core/acceptance.py) learns each stream's per-token acceptance α̂ from its own verified drafts, and `plan`
picks ONE draft length d and the streams that draft it (one more pass at most, not one per length) for the most
expected tokens per second — nothing unless that beats the plain tick by a margin, so sharing never costs the plain
tick's speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localspec.llama.slots import passes

from .acceptance import Acceptance
from .costs import DecodeCosts

MAX_DRAFT = 16  # longest copy a stream verifies in a shared tick: past this its rows cost more than they are worth
MARGIN = 0.05  # draft only when the plan is predicted at least this much faster than the plain tick


@dataclass(frozen=True, slots=True)
class Candidate:
    """One stream in a shared tick: its copy (empty: nothing to copy) and the length of the match it follows, and, where
    the draft model may draft for it, that model's acceptance for it and the rows its draft cache must catch up."""

    copy: Sequence[int]
    match: int
    acceptance: Acceptance
    room: int = 0  # most drafts its step may verify (the model drafts at most this many)
    model: Acceptance | None = None  # None: the draft model does not draft for it
    catch_up: int = 1  # tokens the draft decodes before its first draft (its last token at least)
    remaining: int = 0  # tokens it may still emit (capped): what a catch-up far behind is paid back over


@dataclass(frozen=True, slots=True)
class StreamDraft:
    """What one stream verifies in the tick: d drafts, from the draft model or copied (d = 0: its plain row)."""

    d: int = 0
    model: bool = False


NONE = StreamDraft()
LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16)  # draft lengths the plan weighs (all of them: 16 a tick for 64 slots is too slow)
MODEL_STREAMS_MAX = 8  # most streams the plan weighs the draft model for, best first
CATCH_UP_MAX = 64  # a draft cache further behind catches up on its own first, in chunks (`SlotPool.draft_shared`)


def plan(
    candidates: Sequence[Candidate],
    costs: DecodeCosts,
    *,
    max_rows: int,
    draft_costs: DecodeCosts | None = None,
    overhead: float = 0.0,
    margin: float = MARGIN,
) -> list[StreamDraft]:
    """What each stream verifies in this tick: one length d for all that draft; the draft model for the streams where
    it is expected to gain more than their copy (its cost: one pass of the draft over their catch-up rows, all made
    as long as the longest, then d - 1 passes of one row each, from `draft_costs`), copies for others, those that
    gain most first; the plan with the most expected tokens per predicted second — all `NONE` unless it beats the
    plain tick by `margin`, or before the costs are known. The target's rows stay within `max_rows`. `overhead`: the
    seconds of a tick outside the decodes (each stream's step in Python), which fewer, longer ticks pay less often.
    """
    n = len(candidates)
    plain = costs.seconds(1, n)
    if plain is None or plain <= 0:
        return [NONE] * n
    best_rate, best = (1 + margin) * n / (plain + overhead), [NONE] * n
    longest = max((max(len(c.copy), c.room if c.model is not None else 0) for c in candidates), default=0)
    for d in (d for d in LENGTHS if d <= min(MAX_DRAFT, longest)):
        copies, models = [], []
        for i, c in enumerate(candidates):
            copied = c.acceptance.expected(d, c.match) if len(c.copy) >= d else -1.0
            drafted = c.model.expected(d, 0) if c.model is not None and c.room >= d else -1.0
            if drafted > copied:
                models.append((drafted, i))
            if copied >= 0:
                copies.append((copied, i))
        models.sort(reverse=True)
        copies.sort(reverse=True)
        for m in range(min(len(models), MODEL_STREAMS_MAX) + 1):
            chosen = {i for _, i in models[:m]}
            drafting = 0.0
            if m:  # the catch-ups made one length (`SlotPool.draft_shared`): one pass, priced as when the model
                # drafts every tick (the tokens emitted since, at most d + 1); a cache further behind catches up once
                # on its own, that cost spread over the ticks left to the stream
                catch_up = max(min(candidates[i].catch_up, d + 1) for i in chosen)
                first = draft_costs.seconds(1, m * catch_up) if draft_costs is not None else None
                rounds = draft_costs.seconds(1, m) if draft_costs is not None else None
                if first is None or rounds is None:
                    break
                drafting = first + (d - 1) * rounds
                for gain, i in models[:m]:
                    behind = candidates[i].catch_up - catch_up
                    if behind > 0:
                        once = draft_costs.seconds(1, behind) or 0.0
                        drafting += once * (1 + gain) / max(1, candidates[i].remaining)
            lengths = [1 + d if i in chosen else 1 for i in range(n)]
            tokens = n + sum(gain for gain, _ in models[:m])
            rows = sum(lengths)
            if rows > max_rows:
                break
            picks = {i: StreamDraft(d, True) for i in chosen}
            for gain, i in [(None, None), *((g, i) for g, i in copies if i not in chosen)]:
                if i is not None:
                    if rows + d > max_rows:
                        break
                    tokens, rows, lengths[i] = tokens + gain, rows + d, 1 + d
                    picks[i] = StreamDraft(d, False)
                if not picks:
                    continue
                seconds = costs.seconds(passes(lengths), rows)
                if seconds and tokens / (seconds + drafting + overhead) > best_rate:
                    best_rate = tokens / (seconds + drafting + overhead)
                    best = [picks.get(j, NONE) for j in range(n)]
    return best
