"""One step of the generation loop (DESIGN §1): draft k, verify them in ONE target pass, accept or reject, roll back.

`speculative_step` is the paper's Algorithm 1 for every drafter; k = 0 is plain decoding through the same code.
`TargetLaws` and `TargetArgmax` read the verify pass's k+1 rows lazily (a row after a rejection is never computed).
Where llama.cpp's chain builds the target's law (`target_chain`), a row is a `ChainRowLaw`: drawing from it is one
native call, and its law is rebuilt only when p/q needs its probabilities.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from localspec.errors import NonFiniteLogitsError
from localspec.llama.sampler import ChainLawBuilder

from .drafters import WHOLE_ROWS_MAX, DraftCost, Drafter, DraftRequest, Proposal, chain_law_builder, chain_law_fits
from .grammar import Constraint, TokenMask, masked, masked_argmax
from .kv import Context, KVSequence
from .laws import ChainRowLaw, Law
from .sampling import SamplingParams, greedy_token, penalty_window, sampling_law
from .stats import Step, StepTiming, TokenLogprob
from .verify import Verdict, verify_greedy, verify_match, verify_pq


class _VerifiedRows(Sequence):
    """The k+1 rows of a verify pass, read lazily: row i sees the drafts x_1..x_i as history. After tokens a grammar
    forced (`shifted`: decoded in the same batch before the drafts, their rows not output), row i is the pass's
    output row i - (k+1), counted from the end as llama.cpp does."""

    def __init__(
        self, ctx: Context, recent: list[int], drafts: list[int], sampling: SamplingParams, shifted: bool = False
    ) -> None:
        self._ctx, self._recent, self._drafts, self._sampling = ctx, recent, drafts, sampling
        self._base = -(len(drafts) + 1) if shifted else 0  # row i is the context's row _base + i
        self._block: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._drafts) + 1

    def _logits(self, i: int) -> np.ndarray:
        """Row i's logits: the pass's rows are one block, found with two native calls whatever k is."""
        if not self._drafts:
            return self._ctx.logits(self._base)
        if self._block is None:
            self._block = self._ctx.logits_block(len(self._drafts) + 1, self._base)
        return self._block[i]

    def _history(self, i: int) -> list[int]:
        return self._recent + self._drafts[:i] if self._sampling.penalised else self._recent


class TargetLaws(_VerifiedRows):
    """The target's sampling laws for the k+1 verified rows, computed lazily (by llama.cpp's chain where `chain`);
    under a grammar each row's law masked by the grammar at that row (core/grammar.py `masked`)."""

    def __init__(
        self,
        ctx: Context,
        recent: list[int],
        drafts: list[int],
        sampling: SamplingParams,
        chain: ChainLawBuilder | None = None,
        masks: RowMasks | None = None,
    ) -> None:
        super().__init__(ctx, recent, drafts, sampling, shifted=masks is not None and masks.shifted)
        self._chain, self._masks = chain, masks
        self._rows: dict[int, Law] = {}

    def __getitem__(self, i: int) -> Law:
        if i not in self._rows:
            if self._chain is not None:
                law: Law = ChainRowLaw(self._chain, self._ctx, self._base + i)
            else:
                law = sampling_law(self._logits(i), self._history(i), self._sampling)
            if self._masks is not None:
                law = masked(law, self._masks[i], lambda: self._logits(i), self._history(i), self._sampling)
            self._rows[i] = law
        return self._rows[i]


class RowMasks:
    """The grammar's mask at each verified row: row i's after the step's forced tokens and drafts x_1..x_i (pushed
    into the matcher as rows are read; a row after a draft the grammar forbids is never read: its draft is rejected
    with certainty, since the target's masked law gives it no mass)."""

    def __init__(self, constraint: Constraint, n_forced: int, drafts: list[int]) -> None:
        self._constraint, self._n_forced, self._drafts = constraint, n_forced, drafts
        self.shifted = n_forced > 0  # the forced tokens' rows come first in the pass, unread

    def __getitem__(self, i: int) -> TokenMask:
        mask = self._constraint.mask_at(self._n_forced + i, self._drafts, self._n_forced)
        assert mask is not None, "a row after a forbidden draft was read"
        return mask


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

    def __init__(
        self,
        ctx: Context,
        recent: list[int],
        drafts: list[int],
        sampling: SamplingParams,
        masks: RowMasks | None = None,
    ) -> None:
        super().__init__(ctx, recent, drafts, sampling, shifted=masks is not None and masks.shifted)
        self._device = ctx.device_greedy and not sampling.penalised
        self._masks = masks

    def __getitem__(self, i: int) -> int:
        if self._device:
            token = self._ctx.sampled_token(self._base + i)
        else:
            token = greedy_token(self._logits(i), self._history(i), self._sampling)
        if self._masks is None:
            return token
        return masked_argmax(token, self._masks[i], lambda: self._logits(i), self._history(i), self._sampling)


def speculative_step(target: KVSequence, drafter: Drafter, request: DraftRequest) -> Step:
    """Emit the next tokens: Algorithm 1 of Leviathan et al. (2023), one step. k = 0 is plain decoding.

    The target's cache holds history[:-1] before and history[:-1] + emitted[:-1] after; the draft's at most that.

    Returns:
        What happened: the emitted tokens (the accepted drafts, then one token from the target), the counts and
        the timings. `Stats` and the draft policy both learn from it.
    """
    clock, history, forced = StepClock(target.ctx), request.history, request.forced
    try:
        drafts = drafter.propose(request) if request.k else Proposal()  # 1. x_1..x_k from the draft's law
    except NonFiniteLogitsError as e:
        raise e.naming(f"the draft ({_model_name(drafter.caches)})", len(history)) from None
    if request.constraint is not None and drafts.tokens:
        drafts = admitted(drafts, request.constraint, forced)
    clock.lap("draft", ahead=drafts.cost.seconds_ahead)
    if drafts.tokens and target.needs_checkpoint(len(drafts.tokens)):
        target.checkpoint()  # a cache that cannot drop this tail restores this instead
    # 2. ONE pass: k+1 target rows (after the tokens a grammar forced, decoded in the same batch, rows unread)
    batch = [*history[len(history) - 1 - forced :], *drafts.tokens]
    target.append(batch, outputs=len(batch) if request.logprobs is not None else len(drafts.tokens) + 1)
    clock.lap("verify", ahead=target.ctx.seconds_ahead)  # a tick of this stream alone decoded the batch before
    try:
        n_accepted, token = accept_or_reject(drafts, target.ctx, request)  # 3. keep x_i w.p. min(1, target/draft), +1
    except NonFiniteLogitsError as e:
        raise e.naming(f"the target ({_model_name((target,))})", len(history)) from None
    emitted = tuple((t, False) for t in history[len(history) - forced :])
    emitted += tuple((t, True) for t in drafts.tokens[:n_accepted]) + ((token, False),)
    scores = None if request.logprobs is None else logprobs(target.ctx, emitted, len(batch), request.logprobs)
    clock.lap("sampling")
    target.rollback_to(len(history) + n_accepted)  # 4. drop the rejected drafts from both caches (and the grammar)
    drafter.keep(len(history) + n_accepted)
    if request.constraint is not None:
        request.constraint.end_step(forced + n_accepted, token)
    clock.lap("verify")
    return Step(emitted, len(drafts.tokens), n_accepted, drafts.cost.decoded, clock.timing(drafts.cost), scores)


def logprobs(ctx: Context, emitted: tuple[tuple[int, bool], ...], n_rows: int, top: int) -> tuple[TokenLogprob, ...]:
    """Each emitted token's log-probability, and the `top` most likely tokens at its position, under ONE law
    everywhere: the target's own distribution, the softmax of its raw logits at temperature 1 — before penalties,
    temperature, truncation and a grammar's mask (what llama-server reports; the law a token was sampled from
    depends on the settings, is one-hot at T 0, and gives forced tokens probability 1). Emitted token j was
    predicted by row j of the pass (`n_rows` rows, all output), so an accepted draft's log-probability is the
    target's, never the draft's."""
    out = []
    for j, (token, _) in enumerate(emitted):
        row = ctx.logits(j - n_rows).astype(np.float64)  # (n_vocab,)
        best = row.max()
        log_total = best + math.log(np.exp(row - best).sum())
        alternatives: tuple[tuple[int, float], ...] = ()
        if top:
            ids = np.argpartition(-row, top - 1)[:top]
            ids = ids[np.lexsort((ids, -row[ids]))]  # best first, the lower id among equals
            alternatives = tuple((int(i), float(row[i] - log_total)) for i in ids)
        out.append(TokenLogprob(float(row[token] - log_total), alternatives))
    return tuple(out)


def admitted(drafts: Proposal, constraint: Constraint, forced: int) -> Proposal:
    """The drafts as verification sees them under a grammar. A drafter that drafts under the grammar (a model draft:
    its law masked) has pushed its tokens already; the others' are pushed here while allowed. At the first token the
    grammar forbids, a one-hot draft (a lookup, a greedy draft: no randomness decided it) ends, exactly as if the
    drafter had stopped before it; a sampled one stays, and the target's masked law rejects it with certainty —
    cutting it would bias the draft's law, which must stay the one its tokens were drawn from."""
    for i, token in enumerate(drafts.tokens):
        if constraint.position > forced + i:
            continue  # pushed by the drafter
        if not constraint.push(token):
            if drafts.laws[i] is None:
                return Proposal(drafts.tokens[:i], drafts.laws[:i], drafts.cost)
            break
    return drafts


def _model_name(caches: Sequence[KVSequence]) -> str:
    """The file a drafter or the target reads its rows from, for a message."""
    return caches[0].ctx.model.path.name if caches else "its n-grams"


def accept_or_reject(drafts: Proposal, ctx: Context, request: DraftRequest) -> Verdict:
    """How many drafts the target accepts, and the token it emits after them: greedy at T = 0, else p/q when the
    draft sampled from its law, else exact match."""
    if request.chain is not None and not drafts.tokens and request.constraint is None:
        return 0, request.chain.draw(ctx, 0)  # a plain step: llama.cpp's chain draws, one native call
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
    masks = RowMasks(request.constraint, request.forced, drafts) if request.constraint is not None else None
    if sampling.greedy:
        return TargetArgmax(ctx, recent, drafts, sampling, masks)
    return TargetLaws(ctx, recent, drafts, sampling, request.chain, masks)


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
        self._ahead = 0.0  # the target's decode made ahead of the step (a tick of one stream), counted in `verify`

    def lap(self, phase: str, *, ahead: float = 0.0) -> None:
        """The time since the previous lap was spent on `phase`, and `ahead` seconds of it before the step began (its
        drafting or its decode, made in a shared tick of this stream alone: `serve --parallel`)."""
        now = time.perf_counter()
        self._seconds[phase] += now - self._last + ahead
        self._last = now
        if phase == "verify":
            self._ahead += ahead

    def timing(self, draft: DraftCost) -> StepTiming:
        """The step's timing: the phases, the target's decode time, and the drafter's own."""
        seconds = self._seconds
        return StepTiming(
            seconds_draft=seconds["draft"],
            seconds_verify=seconds["verify"],
            seconds_sampling=seconds["sampling"],
            seconds_draft_decode=draft.seconds_decode,
            seconds_verify_decode=self._target.seconds_decoding - self._decoding + self._ahead,
            seconds_bridging=draft.seconds_bridging,
        )
