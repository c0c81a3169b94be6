"""Which streams of a shared batch draft, and how far (`serve --parallel`, DESIGN §8).

With several streams running, each tick decodes one row per stream in one pass of the target. A stream whose text
repeats itself (code edits, quoting, JSON) can add its own n-gram copy to that pass (core/ngram.py: free to draft,
a point law, so verification stays exact) and gain the tokens the target accepts for the rows they add. Whether that
pays depends on the machine: on a CPU every row costs its share of the compute; on a GPU a row is nearly free. Over
the slots' one pool any batch is one pass of the target (llama/slots.py `passes`). So `DecodeCosts` (core/costs.py)
learns each shape's seconds from the shared decodes, `Acceptance` (core/acceptance.py) learns each stream's per-token
acceptance α̂ from its own verified drafts, and `plan` picks a draft length for each stream — a stream whose drafts
are all taken drafts far, one whose drafts are often rejected a little or not at all — for the most expected tokens
per second: nothing unless that beats the plain tick by a margin, so sharing never costs the plain tick's speed.
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
LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16)  # draft lengths the plan weighs for a stream
ASCENT_STREAMS_MAX = 16  # more streams than this keep the best single length (the search grows as streams²)
SWEEPS = 3  # passes of the per-stream search over the streams at most


Option = tuple[StreamDraft, float]  # what a stream verifies, and the tokens it is expected to gain by it


def plan(
    candidates: Sequence[Candidate],
    costs: DecodeCosts,
    *,
    max_rows: int,
    draft_costs: DecodeCosts | None = None,
    overhead: float = 0.0,
    margin: float = MARGIN,
) -> list[StreamDraft]:
    """What each stream verifies in this tick, for the most expected tokens per predicted second: a length for each
    stream, from its copy or the draft model (where the model is expected to gain more than the copy at that length),
    or nothing. The search starts from the best single length for all (each stream's better option at that length),
    then changes one stream's option at a time while that is predicted faster (`_Prices`). All `NONE` unless the plan
    beats the plain tick by `margin`, or before the costs are known. The target's rows stay within `max_rows`.
    `overhead`: the seconds of a tick outside the decodes (each stream's step in Python), which fewer, longer ticks
    pay less often."""
    n = len(candidates)
    plain = costs.seconds(1, n) if n else None
    if plain is None or plain <= 0:
        return [NONE] * n
    prices = _Prices(candidates, costs, draft_costs, overhead, max_rows)
    options = [_options(c) for c in candidates]
    best: list[Option] = [(NONE, 0.0)] * n
    best_rate = prices.rate(best)
    longest = max((o.d for opts in options for o, _ in opts), default=0)
    for d in (d for d in LENGTHS if d <= longest):
        seed = [max((o for o in opts if o[0].d == d), key=lambda o: o[1], default=opts[0]) for opts in options]
        if (rate := prices.rate(seed)) > best_rate:
            best, best_rate = seed, rate
    if n <= ASCENT_STREAMS_MAX:
        best, best_rate = _ascend(best, best_rate, options, prices)
    if best_rate <= (1 + margin) * n / (plain + overhead):
        return [NONE] * n
    return [choice for choice, _ in best]


def _options(c: Candidate) -> list[Option]:
    """A stream's choices, nothing first: its copy at each length it reaches, and the draft model at each length its
    room allows (where the model drafts for it)."""
    found: list[Option] = [(NONE, 0.0)]
    for d in LENGTHS:
        if d > MAX_DRAFT:
            break
        if len(c.copy) >= d:
            found.append((StreamDraft(d, False), c.acceptance.expected(d, c.match)))
        if c.model is not None and c.room >= d:
            found.append((StreamDraft(d, True), c.model.expected(d, 0)))
    return found


def _ascend(
    plan: list[Option], rate: float, options: list[list[Option]], prices: _Prices
) -> tuple[list[Option], float]:
    """Each stream's option changed, one at a time, to the one predicted fastest beside the others', over up to
    `SWEEPS` passes, until none changes."""
    plan = list(plan)
    for _ in range(SWEEPS):
        changed = False
        for i, opts in enumerate(options):
            kept = plan[i]
            for option in opts:
                if option is kept:
                    continue
                plan[i] = option
                tried = prices.rate(plan)
                if tried > rate * (1 + 1e-9):
                    rate, kept, changed = tried, option, True
            plan[i] = kept
        if not changed:
            break
    return plan, rate


class _Prices:
    """The predicted tokens per second of a tick's plan: the streams' tokens (one each, and each one's expected gain)
    over the target's pass of all their rows, the draft model's passes and the tick's `overhead`.

    The draft model's passes for the streams it drafts for: one over their catch-ups, each its own length (each priced
    as when the model drafts every tick: the tokens emitted since, at most d + 1 — the rest of a cache further behind
    is paid once, that cost spread over the ticks left to the stream), then one a further drafted token, of the
    streams still drafting (a stream stops at its own length)."""

    def __init__(
        self,
        candidates: Sequence[Candidate],
        costs: DecodeCosts,
        draft_costs: DecodeCosts | None,
        overhead: float,
        max_rows: int,
    ) -> None:
        self.candidates, self.costs, self.draft_costs = candidates, costs, draft_costs
        self.overhead, self.max_rows = overhead, max_rows
        self._target: dict[int, float | None] = {}
        self._draft: dict[int, float | None] = {}

    def rate(self, plan: Sequence[Option]) -> float:
        """Expected tokens per predicted second (0 where over the rows or not priced)."""
        lengths = [1 + choice.d for choice, _ in plan]
        rows = sum(lengths)
        if rows > self.max_rows:
            return 0.0
        if (target := self._target.get(rows, -1.0)) == -1.0:
            target = self._target[rows] = self.costs.seconds(passes(lengths), rows)
        if target is None:
            return 0.0
        tokens = len(plan) + sum(gain for _, gain in plan)
        drafting = self._drafting(plan)
        seconds = target + drafting + self.overhead if drafting is not None else 0.0
        return tokens / seconds if seconds > 0 else 0.0

    def _drafting(self, plan: Sequence[Option]) -> float | None:
        drafted = [(i, choice.d, gain) for i, (choice, gain) in enumerate(plan) if choice.model]
        if not drafted:
            return 0.0
        caught = [min(self.candidates[i].catch_up, d + 1) for i, d, _ in drafted]
        seconds = self._draft_pass(sum(caught))
        for j in range(2, max(d for _, d, _ in drafted) + 1):
            seconds = _plus(seconds, self._draft_pass(sum(d >= j for _, d, _ in drafted)))
        for (i, _, gain), rows in zip(drafted, caught, strict=True):
            c = self.candidates[i]
            if (behind := c.catch_up - rows) > 0:
                once = self._draft_pass(behind) or 0.0
                seconds = _plus(seconds, once * (1 + gain) / max(1, c.remaining))
        return seconds

    def _draft_pass(self, rows: int) -> float | None:
        if self.draft_costs is None:
            return None
        if (seconds := self._draft.get(rows, -1.0)) == -1.0:
            seconds = self._draft[rows] = self.draft_costs.seconds(1, rows)
        return seconds


def _plus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b
