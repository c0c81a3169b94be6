"""Slots: the target's context split into sequences (`serve --parallel N`), one per stream generating at once.

Each slot is one llama.cpp sequence (`llama.slots.SeqContext`) with its own `KVSequence`, so it keeps the prompt
and answer it last held: a request takes the free slot whose tokens share the longest prefix with its prompt (a
chat that grows by one turn decodes only that turn, as with one slot), the one used least recently among equals.
The draft's cache stays one: only a stream that runs alone drafts (server/scheduler.py), and it syncs the draft to
its own history first (`ModelDrafter.propose`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localspec.errors import InvalidParamsError
from localspec.llama.slots import SeqContext, decode_together

from .engine import Engine, Generation
from .kv import KVSequence, common_prefix


@dataclass(eq=False, slots=True)
class Slot:
    """One sequence of the shared target context and the tokens it holds."""

    index: int
    view: SeqContext
    target: KVSequence
    busy: bool = False
    used: int = 0  # when it was last taken (a counter): the least recently used is reused first


class SlotPool:
    """The engine's target context as `n` slots; `acquire` / `release` on the engine's thread only.

    Raises:
        InvalidParamsError: the engine's target context was made with fewer sequences, its memory cannot drop a
            tail (recurrent or hybrid models), or its drafter reads the target's rows (an MTP head).
    """

    def __init__(self, engine: Engine, n: int) -> None:
        parent = engine.target.ctx
        if getattr(parent, "n_seq", 1) < n:
            raise InvalidParamsError(f"the target's context holds {getattr(parent, 'n_seq', 1)} sequences, not {n}")
        if engine.target.mode != "seq_rm":
            raise InvalidParamsError(
                f"--parallel above 1 needs a model whose cache can drop a tail; {parent.model.path.name} cannot "
                "(recurrent or hybrid): use --parallel 1"
            )
        if engine.drafter.after_target_decode is not None:
            raise InvalidParamsError("--parallel above 1 does not work with a draft head (mtp) yet: use --parallel 1")
        views = [SeqContext(parent, i) for i in range(n)]
        for view in views:
            view.clear()  # what a previous pool left: the new slots' token lists start empty
        self.slots = [Slot(i, view, KVSequence(view, rollback="seq_rm")) for i, view in enumerate(views)]
        self._clock = 0

    def warm(self) -> None:
        """Decode on every slot alone and on all together once, then empty them: llama.cpp allocates each
        sequence's buffers on first use, and the first requests beside each other would pay for it (measured:
        four clients' first round took 13 s against 5.6 s for the next, demo pair, 2 cores)."""
        for slot in self.slots:
            assert not slot.target.tokens, "warm empty slots only"
            slot.target.warm()
        decode_together([(slot.view, 0, 0) for slot in self.slots])
        for slot in self.slots:
            slot.view.discard()

    @property
    def busy(self) -> int:
        return sum(slot.busy for slot in self.slots)

    def acquire(self, prompt: Sequence[int]) -> Slot:
        """The free slot whose tokens share the longest prefix with `prompt` (the least recently used among equals).

        Raises:
            RuntimeError: no slot is free (the scheduler admits at most as many requests as there are slots).
        """
        free = [slot for slot in self.slots if not slot.busy]
        if not free:
            raise RuntimeError("no free slot")
        best = max(free, key=lambda slot: (common_prefix(slot.target.tokens, prompt), -slot.used))
        self._clock += 1
        best.busy, best.used = True, self._clock
        return best

    def release(self, slot: Slot) -> None:
        """Give `slot` back; a row decoded ahead that no step took is removed first."""
        slot.view.discard()
        slot.busy = False


def decode_ahead(streams: Sequence[tuple[Slot, Generation]]) -> int:
    """Decode the next token of every stream whose next step is a plain one in ONE batch (their steps then read
    their rows from it); returns how many rows it decoded."""
    rows = []
    for slot, gen in streams:
        token = gen.upcoming() if gen.target is slot.target else None
        if token is not None:
            rows.append((slot.view, token, slot.target.n_past))
    decode_together(rows)
    return len(rows)
