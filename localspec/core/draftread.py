"""When the draft model reads a long prompt, and how much of it (issue 65): a window of its last tokens
(`DraftWindow`), read only once drafting pays the read back (`DraftRead.pays`). Agents send long prompts and often
want a few tokens back: the window makes a read cost the same whatever the prompt's length, and the break-even rule
(the read at the draft's measured speed against what drafting saves on the tokens to come, as many as the recent
answers ran: `AnswerLengths`) keeps a short answer from reading at all. A draft that saw less is still exact:
verification decides (DESIGN §1, §3).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .costs import RecentMedian
from .kv import KVSequence, Progress, common_prefix, whole_images

if TYPE_CHECKING:
    from .params import SpeculativeParams
    from .policy import DraftPolicy
    from .sampling import SamplingParams
    from .stats import Stats

# The draft's window: the history's last WIDTH tokens, its start rounded down to a multiple of ALIGN (so one system
# prompt with different short messages after it keeps one window: the prompt cache restores it). Chosen by
# scripts/draft_window.py on the demo pair (docs/benchmarks.md "The draft's window"): 3.48 tokens a step at 128, 3.50
# at 256, 3.61 at 512, 3.87 with the whole prompt, each token read costing the draft 3-8 ms on 2 cores; keeping the
# template's first tokens before the window changed nothing (3.50 and 3.58 without them).
WIDTH = 128
ALIGN = 64
READ_FIRST_MAX = 64  # a read this short goes before the first token (the first step then drafts)
HORIZON_MAX = 256  # most tokens an answer is counted on still to give (max_tokens is often far above the answer)
SPEEDUP_PRIOR = 1.5  # speculation's speed-up over plain decoding before the policy has timed it
# One token read by the draft over one plain target step, before a read was timed (then learnt): the demo pair's is
# 0.15-0.3 on 2 cores, a GPU's far lower; 0.2 kept a 20-token prompt's draft from reading for a 12-token answer.
READ_PRIOR = 0.1
# A long read (over READ_FIRST_MAX tokens) must pay back this many times over: the speed-up is the policy's estimate
# from earlier answers, and a read that only broke even on it lost whenever it was optimistic (cold prompts, 128-token
# answers: 0.79-0.93x plain). A short one once: its cost is bounded, and a short prompt's draft then drafts at once.
PAYBACK = 2.0
LENGTHS_KEPT = 32  # recent answers whose lengths say how long the next one runs
LENGTHS_ENOUGH = 3  # answers that ran past t needed to say how far an answer at t goes (else max_tokens says)


@dataclass(frozen=True, slots=True)
class DraftWindow:
    """What the draft holds of the target's history: everything from `start` on (0: all of it), at positions 0.. of
    its own cache."""

    start: int = 0

    @property
    def skipped(self) -> int:
        """The history's tokens the draft does not hold (its context holds that many more of the history)."""
        return self.start

    def view(self, history: Sequence[int]) -> list[int]:
        """The draft's tokens for `history`."""
        return list(history[self.start :]) if self.start else list(history)

    def held(self, n: int) -> int:
        """How many of the draft's tokens stand for the history's first n."""
        return max(0, n - self.start)


def aligned(prompt: Sequence[int], width: int = WIDTH) -> DraftWindow:
    """The window of `width` (and less than `ALIGN` more) at the end of `prompt`: all of it when that is short."""
    start = whole_images(prompt, max(0, len(prompt) - width) // ALIGN * ALIGN)  # never inside an image
    return DraftWindow(start if start < len(prompt) - 1 else 0)


class AnswerLengths:
    """How long the recent answers ran (in tokens, and whether max_tokens cut them): how many more tokens an answer
    that has given t is expected to give (`remaining`). A read counted on max_tokens was paid back only by the answers
    that run that long: cold 1,350-token prompts with max_tokens 128, whose answers mostly end after 10-30 tokens, ran
    0.83x `--drafter none` (docs/benchmarks.md)."""

    def __init__(self, kept: int = LENGTHS_KEPT) -> None:
        self._recent: deque[tuple[int, bool]] = deque(maxlen=kept)

    def add(self, tokens: int, cut: bool) -> None:
        """An answer ended after `tokens` tokens: by itself, or cut by its max_tokens (it would have run on)."""
        self._recent.append((tokens, cut))

    def remaining(self, given: int, limit: int) -> float | None:
        """The tokens an answer that has given `given` is expected still to give, `limit` at most: the Kaplan-Meier
        estimate over the recent answers that ran past `given` (a cut answer counts as running at least as long as it
        ran), flat past the last ending seen; None while fewer than `LENGTHS_ENOUGH` ran past it."""
        past = [(n, cut) for n, cut in self._recent if n > given]
        if len(past) < LENGTHS_ENOUGH or limit <= 0:
            return None
        total, alive, start = 0.0, 1.0, given + 1  # alive: the chance the answer gives the token at `start`
        for end in sorted({n for n, cut in past if not cut}):
            if end >= given + limit:
                break
            total += alive * (end - start + 1)  # it gives every token up to `end` with that chance
            at_risk = sum(n >= end for n, _ in past)
            alive *= 1 - sum(n == end and not cut for n, cut in past) / at_risk
            start = end + 1
        return total + alive * (given + limit - start + 1)


class DraftReads:
    """A draft model's reads of the target's history, kept with its cache across generations: the window this
    generation reads (`window`, aimed by `aim`), the one its cache's tokens are under (`held`), and the seconds a token
    read costs here (`seconds`, learnt from its reads).

    Args:
        seq: the draft model's sequence.
        width: the window's width (None: the whole history, as before issue 65).
    """

    def __init__(self, seq: KVSequence, width: int | None = WIDTH) -> None:
        self.seq, self.width = seq, width
        self.window = self.held = DraftWindow()
        self.synced = False  # its cache was synced under `window` since `aim` (its drafts then follow the history)
        self.seconds = RecentMedian(8)  # seconds per token of its recent reads
        self.lengths = AnswerLengths()  # how long the answers it drafted for (or did not) ran

    def aim(self, prompt: Sequence[int]) -> None:
        """Choose the window for a generation continuing `prompt`: of all of it, the window the cache holds and the
        aligned one, the one with the most context among those whose read is within `READ_FIRST_MAX` tokens of the
        cheapest — all of it where the cache holds it or the prompt cache restores it (a chat's next turn), the held
        window where the chat grew by a turn, else the aligned window; each within the draft's context."""
        fresh = DraftWindow() if self.width is None else aligned(prompt, self.width)
        room = self.seq.ctx.n_ctx - 1
        candidates = {fresh} | {
            window
            for window in (DraftWindow(), self.held)
            if window.start < len(prompt) - 1 and len(prompt) - window.skipped <= room
        }
        unread = {window: self.unread(prompt, window) for window in candidates}
        cheapest = min(unread.values())
        self.window = min((w for w in candidates if unread[w] <= cheapest + READ_FIRST_MAX), key=lambda w: w.start)
        self.synced = False

    def unread(self, prompt: Sequence[int], window: DraftWindow | None = None) -> int:
        """Tokens the draft must read to draft after `prompt` (all but its last: the first proposal decodes that)."""
        view = (window or self.window).view(prompt[:-1])
        return len(view) - self.seq.reusable(view)

    def view(self, history: Sequence[int]) -> list[int]:
        """The draft's tokens for `history` under this generation's window, which its cache then holds."""
        self.held, self.synced = self.window, True
        return self.window.view(history)

    def kept(self, n: int) -> int:
        """How many of its cache's tokens stay once the history's first n are final: those standing for them, or all
        where the cache was not synced this generation (the draft has not read: what it holds may be restored later,
        and it drafted nothing to forget)."""
        return self.window.held(n) if self.synced else self.seq.n_past


class Drafter(Protocol):
    """What a `DraftRead` asks of a drafter: core/drafters.py's `Drafter`, in part (that module imports this one: its
    `ModelDrafter` keeps a `DraftReads`)."""

    @property
    def caches(self) -> tuple[KVSequence, ...]: ...

    def prefill(self, prompt: list[int], *, progress: Progress | None = None) -> int: ...


def _behind(drafter: Drafter, found: Callable[[object], object]) -> object:
    """The first non-None `found(d)` for `drafter` and the drafters it wraps (`inner`), outermost first."""
    held: object = drafter
    while held is not None:
        if (it := found(held)) is not None:
            return it
        held = getattr(held, "inner", None)
    return None


def reads_of(drafter: Drafter) -> DraftReads | None:
    """The draft model's reads behind `drafter` (a `ModelDrafter`'s or a `BridgedDrafter`'s, or the one a wrapper
    drafts with); None where the drafter has none (a head, n-grams)."""
    reads = _behind(drafter, lambda held: r if isinstance(r := getattr(held, "reads", None), DraftReads) else None)
    return reads if isinstance(reads, DraftReads) else None


def spelled(drafter: Drafter, prompt: Sequence[int]) -> list[int]:
    """`prompt` in the tokens the draft behind `drafter` reads: its own spelling for a draft with another vocabulary
    (a `BridgedDrafter`'s `spell`), else the prompt itself. Its window and what it has read are counted in these."""
    spell = _behind(drafter, lambda held: f if callable(f := getattr(held, "spell", None)) else None)
    return list(spell(prompt)) if callable(spell) else list(prompt)


class Asking(Protocol):
    """What a `DraftRead` reads of its generation (core/generation.py's `Generation`)."""

    stats: Stats
    tokens: list[int]
    max_tokens: int
    spec: SpeculativeParams
    sampling: SamplingParams


class DraftRead:
    """One generation's read of its prompt by the draft: how much (the window, aimed at the start) and when — before
    the first token where it is short, else once drafting pays for it (`pays`), else never.

    Args:
        drafter: the generation's drafter.
        policy: its draft-length policy (the speed-up it predicts).
        prompt: the generation's prompt.
    """

    def __init__(self, drafter: Drafter, policy: DraftPolicy, prompt: Sequence[int]) -> None:
        self.drafter, self.policy = drafter, policy
        self.reads = reads_of(drafter)
        self.declined = False  # `pays` said no after the first token: it will not say yes later
        if self.reads is not None:  # in the tokens it reads (a bridged draft's own spelling)
            words = spelled(drafter, prompt)
            self.reads.aim(words)
            self.unread = self.reads.unread(words)
        else:  # no window: all of the prompt past what a cache holds
            held = list(prompt[:-1])
            self.unread = max((len(held) - common_prefix(seq.tokens, held) for seq in drafter.caches), default=0)

    def later(self, generation: Asking) -> bool:
        """Whether the draft reads after the first token (the first step is plain), if ever, not before it: where it
        has more than `READ_FIRST_MAX` to read, or where reading it does not pay yet."""
        return self.unread > READ_FIRST_MAX or not self.pays(generation)

    def pays(self, generation: Asking) -> bool:
        """Whether reading now pays (a long read twice over): the read against speculation's saving on the tokens to
        come — as many as the recent answers that ran this far went on to give (`AnswerLengths`), else all that
        max_tokens allows, `HORIZON_MAX` at most. In units of the plain steps this generation timed; with a seed at
        T > 0, estimates alone (whether the draft reads must not depend on the clock: the sampled text would too)."""
        if not generation.spec.adaptive or not self.unread:
            return True  # nothing to read, or a fixed draft length: it drafts every step it can, so it reads
        if self.declined:
            return False
        if self.policy.off:  # plain decoding was faster at the policy's last verdict: the read is its probe's (the
            # probe that opens a generation, priced by the policy); weighed here on a speed-up under 1 it was never
            # made, the probe never ran and every answer after stayed plain
            return self.policy.wants_draft(True)
        stats, given = generation.stats, len(generation.tokens)
        bound = min(generation.max_tokens - given, HORIZON_MAX)
        expected = self.reads.lengths.remaining(given, bound) if self.reads is not None else None
        timed = generation.sampling.seed is None or generation.sampling.greedy
        plain = (stats.seconds_verify + stats.seconds_sampling) / max(stats.target_passes, 1)
        read = READ_PRIOR
        if timed and self.reads is not None and self.reads.seconds.n and plain > 0:
            read = self.reads.seconds.value / plain
        speedup = SPEEDUP_PRIOR
        costs = self.policy.costs if timed and self.policy.costs.missing() is None else self.policy.estimate
        if costs is self.policy.costs:
            speedup = self.policy.best(max(generation.spec.draft_max, 1), costs)[1]
        if speedup <= 1.0:  # the policy is on (its keep rule: an optimistic α̂ still predicts a gain) while α̂ does not:
            # the read is its to judge by the drafts it verifies next. Declined here, no step ever asked the policy
            # again — the answer stayed plain, so did every answer after it ("too few tokens to come", seen at T 0.8)
            return True
        fixed = costs.draft_ratio()  # what any read costs besides its tokens: a draft decode
        saving = 1.0 - 1.0 / speedup  # plain steps saved per token
        cost = (PAYBACK if self.unread > READ_FIRST_MAX else 1.0) * (self.unread * read + fixed)
        # Declined once the first token's step is timed and even max_tokens' horizon, which only shrinks, would not pay
        # it back; declined on the recent answers' lengths, it is weighed again at the next token: an answer that runs
        # on past the short ones is expected to run longer.
        self.declined = cost > saving * bound and given > 0
        return cost <= saving * (bound if expected is None else expected)

    def finished(self, tokens: int, cut: bool) -> None:
        """The generation ended after `tokens` tokens (`cut`: by its max_tokens): the next ones' horizon learns it."""
        if self.reads is not None:
            self.reads.lengths.add(tokens, cut)

    def read(self, history: list[int], progress: Progress | None = None) -> int:
        """The drafter reads `history` (but its last token) under the window; returns the tokens it decoded, its speed
        learnt.

        Raises:
            PrefillStopped: `progress` asked to stop.
        """
        t0 = time.perf_counter()
        decoded = self.drafter.prefill(history, progress=progress)
        if self.reads is not None and decoded >= 32:
            self.reads.seconds.add((time.perf_counter() - t0) / decoded)
        self.unread = 0
        return decoded
