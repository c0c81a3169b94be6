"""A slot and a shared tick, as data (`serve --parallel`, core/slots.py): the sequence, caches and drafters a slot
holds for the stream it serves (`Slot`) and the contexts its drafters draft in (`draft_slots`: the draft model's, a
sequence per slot; `follow_heads`: a draft head's sequence per slot), and what one tick of the shared batch decoded
for each stream and what its step then taught (`TickStream`, `SharedTick`), and which rows a stream's slot decodes
next (`next_rows`, `prompt_rows`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from localspec.errors import InvalidParamsError, LocalspecError
from localspec.llama.context import Context
from localspec.llama.slots import SeqContext, route_decodes

from .acceptance import Acceptance
from .assistant import AssistantDrafter
from .drafters import Drafter, ModelDrafter, Proposal
from .engine import Engine, Generation
from .head import MtpDrafter
from .kv import KVSequence
from .ngram import HistoryIndex
from .policy import DraftPolicy

log = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class Slot:
    """One sequence of the shared target context and the tokens it holds."""

    index: int
    view: SeqContext
    target: KVSequence
    busy: bool = False
    used: int = 0  # when it was last taken (a counter): the least recently used is reused first
    ngrams: HistoryIndex = field(default_factory=HistoryIndex)  # its history's n-grams: its drafts in a shared batch
    acceptance: Acceptance = field(default_factory=Acceptance)  # of those drafts, for the request it holds
    draft: KVSequence | None = None  # its sequence of the draft model's slots context (None: no model drafts shared)
    model_acceptance: Acceptance = field(default_factory=Acceptance)  # of the draft model's drafts in a shared batch
    # Its drafters by kind (`SlotPool.drafting`): the stream it holds drafts with one, alone and in a shared batch,
    # over the slot's one draft state (`draft`, `ngrams`); and that stream's kind and draft-length policy.
    drafters: dict[str, Drafter] = field(default_factory=dict)
    stream: tuple[str, DraftPolicy] | None = None


@dataclass(eq=False, slots=True)
class TickStream:
    """What one stream verifies in a shared tick: the drafts decoded for it, and what its stats held before its step
    (so the tick learns, after, whether and how far it took them)."""

    slot: Slot
    drafts: Proposal | None  # None: its plain row; handed to its step once (`SharedTick.drafts_for`)
    n: int  # how many drafts were decoded for it
    match: int  # the length of the match its copy follows
    model: bool  # drafted by the draft model (else copied)
    before: tuple[int, int, int]  # its stats' drafted, accepted and rejections before its step
    own: bool = False  # drafted by the stream's own drafter, as alone (`Generation.draft_own`): the plan learns nothing


class SharedTick:
    """One tick of the shared batch, from its one decode to what its steps taught (the tick's one owner): when it
    began, the decoding seconds and the tokens emitted by then, and each stream's drafts decoded in it."""

    def __init__(self, decoding: float, emitted: int, running: int) -> None:
        self.began, self.decoding, self.emitted = time.perf_counter(), decoding, emitted
        self.running = running  # requests running when it began (their prompts read or not)
        self.streams: dict[Generation, TickStream] = {}
        self.reads = 0  # parts of prompts read in its batch (`Generation.prompt_rows`): its time is not a step's
        self.solo: Generation | None = None  # its one stream, where it decodes one: it steps as alone (`alone`)

    def drafts_for(self, generation: Generation) -> Proposal | None:
        """The drafts decoded for `generation`'s step in this tick, handed over once (None: its plain row only)."""
        stream = self.streams.get(generation)
        if stream is None:
            return None
        drafts, stream.drafts = stream.drafts, None
        return drafts

    def alone(self, generation: Generation) -> bool:
        """Whether `generation` steps alone in this tick: the one stream it decodes (a lone step is a tick of one
        stream), or a request's first step where no other runs."""
        return self.solo is generation or not self.streams and self.running <= 1


def prompt_rows(slot: Slot, gen: Generation) -> list[int] | None:
    """The part of its prompt `gen` reads next in `slot` (`Generation.prompt_rows`), where a shared batch may read
    it: not for a target whose draft head follows its decodes (the head reads the rows' hidden states)."""
    if gen.target is not slot.target or slot.view.after_decode is not None:
        return None
    return gen.prompt_rows()


def next_rows(slot: Slot, gen: Generation) -> list[int] | None:
    """What `gen` decodes next in `slot` (`Generation.next_rows`), where it steps in that slot."""
    return gen.next_rows() if gen.target is slot.target else None


def follow_heads(drafter: Drafter, slots: list[Slot]) -> None:
    """Where the pair's drafter is a draft head that reads the target's rows (its MTP head, a Gemma 4 assistant): a
    drafter of it for each slot, over the slot's sequence of the head's one context (a sequence per slot, as
    llama-server keeps one draft context for all slots), told of that sequence's decodes alone, its rows of a
    shared batch among them (`SeqContext.after_decode`)."""
    if not isinstance(drafter, MtpDrafter | AssistantDrafter):
        return
    context = drafter.head.ctx if isinstance(drafter, MtpDrafter) else drafter.ctx
    if getattr(context, "n_seq", 1) < len(slots):
        raise InvalidParamsError(
            f"the draft head's context holds {getattr(context, 'n_seq', 1)} sequences, not {len(slots)}: load the "
            "pair with as many slots as --parallel"
        )
    route_decodes(slots[0].view.parent, [slot.view for slot in slots])  # the pair's drafter no longer follows seq 0
    for slot in slots:
        head = slot.drafters[drafter.kind] = drafter.for_slot(slot.target, slot.index)
        slot.view.after_decode = head.after_target_decode
        for cache in head.caches:
            cache.warm()  # llama.cpp allocates a sequence's buffers on its first decode (`SlotPool.warm`)


def draft_slots(engine: Engine, n: int) -> Context | None:
    """A second context of the engine's draft model with `n` sequences over one pool of its n_ctx cells (as the
    target's slots share theirs; an idle slot's cells freed for another), where the draft model may draft for several
    streams at once: a draft with the target's vocabulary whose cache can drop a tail. None elsewhere (a bridged or
    recurrent draft, no draft model, no memory for it): then only copies draft in a shared batch. The engine frees
    it."""
    drafter = engine.model_drafter
    if not isinstance(drafter, ModelDrafter) or drafter.seq.mode != "seq_rm":
        return None
    own = drafter.seq.ctx
    try:
        ctx = Context(own.model, n_ctx=own.n_ctx, n_threads=own.n_threads, swa_full=own.swa_full, n_seq=n)
    except LocalspecError as e:
        log.info("the draft model drafts for a stream alone only: %s", e)
        return None
    engine.own(ctx)
    if engine.threads is not None:
        engine.threads.contexts.append(ctx)  # its threads follow the free cores with the others'
    return ctx
