"""One step of the generation loop (DESIGN §1): draft k, verify them in ONE target pass, accept or reject, roll back.

`speculative_step` is the paper's Algorithm 1 for every drafter; k = 0 is plain decoding through the same code.
`TargetLaws` and `TargetArgmax` read the verify pass's k+1 rows lazily (a row after a rejection is never computed).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from .drafters import Drafter, Proposal
from .kv import Context, KVSequence
from .params import SpeculativeParams
from .sampling import Dist, SamplingParams, greedy_token, penalty_window, sampling_dist
from .stats import Step
from .verify import verify_greedy, verify_match, verify_pq


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


def speculative_step(
    target: KVSequence,
    drafter: Drafter | None,
    history: list[int],
    k: int,
    sampling: SamplingParams,
    spec: SpeculativeParams,
    rng: np.random.Generator,
) -> Step:
    """Emit the next tokens: draft k, verify in one target pass, roll back. k = 0 is plain decoding.

    The target's cache holds history[:-1] before and history[:-1] + emitted[:-1] after; the draft's
    holds at most that.

    Returns:
        What happened: the emitted tokens (the accepted drafts, then one token from the target), the
        counts and the timings. `Stats` and the draft policy both learn from it.
    """
    verify = "pq" if spec.verify == "auto" else spec.verify
    draft_caches = drafter.caches if drafter is not None else ()
    draft_decoded = drafter.n_decoded if drafter is not None else 0
    draft_decoding = _decoding(draft_caches)
    bridging = drafter.seconds_bridging if drafter is not None else 0.0
    t0 = time.perf_counter()
    drafts = Proposal()
    if drafter is not None and k > 0:
        drafts = drafter.propose(history, k, sampling, sample=verify == "pq", p_min=spec.p_min, rng=rng)
    t1 = time.perf_counter()
    target_decoding = target.ctx.seconds_decoding
    n = len(history)
    if target.needs_checkpoint and drafts.tokens:
        target.checkpoint()
    target.append([history[-1], *drafts.tokens], outputs=len(drafts.tokens) + 1)
    t2 = time.perf_counter()
    recent = penalty_window(history, sampling)
    if sampling.greedy:
        n_accepted, token = verify_greedy(drafts.tokens, TargetArgmax(target.ctx, recent, drafts.tokens, sampling))
    else:
        laws = TargetLaws(target.ctx, recent, drafts.tokens, sampling)
        if verify == "pq":
            n_accepted, token = verify_pq(drafts.tokens, drafts.dists, laws, rng)
        else:
            n_accepted, token = verify_match(drafts.tokens, laws, rng)
    t3 = time.perf_counter()
    target.rollback_to(n + n_accepted)
    if drafter is not None:
        drafter.keep(n + n_accepted)
    tokens = tuple((t, True) for t in drafts.tokens[:n_accepted]) + ((token, False),)
    return Step(
        tokens,
        len(drafts.tokens),
        n_accepted,
        seconds_draft=t1 - t0,
        seconds_verify=t2 - t1 + time.perf_counter() - t3,
        seconds_sampling=t3 - t2,
        draft_decoded=(drafter.n_decoded if drafter is not None else 0) - draft_decoded,
        seconds_draft_decode=_decoding(draft_caches) - draft_decoding,
        seconds_verify_decode=target.ctx.seconds_decoding - target_decoding,
        seconds_bridging=(drafter.seconds_bridging if drafter is not None else 0.0) - bridging,
    )


def _decoding(caches: tuple[KVSequence, ...]) -> float:
    """Seconds these caches' contexts have spent inside llama_decode so far."""
    return sum(seq.ctx.seconds_decoding for seq in caches)
