"""`MtpDrafter`: drafting with the target's own MTP head (DESIGN §1), one more `Drafter`.

The head predicts the token after x_p from (x_p, the target's hidden row at p - 1), so its cache must follow the
target's: the target context tells the drafter after every llama_decode — prefill, verify, a checkpoint's re-decode,
a refill — through `after_target_decode` (which `Engine.use_drafter` installs), and the drafter queues those
positions with the rows just computed for the head, fed in one batch before the next draft (or every FEED_BATCH
positions), so a plain step costs a row copy. While drafting, each position is fed the head's own hidden row
from the one before; those positions are dropped again before the verify pass, which re-feeds them with the target's.
Where the head lacks a row the target no longer has, the target re-decodes from there (`_rederive`), never a guess;
a read of new tokens starts one token earlier where the head lacks the row before them (`KVSequence.read_start`).
For `serve --parallel`, each slot has a drafter of its own over its sequence of the head's one context (`for_slot`).
The draft's law is built from the head's full logit row exactly as a draft model's (`DraftLawBuilder`,
`greedy_token`).
"""

from __future__ import annotations

import numpy as np

from localspec.llama.mtp import FedContext
from localspec.llama.slots import FedSeqContext

from .drafters import CostMeter, DraftLawBuilder, DraftRequest, Pick, Proposal, draft_loop, draft_token, drive_alone
from .kv import KVSequence, Progress
from .sampling import penalty_window

FEED_BATCH = 32  # queued head positions fed in one decode (plain steps queue one each: a row copy, no decode)


class MtpDrafter:
    """`--drafter mtp`: the target's MTP head drafts, in its own cache on the target's model.

    Args:
        target: the target's sequence; its context must keep every row's hidden state (`llama.mtp.emit_hidden`).
        head: the head's sequence over a `llama.mtp.HeadContext` on the same model.
        hidden_rows: reads the target context's last decode's hidden rows: (ctx, n) -> (n, n_embd) array.
        size_ratio: the head's weights over the target's (what the policy estimates its cost from).
    """

    kind = "mtp"
    batched = False  # it reads the target's own rows: it drafts for its stream itself
    needs_model = False
    drafts = True

    def __init__(self, target: KVSequence, head: KVSequence, hidden_rows, *, size_ratio: float) -> None:
        self.target, self.head = target, head
        self.caches = (head,)
        self.meter = CostMeter(self.caches)
        self.laws = DraftLawBuilder()
        self.size_ratio = size_ratio
        self._hidden_rows = hidden_rows
        self._n_embd = target.ctx.model.info.n_embd
        self._block: tuple[int, np.ndarray] = (0, np.zeros((0, self._n_embd), np.float32))  # last decode's rows
        self._before: tuple[int, np.ndarray] | None = None  # the row just before that block, when known
        self._dropped = target.n_dropped  # a context shift moves the target's positions: the rows are stale then
        self._pending: tuple[list[int], list[np.ndarray]] = ([], [])  # positions head.n_past.. and their rows
        self.after_target_decode = self._observe  # installed on the target's context by `Engine.use_drafter`
        target.read_start = self._read_start

    def for_slot(self, target: KVSequence, seq: int) -> MtpDrafter:
        """The head's drafter for a slot (`serve --parallel`, core/slots.py): sequence `seq` of this head's context
        (made with a sequence per slot) following `target`, the slot's sequence of the target's context. It follows
        the target's decodes once the slot routes them to it (`SeqContext.after_decode`)."""
        head = self.head.ctx
        assert isinstance(head, FedContext), "a slot's head is a sequence of the pair's head context"
        view = FedSeqContext(head, seq)
        view.clear()
        return MtpDrafter(target, KVSequence(view, rollback="seq_rm"), self._hidden_rows, size_ratio=self.size_ratio)

    @property
    def n_ctx(self) -> int:
        return self.head.ctx.n_ctx

    def describe(self) -> str:
        """What the pre-flight found, for the user."""
        n = self.head.ctx.model.n_layer_nextn
        return f"draft head: {n} MTP layer{'s' if n > 1 else ''} (the target drafts for itself)"

    def _row(self, pos: int) -> np.ndarray | None:
        """The target's hidden row at `pos` if still known (zeros before the first position)."""
        if pos < 0:
            return np.zeros(self._n_embd, np.float32)
        if self.target.n_dropped != self._dropped:
            return None
        start, rows = self._block
        if start <= pos < start + len(rows):
            return rows[pos - start]
        if self._before is not None and self._before[0] == pos:
            return self._before[1]
        return None

    @property
    def n_fed(self) -> int:
        """Positions the head holds or has queued (`_pending`): what it will hold after the next `_feed`."""
        return self.head.n_past + len(self._pending[0])

    def _fed_token(self, pos: int) -> int:
        return self.head.tokens[pos] if pos < self.head.n_past else self._pending[0][pos - self.head.n_past]

    def _forget_from(self, n: int) -> None:
        """Forget the head's positions n.. (queued or cached)."""
        tokens, rows = self._pending
        if n >= self.head.n_past:
            self._pending = (tokens[: n - self.head.n_past], rows[: n - self.head.n_past])
        else:
            self._pending = ([], [])
            self.head.rollback_to(n)

    def _read_start(self, n: int) -> int:
        """Where the target's read of new tokens starts when it holds n of them: one earlier where the head holds
        position n - 1 but not the target's row there, which its position n reads; the read then brings that row,
        where the whole tail was read a second time (`_rederive`: a new prompt on a slot that shares its first
        token with the last one doubled the prompt's read)."""
        return n - 1 if 0 < n <= self.n_fed and self._row(n - 1) is None else n

    def _observe(self, tokens: list[int], n_past: int) -> None:
        """After each target decode of `tokens` at n_past..: queue for the head the positions whose rows are now
        known (fed in one batch by `_feed`, so a plain step costs a row copy, not a head decode)."""
        before = self._row(n_past - 1)
        self._before = None if before is None else (n_past - 1, before)
        self._block = (n_past, self._hidden_rows(self.target.ctx, len(tokens)))
        self._dropped = self.target.n_dropped
        # Position n_past's inputs (its token, the row before it) did not change when the head already has it.
        same = self.n_fed > n_past and self._fed_token(n_past) == tokens[0]
        keep = n_past + 1 if same else min(self.n_fed, n_past)
        self._forget_from(keep)
        if keep < n_past or (keep == n_past and before is None):
            return  # the head lags: the next proposal re-derives the rows it lacks
        rows = self._block[1][: len(tokens) - 1]  # row p - 1 feeds position p
        rows = [before, *rows] if keep == n_past else list(rows[keep - n_past - 1 :])
        self._pending[0].extend(tokens[keep - n_past :])
        self._pending[1].extend(rows)
        if len(self._pending[0]) >= FEED_BATCH:
            self._feed()

    def _feed(self) -> None:
        """Decode the queued positions into the head's cache (outputs 0: its output matrix is not run)."""
        tokens, rows = self._pending
        self._pending = ([], [])  # taken first: a feed cut short leaves a head that lags, never a wrong queue
        self._heal()
        if tokens:
            self.head.ctx.stage(np.stack(rows), self.head.n_past)  # (n, n_embd)
            self.head.append(tokens, outputs=0)

    def _heal(self) -> None:
        """A head append cut short (Ctrl+C) while the engine did not own the head (another drafter in use) left
        its cache and its tokens apart: bring them together before the next append."""
        if self.head.ctx.pos_range()[1] + 1 != self.head.n_past:
            self.head.repair()

    def _aligned(self, n: int) -> bool:
        """Whether the head holds positions 0..n-1 and the target's row at n - 1 is known (n = target.n_past)."""
        if self.n_fed > n:
            self._forget_from(n)
        self._feed()
        return self.head.n_past == n and self._row(n - 1) is not None

    def _rederive(self) -> None:
        """Re-decode the target's tail from the head's last position, so the head gets the rows it lacks."""
        target = self.target
        start = max(0, min(self.n_fed, target.n_past) - 1)
        tail = target.tokens[start:]
        target.rollback_to(start)
        target.append(tail, outputs=0)  # `_observe` feeds the head

    def propose(self, request: DraftRequest) -> Proposal:
        history, sampling, p_min = request.history, request.sampling, request.p_min
        n = len(history) - 1  # the target holds history[:-1]
        if not self._aligned(n):
            self._rederive()
        if not self._aligned(n) or request.k == 0:
            return Proposal(cost=self.meter.take())
        head, sampled = self.head, request.pq and not sampling.greedy
        recent = penalty_window(history, sampling)
        head.ctx.stage(self._row(n - 1)[None], n)
        head.append([history[-1]], outputs=1)  # position n: the last token and the target's row before it

        def decode(token: int) -> None:
            head.ctx.stage(head.ctx.hidden(-1)[None], head.n_past)  # its own row feeds the next drafted position
            head.append([token], outputs=1)

        def pick(drafted: list[int]) -> Pick:  # `draft_token` masks its law under a grammar
            return draft_token(head.ctx, self.laws, recent, drafted, request, sampled)

        out = drive_alone(draft_loop(request.k, pick, p_min=p_min, constraint=request.constraint), decode)
        head.rollback_to(n + 1)  # the drafted positions go; the verify pass feeds them with the target's rows
        out.cost = self.meter.take()
        return out

    def prefill(self, prompt: list[int], *, progress: Progress | None = None) -> int:
        # The target's prefill already queued the head's positions (`_observe`); a head that lags needs more.
        if not self._aligned(len(prompt) - 1):
            self._rederive()
            self._aligned(len(prompt) - 1)
        return self.meter.take().decoded  # the prompt's cost is the prefill's, not the first proposal's

    def keep(self, n: int) -> None:
        self._forget_from(min(n, self.n_fed))
