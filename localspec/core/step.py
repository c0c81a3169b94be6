"""One step of the generation loop (DESIGN §1): draft k, verify them in ONE target pass, accept or reject, roll back.

`speculative_step` is the paper's Algorithm 1 for every drafter; k = 0 is plain decoding through the same code.
`TargetLaws` and `TargetArgmax` read the verify pass's k+1 rows lazily (a row after a rejection is never computed).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from .drafters import DraftCost, Drafter, DraftRequest, Proposal
from .kv import Context, KVSequence
from .sampling import Dist, SamplingParams, greedy_token, penalty_window, sampling_dist
from .stats import Step
from .verify import Verdict, verify_greedy, verify_match, verify_pq


class _VerifiedRows(Sequence):
    """The k+1 rows of a verify pass, read lazily: row i sees the drafts x_1..x_i as history."""

    def __init__(self, ctx: Context, recent: list[int], drafts: list[int], sampling: SamplingParams) -> None:
        self._ctx, self._recent, self._drafts, self._sampling = ctx, recent, drafts, sampling
        self._block: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._drafts) + 1

    def _logits(self, i: int) -> np.ndarray:
        """Row i's logits: the pass's rows are one block, found with two native calls whatever k is."""
        if not self._drafts:
            return self._ctx.logits(0)
        if self._block is None:
            self._block = self._ctx.logits_block(len(self._drafts) + 1)
        return self._block[i]

    def _history(self, i: int) -> list[int]:
        return self._recent + self._drafts[:i] if self._sampling.penalised else self._recent


class TargetLaws(_VerifiedRows):
    """The target's sampling laws for the k+1 verified rows, computed lazily."""

    def __init__(self, ctx: Context, recent: list[int], drafts: list[int], sampling: SamplingParams) -> None:
        super().__init__(ctx, recent, drafts, sampling)
        self._rows: dict[int, Dist] = {}

    def __getitem__(self, i: int) -> Dist:
        if i not in self._rows:
            self._rows[i] = sampling_dist(self._logits(i), self._history(i), self._sampling)
        return self._rows[i]


class TargetArgmax(_VerifiedRows):
    """The target's greedy tokens for the k+1 verified rows, computed lazily row by row (the rows after a mismatch
    are never read). Without penalties a row's token is its argmax — taken in the graph where the context has the
    device sampler (only the token id leaves the device), else from the logits; with penalties each row depends
    on the drafts before it and is computed from its logits."""

    def __init__(self, ctx: Context, recent: list[int], drafts: list[int], sampling: SamplingParams) -> None:
        super().__init__(ctx, recent, drafts, sampling)
        self._device = ctx.device_greedy and not sampling.penalised

    def __getitem__(self, i: int) -> int:
        if self._device:
            return self._ctx.sampled_token(i)
        return greedy_token(self._logits(i), self._history(i), self._sampling)


def speculative_step(target: KVSequence, drafter: Drafter, request: DraftRequest) -> Step:
    """Emit the next tokens: Algorithm 1 of Leviathan et al. (2023), one step. k = 0 is plain decoding.

    The target's cache holds history[:-1] before and history[:-1] + emitted[:-1] after; the draft's at most that.

    Returns:
        What happened: the emitted tokens (the accepted drafts, then one token from the target), the counts and
        the timings. `Stats` and the draft policy both learn from it.
    """
    clock, history = StepClock(target.ctx), request.history
    drafts = drafter.propose(request) if request.k else Proposal()  # 1. x_1..x_k from the draft's law
    clock.lap("draft")
    if target.needs_checkpoint and drafts.tokens:
        target.checkpoint()  # a cache that cannot drop a tail restores this instead
    target.append([history[-1], *drafts.tokens], outputs=len(drafts.tokens) + 1)  # 2. ONE pass: k+1 target rows
    clock.lap("verify")
    n_accepted, token = accept_or_reject(drafts, target.ctx, request)  # 3. keep x_i w.p. min(1, target/draft), +1
    clock.lap("sampling")
    target.rollback_to(len(history) + n_accepted)  # 4. drop the rejected drafts from both caches
    drafter.keep(len(history) + n_accepted)
    clock.lap("verify")
    emitted = tuple((t, True) for t in drafts.tokens[:n_accepted]) + ((token, False),)
    return Step(emitted, len(drafts.tokens), n_accepted, **clock.timings(drafts.cost))


def accept_or_reject(drafts: Proposal, ctx: Context, request: DraftRequest) -> Verdict:
    """How many drafts the target accepts, and the token it emits after them: greedy at T = 0, else p/q when the
    draft sampled from its law, else exact match."""
    sampling = request.sampling
    recent = penalty_window(request.history, sampling)
    if sampling.greedy:
        return verify_greedy(drafts.tokens, TargetArgmax(ctx, recent, drafts.tokens, sampling))
    laws = TargetLaws(ctx, recent, drafts.tokens, sampling)
    if request.sample:
        return verify_pq(drafts.tokens, drafts.dists, laws, request.rng)
    return verify_match(drafts.tokens, laws, request.rng)


class StepClock:
    """Where one step's time goes: wall seconds per phase, and the target's seconds inside llama_decode."""

    def __init__(self, target: Context) -> None:
        self._target, self._decoding = target, target.seconds_decoding
        self._seconds = {"draft": 0.0, "verify": 0.0, "sampling": 0.0}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        """The time since the previous lap was spent on `phase`."""
        now = time.perf_counter()
        self._seconds[phase] += now - self._last
        self._last = now

    def timings(self, draft: DraftCost) -> dict[str, float | int]:
        """`Step`'s timing fields: the phases, the target's decode time, and the drafter's own cost."""
        return {
            "seconds_draft": self._seconds["draft"],
            "seconds_verify": self._seconds["verify"],
            "seconds_sampling": self._seconds["sampling"],
            "seconds_verify_decode": self._target.seconds_decoding - self._decoding,
            "draft_decoded": draft.decoded,
            "seconds_draft_decode": draft.seconds_decode,
            "seconds_bridging": draft.seconds_bridging,
        }
