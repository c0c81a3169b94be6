"""`SeqContext`: one sequence of a several-sequence `Context` (`serve --parallel`), seen as a context of its own, so
a `KVSequence` and the one generation step work on it unchanged; `decode_shared`: each active stream's next rows
in ONE `llama_decode`, handed to each stream's own next decode (DESIGN §8, several clients); `passes`: how many
passes over the weights llama.cpp makes of such a batch.

A stream's step decodes [its last token] (and the drafts it verifies, if any) at n_past and reads those rows.
`decode_shared` decodes them for every stream ahead of their steps and keeps them as pending; the step's `decode`
finds its tokens decoded and reads the shared batch's rows instead of decoding. A step that decodes something else
(a grammar's forced tokens, a speculative pass of its own) first removes the pending cells and decodes alone.
Pending rows no step took are removed (`discard`). A draft head that reads the target's rows has one context with a
sequence per slot (`FedSeqContext`), each told of its own sequence's decodes (`route_decodes`, `after_decode`), its
rows of a shared batch among them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from localspec.errors import ContextError

from .context import Context
from .mtp import FedContext


class SharedRows(NamedTuple):
    """A sequence's rows of a shared batch, waiting for its next decode (`decode_shared`)."""

    tokens: tuple[int, ...]
    n_past: int  # where they start in the sequence
    first: int  # their first row in the batch
    outputs: int  # rows output at their end
    decode: int  # the parent's decodes when they were decoded (their logits are the parent's last while it holds)
    alone: float | None = None  # the batch's seconds where these were its only rows (a tick of one stream), else None


class SeqContext:
    """Sequence `seq` of `parent` (made with n_seq > seq): the `core.kv.Context` protocol on that sequence alone."""

    device_greedy = False  # the parent keeps no sampler per sequence (refused by `Context` for n_seq > 1)
    device_topk = False
    host_chains = False  # a llama.cpp chain reads rows by the parent's index: the target's law is built by numpy

    def __init__(self, parent: Context, seq: int) -> None:
        assert 0 <= seq < parent.n_seq
        self.parent, self.seq = parent, seq
        self.model, self.n_ctx, self.n_batch = parent.model, parent.n_ctx, parent.n_batch
        self.n_vocab, self.swa_full, self.n_rs_seq = parent.n_vocab, parent.swa_full, parent.n_rs_seq
        self.after_decode: Callable[[list[int], int], None] | None = None  # told of this sequence's decodes alone
        self._pending: SharedRows | None = None
        self._row: int | None = None  # the last decode was the shared batch's rows _row.._row + _n_rows - 1
        self._n_rows = 0
        self._alone: float | None = None  # that batch's seconds, where they were its only rows

    @property
    def seconds_decoding(self) -> float:
        return self.parent.seconds_decoding

    @property
    def handle(self):
        return self.parent.handle

    @property
    def row_shared(self) -> bool:
        """Whether the last decode's rows came from a batch that held other sequences' rows too (`decode_shared`)."""
        return self._row is not None and self._alone is None

    @property
    def seconds_ahead(self) -> float:
        """Seconds of the batch `decode_shared` decoded ahead whose rows the last decode took, where they were its only
        rows (a tick of one stream: that decode was this step's own, made early); 0.0 otherwise."""
        return self._alone if self._row is not None and self._alone is not None else 0.0

    @property
    def pending(self) -> bool:
        """Whether rows decoded in the shared batch (`decode_shared`) wait for this sequence's next decode."""
        return self._pending is not None

    def decode(self, tokens: list[int], n_past: int, *, outputs: int = 1) -> None:
        """As `Context.decode` on this sequence; the rows `decode_shared` decoded in the shared batch are taken instead
        when they are exactly this decode and their logits are still the parent's last."""
        pending, self._pending = self._pending, None
        if pending is not None:
            if (
                tuple(tokens) == pending.tokens
                and n_past == pending.n_past
                and outputs <= pending.outputs
                and (pending.decode == self.parent.decodes or outputs == 0)  # no logits read: its cells are enough
            ):
                self._row, self._n_rows = pending.first + len(tokens) - outputs, outputs  # its output rows: its last
                self._alone = pending.alone
                if self.after_decode is not None:  # a draft head reads this sequence's rows of the shared batch
                    self.after_decode(list(tokens), n_past)
                return
            self.parent.remove_from(pending.n_past, self.seq)  # not this step's decode, or its logits are gone: undo it
        self._row = None
        self.parent.decode(tokens, n_past, outputs=outputs, seq=self.seq)

    def discard(self) -> None:
        """Remove rows decoded in the shared batch that no step took (the stream finished or was cancelled instead)."""
        if self._pending is not None:
            self.parent.remove_from(self._pending.n_past, self.seq)
            self._pending = None

    def rows_start(self, n: int) -> int:
        """Where the last n rows of this sequence's last decode start among the parent's batch rows (a shared batch's
        rows are all outputs, so the same index among its output rows)."""
        return self._row + self._n_rows - n if self._row is not None else 0

    def output_span(self) -> tuple[int, int]:
        """(first, count) of the parent's last output rows that this sequence's last decode took."""
        return (self._row, self._n_rows) if self._row is not None else (0, self.parent.outputs_last())

    def outputs_last(self) -> int:
        return self.output_span()[1]

    def _shared_row(self, i: int) -> int:
        """The shared batch's row for this sequence's output row i (negative: counted from its last)."""
        j = i + self._n_rows if i < 0 else i
        assert 0 <= j < self._n_rows, f"row {i} of a shared decode that gave this sequence {self._n_rows}"
        return self._row + j

    def logits(self, i: int) -> np.ndarray:
        if self._row is not None:
            return self.parent.logits(self._shared_row(i))
        return self.parent.logits(i)

    def logits_block(self, n: int, start: int = 0) -> np.ndarray:
        if self._row is not None:
            self._shared_row(start + n - 1)  # the block's last row is this sequence's too
            return self.parent.logits_block(n, self._shared_row(start))
        return self.parent.logits_block(n, start)

    def sampled_token(self, i: int) -> int:
        raise ContextError("no sampler in the graph for a sequence of a shared context")

    def sampled_candidates(self, i: int):
        raise ContextError("no sampler in the graph for a sequence of a shared context")

    def device_law(self, top_k: int = 0, temperature: float = 0.0) -> None:
        raise ContextError("no sampler in the graph for a sequence of a shared context")

    def set_threads(self, n: int) -> None:
        self.parent.set_threads(n)

    def remove_from(self, pos: int) -> bool:
        self._row = None
        return self.parent.remove_from(pos, self.seq)

    def room(self, n_past: int, *, need: int = 1) -> int:
        """How many rows a decode of this sequence at n_past can place now (`Context.room`: within n_ctx positions
        and the cells of the pool the sequences share; its own rows pending from the shared batch count as its)."""
        return self.parent.room(n_past, self.seq, need=need)

    def full_message(self) -> str:
        return self.parent.full_message()

    def remove_span(self, start: int, end: int) -> bool:
        return self.parent.remove_span(start, end, self.seq)

    def can_shift(self) -> bool:
        return self.parent.can_shift()

    def shift(self, start: int, delta: int) -> None:
        self.parent.shift(start, delta, self.seq)

    def clear(self) -> None:
        self._pending = self._row = None
        self.parent.clear(self.seq)

    def pos_range(self) -> tuple[int, int]:
        return self.parent.pos_range(self.seq)

    def save_state(self, *, partial: bool = False) -> bytes:
        return self.parent.save_state(partial=partial, seq=self.seq)

    def load_state(self, state: bytes, *, partial: bool = False) -> None:
        self.parent.load_state(state, partial=partial, seq=self.seq)


class FedSeqContext(SeqContext):
    """Sequence `seq` of a several-sequence `FedContext` (an MTP head's, a Gemma 4 assistant's: llama/mtp.py), the
    draft head of the slot whose target is the same sequence of the target's context. It counts its own decodes
    and their seconds (each slot's drafter meters its own costs, not the other slots')."""

    def __init__(self, parent: FedContext, seq: int) -> None:
        super().__init__(parent, seq)
        self.fed = parent
        self.width = parent.width
        self.decodes, self._seconds = 0, 0.0

    @property
    def seconds_decoding(self) -> float:
        return self._seconds

    @property
    def n_threads(self) -> int:
        return self.parent.n_threads

    def decode(self, tokens: list[int], n_past: int, *, outputs: int = 1) -> None:
        before = self.parent.seconds_decoding
        super().decode(tokens, n_past, outputs=outputs)
        self.decodes += 1
        self._seconds += self.parent.seconds_decoding - before

    def stage(self, rows: np.ndarray, n_past: int) -> None:
        self.fed.stage(rows, n_past)

    def hidden(self, i: int) -> np.ndarray:
        return self.fed.hidden(i)

    def follow_threads(self) -> None:
        follow = getattr(self.fed, "follow_threads", None)  # an assistant's: the target's thread count
        if follow is not None:
            follow()


def route_decodes(parent: Context, views: Sequence[SeqContext]) -> None:
    """Tell each of `views` of its own decodes on `parent` (`after_decode`: a slot's draft head follows its sequence
    alone) instead of telling `parent`'s one hook of every sequence's."""
    by_seq = {view.seq: view for view in views}

    def told(tokens: list[int], n_past: int) -> None:
        view = by_seq.get(parent.seq_decoding)
        if view is not None and view.after_decode is not None:
            view.after_decode(tokens, n_past)

    parent.after_decode = told


def decode_shared(rows: Sequence[tuple[SeqContext, Sequence[int], int]], outputs: Sequence[int] | None = None) -> None:
    """Decode each (sequence, tokens, n_past) of `rows` in ONE `llama_decode` of their shared parent; each sequence's
    next `decode` of exactly those tokens at n_past takes its rows from it (`SeqContext.decode`). `outputs`: how many
    rows at the end of each are output (1: a draft catching up, the rows before not read; 0: a part of a prompt read
    beside the others' steps); default all of them.

    The rows go to llama.cpp in sequence order (a pool of cells kept apart per sequence split a batch at every
    sequence id out of ascending order; the one shared pool takes any order in one pass, the order stays harmless).

    Raises:
        NoRoomError: the pool has too few free cells for the rows (nothing was decoded, nothing is pending)."""
    if not rows:
        return
    parent = rows[0][0].parent
    assert all(view.parent is parent and not view.pending and tokens for view, tokens, _ in rows)
    counts = list(outputs) if outputs is not None else [len(tokens) for _, tokens, _ in rows]
    order = sorted(range(len(rows)), key=lambda i: rows[i][0].seq)
    rows, counts = [rows[i] for i in order], [counts[i] for i in order]
    flat = [(view.seq, token, n_past + j) for view, tokens, n_past in rows for j, token in enumerate(tokens)]
    every = all(n == len(tokens) for (_, tokens, _), n in zip(rows, counts, strict=True))
    out = None if every else [j >= len(t) - n for (_, t, _), n in zip(rows, counts, strict=True) for j in range(len(t))]
    t0 = time.perf_counter()
    parent.decode_rows(flat, out)
    alone = time.perf_counter() - t0 if len(rows) == 1 else None
    first = 0
    for (view, tokens, n_past), n in zip(rows, counts, strict=True):
        view._pending = SharedRows(tuple(tokens), n_past, first, n, parent.decodes, alone)
        first += len(tokens)


def passes(lengths: Sequence[int]) -> int:
    """How many passes over the weights llama.cpp makes of one batch that brings each sequence `lengths[i]` rows (at
    most n_batch in all): one, whatever the lengths, over the one pool of cells `Context` makes for n_seq > 1 (its
    batches are split by n_ubatch rows alone; cells kept apart per sequence cost one pass per distinct length).
    Counted from its graph (tests/core/test_slots.py)."""
    return 1 if any(n > 0 for n in lengths) else 0
