"""Slots: the target's context split into sequences (`serve --parallel N`), one per stream generating at once.

Each slot is one llama.cpp sequence (`llama.slots.SeqContext`) with its own `KVSequence`, so it keeps the prompt
and answer it last held: a request takes the free slot whose tokens share the longest prefix with its prompt (a
chat that grows by one turn decodes only that turn, as with one slot), the one used least recently among equals.
The draft model's cache stays one: only a stream that runs alone drafts with it (server/scheduler.py), and it syncs
the draft to its own history first (`ModelDrafter.propose`). Beside others a stream drafts from its own n-grams
(each slot keeps the index of its history), in the shared batch, where `core/batchdraft.py` predicts it pays.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from localspec.errors import InvalidParamsError
from localspec.llama.slots import SeqContext, decode_together, passes

from .batchdraft import MAX_DRAFT, Acceptance, BatchCosts, Candidate, plan
from .engine import Engine, Generation
from .kv import KVSequence, common_prefix
from .ngram import HistoryIndex


@dataclass(eq=False, slots=True)
class Slot:
    """One sequence of the shared target context and the tokens it holds."""

    index: int
    view: SeqContext
    target: KVSequence
    busy: bool = False
    used: int = 0  # when it was last taken (a counter): the least recently used is reused first
    ngrams: HistoryIndex = field(default_factory=HistoryIndex)  # its history's n-grams: its drafts beside others
    acceptance: Acceptance = field(default_factory=Acceptance)  # of those drafts, for the request it holds
    # This tick's drafts: (match length, drafts, the stream's drafted, accepted and rejection counts before its step)
    ahead: tuple[int, int, int, int, int] | None = None


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
        self.costs = BatchCosts()  # what a shared decode costs here, learned from each
        self._parent = parent
        self._clock = 0

    def warm(self) -> None:
        """Decode on every slot alone and on all together once, then empty them: llama.cpp allocates each
        sequence's buffers on first use, and the first requests beside each other would pay for it (measured:
        four clients' first round took 13 s against 5.6 s for the next, demo pair, 2 cores)."""
        for slot in self.slots:
            assert not slot.target.tokens, "warm empty slots only"
            slot.target.warm()
        decode_together([(slot.view, [0], 0) for slot in self.slots])
        for slot in self.slots:
            slot.view.discard()
        for _ in range(2):  # warm now: one row alone and one per slot seed the costs (`BatchCosts`)
            for group in (self.slots[:1], self.slots):
                t0 = time.perf_counter()
                decode_together([(slot.view, [0], 0) for slot in group])
                self.costs.observe(1, len(group), time.perf_counter() - t0)
                for slot in group:
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
        best.busy, best.used, best.acceptance = True, self._clock, Acceptance()
        return best

    def release(self, slot: Slot) -> None:
        """Give `slot` back; rows decoded ahead that no step took are removed first."""
        slot.view.discard()
        slot.busy, slot.ahead = False, None

    def decode_ahead(self, streams: Sequence[tuple[Slot, Generation]]) -> int:
        """Decode the next rows of every stream whose next step is a plain one in ONE batch (their steps then read
        their rows from it): its last token, and the n-gram copy `plan` chose for it, which its step then verifies
        (`Generation.drafts_ahead`). Returns how many rows it decoded."""
        live, candidates = [], []
        for slot, gen in streams:
            token = gen.upcoming() if gen.target is slot.target else None
            if token is None:
                continue
            room, copy, match = min(gen.draft_room(), MAX_DRAFT), [], 0
            if room:
                copy, match = slot.ngrams.follow(gen.history).continuation(room)
            live.append((slot, gen, token))
            candidates.append(Candidate(copy, match, slot.acceptance))
        lengths = plan(candidates, self.costs, max_rows=self._parent.n_batch)
        rows = []
        for (slot, gen, token), candidate, d in zip(live, candidates, lengths, strict=True):
            drafts = list(candidate.copy[:d])
            gen.drafts_ahead = drafts or None
            stats = gen.stats
            slot.ahead = (candidate.match, d, stats.drafted, stats.accepted, stats.rejections)
            if candidate.copy and not d:
                slot.acceptance.idle(candidate.match)
            rows.append((slot.view, [token, *drafts], slot.target.n_past))
        if rows:
            before = self._parent.seconds_decoding
            decode_together(rows)
            sizes = [len(tokens) for _, tokens, _ in rows]
            self.costs.observe(passes(sizes), sum(sizes), self._parent.seconds_decoding - before)
        return sum(len(tokens) for _, tokens, _ in rows)

    def learn(self, streams: Sequence[tuple[Slot, Generation]]) -> None:
        """After a tick's steps: each stream that verified drafts decoded ahead teaches its acceptance."""
        for slot, gen in streams:
            ahead, slot.ahead = slot.ahead, None
            if ahead is None or not ahead[1]:
                continue
            match, _, drafted, accepted, rejections = ahead
            stats = gen.stats
            if stats.drafted > drafted:  # its step took them (not cancelled first)
                slot.acceptance.learn(match, stats.accepted - accepted, stats.rejections > rejections)
