"""`AssistantDrafter`: drafting with a Gemma 4 assistant sidecar (`--draft mtp-….gguf`), one more `Drafter`.

The assistant holds no cache: it reads the target's (llama/assistant.py). Its first draft reads the last token and
the target's hidden row of the position before it, at the target's next position; each further draft stays at that
position, fed the previous draft and the assistant's own next hidden row. The target keeps the hidden rows of its
output rows only (what the verify pass and a plain step compute anyway), and the drafter copies them after each
target decode (`after_target_decode`, installed by `Engine.use_drafter`); where the row it needs is gone — after a
prompt read without outputs, a prompt-cache restore, a context shift — the target decodes its last token again
(`_rederive`), never a guess. Rollback is the target's alone. The draft's law is built from the assistant's full
logit row exactly as a draft model's (`draft_token`), so p/q, grammars, the adaptive length and auto-off apply.
For `serve --parallel`, each slot has a drafter of its own over its sequence of the assistant's one context
(`for_slot`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from localspec.llama.assistant import AssistantContext, output_hidden
from localspec.llama.slots import FedSeqContext, SeqContext

from .drafters import CostMeter, DraftLawBuilder, DraftRequest, Pick, Proposal, draft_loop, draft_token, drive_alone
from .kv import KVSequence, Progress
from .sampling import penalty_window


class AssistantDrafter:
    """`--drafter assistant`: a Gemma 4 assistant drafts beside the target, from its hidden rows and its cache.

    Args:
        target: the target's sequence; its context must keep its output rows' hidden states
            (`llama.assistant.emit_output_hidden`).
        ctx: the assistant's context, made beside the target's.
        output_rows: reads the target context's last decode's hidden rows of its output rows: () -> (n_outputs,
            n_embd) (`llama.assistant.output_hidden`).
        size_ratio: the assistant's weights over the target's (what the policy estimates its cost from).
    """

    kind = "assistant"
    batched = False  # it reads the target's own rows: it drafts for its stream itself
    needs_model = False  # its file loads with the target (`load_models`), not as the draft model
    drafts = True
    caches: tuple[KVSequence, ...] = ()  # it has none: the target's cache is the engine's already

    def __init__(
        self,
        target: KVSequence,
        ctx: AssistantContext | FedSeqContext,
        output_rows: Callable[[], np.ndarray],
        *,
        size_ratio: float,
    ) -> None:
        self.target, self.ctx = target, ctx
        self.meter = CostMeter((), contexts=(ctx,))
        self.laws = DraftLawBuilder()
        self.size_ratio = size_ratio
        self._output_rows = output_rows
        self._rows = (0, np.zeros((0, target.ctx.model.info.n_embd), np.float32))  # (first position, rows)
        self._marks = self._target_marks()  # the rows are stale once the target's positions moved or were restored
        self.after_target_decode = self._observe

    def for_slot(self, target: KVSequence, seq: int) -> AssistantDrafter:
        """The assistant's drafter for a slot (`serve --parallel`, core/slots.py): sequence `seq` of this assistant's
        context (made with the target's sequences), reading `target`, the slot's sequence of the target's context,
        and the hidden rows of that sequence's own rows (of a shared batch too)."""
        ctx, target_ctx = self.ctx, target.ctx
        assert isinstance(ctx, AssistantContext) and isinstance(target_ctx, SeqContext), "the pair's, then a slot's"
        view = FedSeqContext(ctx, seq)
        return AssistantDrafter(target, view, lambda: output_hidden(target_ctx), size_ratio=self.size_ratio)

    @property
    def n_ctx(self) -> int:
        return self.target.ctx.n_ctx

    def describe(self) -> str:
        """What the pre-flight found, for the user."""
        return f"draft: {self.ctx.model.path.name}, a Gemma 4 assistant reading the target's states"

    def _target_marks(self) -> tuple[int, int]:
        return self.target.n_dropped, self.target.n_restored

    def _observe(self, tokens: list[int], n_past: int) -> None:
        """After each target decode of `tokens` at n_past..: keep the hidden rows of its output rows (its last ones);
        the rows kept from before at positions n_past.. are stale now."""
        rows = self._output_rows()
        if len(rows) or self._marks != self._target_marks():
            self._rows = (n_past + len(tokens) - len(rows), rows)
        else:
            start, kept = self._rows
            self._rows = (start, kept[: max(0, n_past - start)])
        self._marks = self._target_marks()

    def _row(self, pos: int) -> np.ndarray | None:
        """The target's hidden row at `pos`, if it is still known."""
        start, rows = self._rows
        if self._marks != self._target_marks() or not start <= pos < start + len(rows):
            return None
        return rows[pos - start]

    def _rederive(self) -> None:
        """Decode the target's last token again with its output row, so its hidden row is known (`_observe`)."""
        target = self.target
        last = target.tokens[-1]
        target.rollback_to(target.n_past - 1)
        target.append([last], outputs=1)

    def _last_row(self, n: int) -> np.ndarray | None:
        """The target's hidden row of its last position where it holds n (re-derived where it is gone), else None."""
        if n < 1 or self.target.n_past != n:
            return None
        if self._row(n - 1) is None:
            self._rederive()
        return self._row(n - 1)

    def propose(self, request: DraftRequest) -> Proposal:
        history, sampling = request.history, request.sampling
        n = len(history) - 1  # the target holds history[:-1]: every draft sits at its next position, n
        row = self._last_row(n) if request.k else None
        if row is None:
            return Proposal(cost=self.meter.take())
        ctx, sampled = self.ctx, request.pq and not sampling.greedy
        ctx.follow_threads()
        recent = penalty_window(history, sampling)
        ctx.stage(row[None], n)
        ctx.decode([history[-1]], n, outputs=1)

        def decode(token: int) -> None:
            ctx.stage(ctx.hidden(-1)[None], n)  # a chained draft: its own next hidden row, at the same position
            ctx.decode([token], n, outputs=1)

        def pick(drafted: list[int]) -> Pick:  # `draft_token` masks its law under a grammar
            return draft_token(ctx, self.laws, recent, drafted, request, sampled)

        out = drive_alone(draft_loop(request.k, pick, p_min=request.p_min, constraint=request.constraint), decode)
        out.cost = self.meter.take()
        return out

    def prefill(self, prompt: list[int], *, progress: Progress | None = None) -> int:
        # The target's prompt read kept no output row: its last hidden row is derived now, not in the first step.
        self._last_row(len(prompt) - 1)
        self.meter.take()
        return 0

    def keep(self, n: int) -> None:
        pass  # nothing of its own to roll back: the target's rollback is the only one
