"""One step of the generation loop (DESIGN §1): draft k, verify them in ONE target pass, accept or reject, roll back.

`speculative_step` is the paper's Algorithm 1 for every drafter; k = 0 is plain decoding through the same code.
`TargetLaws` and `TargetArgmax` read the verify pass's k+1 rows lazily (a row after a rejection is never computed).
Where llama.cpp's chain builds the target's law (`target_chain`), a row is a `ChainRowLaw`: drawing from it is one
native call, and its law is rebuilt only when p/q needs its probabilities.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from localspec.errors import NonFiniteLogitsError
from localspec.llama.sampler import ChainLawBuilder

from .drafters import WHOLE_ROWS_MAX, DraftCost, Drafter, DraftRequest, Proposal, chain_law_builder, chain_law_fits
from .kv import Context, KVSequence
from .laws import ChainRowLaw, Law
from .sampling import SamplingParams, greedy_token, penalty_window, sampling_law
from .stats import Step, StepTiming
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
    """The target's sampling laws for the k+1 verified rows, computed lazily (by llama.cpp's chain where `chain`)."""

    def __init__(
        self,
        ctx: Context,
        recent: list[int],
        drafts: list[int],
        sampling: SamplingParams,
        chain: ChainLawBuilder | None = None,
    ) -> None:
        super().__init__(ctx, recent, drafts, sampling)
        self._chain = chain
        self._rows: dict[int, Law] = {}

    def __getitem__(self, i: int) -> Law:
        if i not in self._rows:
            if self._chain is not None:
                self._rows[i] = ChainRowLaw(self._chain, self._ctx, i)
            else:
                self._rows[i] = sampling_law(self._logits(i), self._history(i), self._sampling)
        return self._rows[i]


def target_chain(
    ctx: Context, sampling: SamplingParams, rng: np.random.Generator, *, drafting: bool = True
) -> ChainLawBuilder | None:
    """llama.cpp's chain for the target's law during one generation, where it builds ours (`chain_law_fits`) and is
    the cheaper: at most `WHOLE_ROWS_MAX` tokens, or a generation that never drafts (past that size its C loop over
    every token costs more than numpy's cut on the verified rows; a plain step's single draw still gains). None:
    numpy. Its draws are seeded from `rng`, so a fixed seed still gives the same text."""
    if not chain_law_fits(ctx, sampling) or (drafting and ctx.n_vocab > WHOLE_ROWS_MAX):
        return None
    return chain_law_builder(sampling, seed=int(rng.integers(2**32)))


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
    try:
        drafts = drafter.propose(request) if request.k else Proposal()  # 1. x_1..x_k from the draft's law
    except NonFiniteLogitsError as e:
        raise e.naming(f"the draft ({_model_name(drafter.caches)})", len(history)) from None
    clock.lap("draft")
    if drafts.tokens and target.needs_checkpoint(len(drafts.tokens)):
        target.checkpoint()  # a cache that cannot drop this tail restores this instead
    target.append([history[-1], *drafts.tokens], outputs=len(drafts.tokens) + 1)  # 2. ONE pass: k+1 target rows
    clock.lap("verify")
    try:
        n_accepted, token = accept_or_reject(drafts, target.ctx, request)  # 3. keep x_i w.p. min(1, target/draft), +1
    except NonFiniteLogitsError as e:
        raise e.naming(f"the target ({_model_name((target,))})", len(history)) from None
    clock.lap("sampling")
    target.rollback_to(len(history) + n_accepted)  # 4. drop the rejected drafts from both caches
    drafter.keep(len(history) + n_accepted)
    clock.lap("verify")
    emitted = tuple((t, True) for t in drafts.tokens[:n_accepted]) + ((token, False),)
    return Step(emitted, len(drafts.tokens), n_accepted, drafts.cost.decoded, clock.timing(drafts.cost))


def _model_name(caches: Sequence[KVSequence]) -> str:
    """The file a drafter or the target reads its rows from, for a message."""
    return caches[0].ctx.model.path.name if caches else "its n-grams"


def accept_or_reject(drafts: Proposal, ctx: Context, request: DraftRequest) -> Verdict:
    """How many drafts the target accepts, and the token it emits after them: greedy at T = 0, else p/q when the
    draft sampled from its law, else exact match."""
    if request.chain is not None and not drafts.tokens:  # a plain step: llama.cpp's chain draws, one native call
        return 0, request.chain.draw(ctx, 0)
    rows = target_rows(drafts.tokens, ctx, request)
    if isinstance(rows, TargetArgmax):
        return verify_greedy(drafts.tokens, rows)
    if request.pq:
        return verify_pq(drafts.tokens, drafts.laws, rows, request.rng)
    return verify_match(drafts.tokens, rows, request.rng)


def target_rows(drafts: list[int], ctx: Context, request: DraftRequest) -> TargetArgmax | TargetLaws:
    """The verify pass's k+1 rows as verification reads them: the target's argmax at T = 0, else its laws."""
    sampling = request.sampling
    recent = penalty_window(request.history, sampling)
    if sampling.greedy:
        return TargetArgmax(ctx, recent, drafts, sampling)
    return TargetLaws(ctx, recent, drafts, sampling, request.chain)


def verified_rows(drafts: list[int], ctx: Context, request: DraftRequest) -> None:
    """Read every row of a verify pass as verification does when each draft is accepted: the argmax (T = 0), or
    the law's probability of the draft, then the last row's draw. `localspec bench` times it (its yardstick)."""
    rows = target_rows(drafts, ctx, request)
    if isinstance(rows, TargetArgmax):
        for i in range(len(drafts) + 1):
            rows[i]
        return
    for i, token in enumerate(drafts):
        rows[i].prob(token)
    rows[len(drafts)].sample(request.rng)


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

    def timing(self, draft: DraftCost) -> StepTiming:
        """The step's timing: the phases, the target's decode time, and the drafter's own."""
        seconds = self._seconds
        return StepTiming(
            seconds_draft=seconds["draft"],
            seconds_verify=seconds["verify"],
            seconds_sampling=seconds["sampling"],
            seconds_draft_decode=draft.seconds_decode,
            seconds_verify_decode=self._target.seconds_decoding - self._decoding,
            seconds_bridging=draft.seconds_bridging,
        )
