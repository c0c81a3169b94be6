"""Slots: the target's context split into sequences (`serve --parallel N`), one per stream generating at once.

Each slot is one llama.cpp sequence (`llama.slots.SeqContext`) with its own `KVSequence`; the slots share one pool
of n_ctx cells, each growing into the free room (a stream that finds none ends, told why; idle slots' cells are freed,
saved to the prompt cache, when a decode needs them: `SlotPool._reclaim`). A slot keeps the prompt and answer it last
held: a request takes the free slot whose tokens share the longest prefix with its prompt (a
chat that grows by one turn decodes only that turn, as with one slot), the one used least recently among equals.
A stream that runs alone drafts as with one slot (server/scheduler.py), with the engine's drafter and its one draft
cache. In a shared batch the drafts go into the shared batch where `core/batchdraft.py` predicts they pay: a stream's
own n-gram copy (each slot keeps the index of its history), or the draft model's, which then drafts for all the
streams it was chosen for together — a second context of the draft model with a sequence per slot, each slot's
draft cache kept as its history, one batch per drafted token (`SlotPool.draft_shared`).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import cast

from localspec.errors import InvalidParamsError, LocalspecError, NoRoomError
from localspec.llama.context import Context
from localspec.llama.slots import SeqContext, decode_shared, passes

from .batchdraft import CATCH_UP_MAX, MAX_DRAFT, NONE, Acceptance, Candidate, DecodeCosts, StreamDraft, plan
from .drafters import DraftLawBuilder, ModelDrafter, Proposal, draft_loop, draft_token, drive
from .engine import Engine, Generation
from .kv import KVSequence, common_prefix
from .ngram import HistoryIndex
from .sampling import penalty_window

log = logging.getLogger(__name__)
PROBE_EVERY = 32  # shared ticks between probes of the draft model in a shared batch (`SlotPool._probe`)
PROBE_DRAFTS = 4  # drafts per stream in a probe
PROBE_EVIDENCE = 8.0  # verified tokens' worth of evidence past which the model's acceptance is judged, not probed
RECHECK_EVERY = 8  # ticks between drafting ticks while drafting measures slower (and plain ones while plain is unknown)
RATES_ENOUGH = 4  # recent ticks of a kind whose median is trusted
REMAINING_CAP = 256  # most tokens a stream is counted on to emit still (max_tokens is often far above its answer)


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


class SharedTick:
    """One tick of the shared batch, from its one decode to what its steps taught (the tick's one owner): when it
    began, the decoding seconds and the tokens emitted by then, and each stream's drafts decoded in it."""

    def __init__(self, decoding: float, emitted: int) -> None:
        self.began, self.decoding, self.emitted = time.perf_counter(), decoding, emitted
        self.streams: dict[Generation, TickStream] = {}

    def drafts_for(self, generation: Generation) -> Proposal | None:
        """The drafts decoded for `generation`'s step in this tick, handed over once (None: its plain row only)."""
        stream = self.streams.get(generation)
        if stream is None:
            return None
        drafts, stream.drafts = stream.drafts, None
        return drafts


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
            raise InvalidParamsError(
                f"--parallel above 1 does not work with a draft head ({engine.drafter.kind}) yet: use --parallel 1"
            )
        views = [SeqContext(parent, i) for i in range(n)]
        for view in views:
            view.clear()  # what a previous pool left: the new slots' token lists start empty
        self.slots = [Slot(i, view, KVSequence(view, rollback="seq_rm")) for i, view in enumerate(views)]
        for slot in self.slots:  # a slot taken over keeps its prompt in the engine's cache; any slot restores it
            slot.target.use_cache(engine.prompt_cache, "target")
            slot.target.media = engine.target.media  # the engine's images (core/media.py)
        self.costs = DecodeCosts()  # what a shared decode costs here, learned from each
        self.draft_costs = DecodeCosts()  # the same for the draft model's slots context
        # The draft model's acceptance in a shared batch over every stream (a property of the pair more than of one
        # answer): the next requests' prior, and the probes' evidence.
        self.model_alpha = Acceptance(forget=0.02)
        self._engine, self._parent = engine, cast(Context, parent)  # a llama.cpp context of n sequences
        self._parent.reclaim = partial(self._reclaim, lambda slot: slot.target)  # the pool full: idle slots' cells go
        self._drafts = _draft_slots(engine, n)  # the draft model's context with a sequence per slot, or None
        self._laws = DraftLawBuilder()
        self._overheads: deque[float] = deque(maxlen=12)  # recent ticks' seconds outside the decodes
        self._ticks = 0  # shared ticks so far (`_probe`, `_checked`)
        self._probed_at = -PROBE_EVERY  # the tick of the latest probe (`_probe`): the first is due at once
        self._rates: dict[tuple[int, bool], deque[float]] = {}  # tokens/s of recent ticks by (streams, drafted)
        self.tick: SharedTick | None = None  # the tick in progress (`begin` … `end`): the streams step in its batch
        if self._drafts is not None:
            drafter = engine.model_drafter
            assert isinstance(drafter, ModelDrafter)  # `_draft_slots` made the context for one
            for slot in self.slots:
                view = SeqContext(self._drafts, slot.index)
                view.clear()
                slot.draft = KVSequence(view, rollback="seq_rm")
                slot.draft.media = drafter.seq.media
            self._drafts.reclaim = partial(self._reclaim, lambda slot: slot.draft)
        self._clock = 0

    def _reclaim(self, cache, n: int) -> int:
        """Free at least n cells of a pool the slots share, for a decode that found too few: the caches (`cache` of a
        slot) of idle slots, the least recently used first, each saved to the prompt cache as it goes (the prompt
        coming back is restored, not read). Returns the cells freed."""
        freed = 0
        for slot in sorted((slot for slot in self.slots if not slot.busy), key=lambda slot: slot.used):
            seq = cache(slot)
            if freed >= n:
                break
            if seq is not None and seq.tokens:
                held = seq.n_past
                seq.reuse([])  # `sync`'s first half: what it drops is saved first
                freed += held - seq.n_past
        if freed:
            log.info("the slots' shared KV pool was full: %d cells of idle slots freed", freed)
        return freed

    def warm(self) -> None:
        """Decode on every slot alone and on all together, then empty them: llama.cpp allocates each sequence's
        buffers on first use, and the first requests beside each other would pay for it (measured: four clients'
        first round took 13 s against 5.6 s for the next, demo pair, 2 cores)."""
        for slot in self.slots:
            assert not slot.target.tokens, "warm empty slots only"
            slot.target.warm()
        # Seed the costs (`DecodeCosts`) with the shapes a tick takes: one row alone, one per slot, and every slot
        # with 1, 2 or 4 drafts (one pass each) — the target's and, where it drafts in a shared batch, the draft's.
        n = len(self.slots)
        shapes = [
            (self.slots[:1], 1),
            *((self.slots, rows) for rows in (1, 2, 3, 5) if n * rows <= self._parent.n_batch),
        ]
        self._seed(self.costs, lambda slot: slot.view, shapes)
        if self._drafts is not None:
            self._seed(self.draft_costs, lambda slot: slot.draft.ctx, shapes)

    @staticmethod
    def _seed(costs: DecodeCosts, view, shapes: list) -> None:
        """Time each (slots, rows a slot) shape twice, after a round that allocates (all slots together among them),
        into `costs` as seeds."""
        for round_ in range(3):
            for group, rows in shapes:
                t0 = time.perf_counter()
                decode_shared([(view(slot), [0] * rows, 0) for slot in group])
                if round_:
                    costs.seed(1, len(group) * rows, time.perf_counter() - t0)
                for slot in group:
                    view(slot).discard()

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
        # The draft model's acceptance in a shared batch starts from what was measured of it before: by the engine's
        # policy alone, or by every stream in a shared batch (`model_alpha`), whichever holds more evidence (up to 8
        # tokens' worth).
        policy, pooled = self._engine.policy, self.model_alpha
        alone = policy.seen >= pooled.seen
        prior, seen = (policy.alpha, policy.seen) if alone else (pooled.alpha(0), pooled.seen)
        best.model_acceptance = Acceptance(prior=prior, weight=min(8.0, max(2.0, seen)))
        return best

    def release(self, slot: Slot) -> None:
        """Give `slot` back; rows decoded in the tick that no step took are removed first."""
        slot.view.discard()
        slot.busy = False
        if self.tick is not None:
            self.tick.streams = {gen: stream for gen, stream in self.tick.streams.items() if stream.slot is not slot}

    def begin(self, streams: Sequence[tuple[Slot, Generation]]) -> int:
        """Start a tick: decode the next rows of every stream whose next step is a plain one in ONE batch (their
        steps then read their rows from it) — its last token, and the drafts `plan` chose for it: its n-gram copy, or
        the draft model's (`draft_shared`), which its step then verifies (`SharedTick.drafts_for`). Until `end`, the
        streams step in this tick (`tick`). Returns how many rows it decoded."""
        tick = self.tick = SharedTick(self._decoding(), sum(len(gen.tokens) for _, gen in streams))
        self._ticks += 1
        live, candidates = [], []
        model = self._drafts is not None and self._engine.drafter.needs_model
        ready, free = self._fitting(streams)
        spare = free - len(ready)  # cells past one row a stream: its drafts' room
        for slot, gen in ready:
            token = gen.upcoming()
            history, room, copy, match = gen.history, min(gen.draft_room(), MAX_DRAFT, spare), [], 0
            if room:
                copy, match = slot.ngrams.follow(history).continuation(room)
            drafts, catch_up, remaining = None, 1, 0  # what the draft model needs to draft for it (None: it may not)
            if model and room and len(history) + room < slot.draft.ctx.n_ctx:
                drafts = slot.model_acceptance
                catch_up = len(history) - min(common_prefix(slot.draft.tokens, history), len(history) - 1)
                remaining = min(REMAINING_CAP, gen.max_tokens - len(gen.tokens))
            live.append((slot, gen, token))
            candidates.append(Candidate(copy, match, slot.acceptance, room, drafts, catch_up, remaining))
        overhead = statistics.median(self._overheads) if self._overheads else 0.0
        rows_max = min(self._parent.n_batch, free)
        choices = plan(candidates, self.costs, max_rows=rows_max, draft_costs=self.draft_costs, overhead=overhead)
        choices = self._checked(len(choices), self._probe(candidates, choices))
        if len(live) + sum(choice.d for choice in choices) > rows_max:  # a probe past the pool's free cells
            choices = [NONE] * len(choices)
        try:
            chosen = [(slot, gen, c.d, cand.catch_up) for (slot, gen, _), c, cand in zip(live, choices, candidates)]
            drafted = self.draft_shared([one for one, c in zip(chosen, choices) if c.model])
        except NoRoomError:  # the draft's pool is full: its caches hold what they decoded, the streams go plain
            drafted = {}
        rows = []
        for (slot, gen, token), candidate, choice in zip(live, candidates, choices, strict=True):
            proposal = drafted.get(slot.index) if choice.model else None
            if choice.d and not choice.model:
                proposal = Proposal(list(candidate.copy[: choice.d]), [None] * choice.d)
            proposal = proposal if proposal is not None and proposal.tokens else None
            n = len(proposal.tokens) if proposal is not None else 0
            stats = gen.stats
            before = (stats.drafted, stats.accepted, stats.rejections)
            tick.streams[gen] = TickStream(slot, proposal, n, candidate.match, choice.model, before)
            if candidate.copy and not choice.d:
                slot.acceptance.idle(candidate.match)
            rows.append((slot.view, [token, *(proposal.tokens if proposal is not None else ())], slot.target.n_past))
        if rows:
            before_decoding = self._parent.seconds_decoding
            decode_shared(rows)
            sizes = [len(tokens) for _, tokens, _ in rows]
            self.costs.observe(passes(sizes), sum(sizes), self._parent.seconds_decoding - before_decoding)
        return sum(len(tokens) for _, tokens, _ in rows)

    def _fitting(self, streams: Sequence[tuple[Slot, Generation]]) -> tuple[list[tuple[Slot, Generation]], int]:
        """(the streams whose next step is a plain one that the pool's free cells take a row of, the free cells):
        idle slots' cells freed where too few; then the longest answers (then the most cells) are left out — they
        grew into the room, and each finds none in its step."""
        ready = [(slot, gen) for slot, gen in streams if gen.target is slot.target and gen.upcoming() is not None]
        free = self._parent.free_cells(len(ready))
        ready.sort(key=lambda one: (len(one[1].tokens), one[0].target.n_past))
        return ready[:free], free

    def _checked(self, n: int, choices: list[StreamDraft]) -> list[StreamDraft]:
        """The plan, unless this machine's own ticks of n streams say drafting in a shared batch loses: the median
        tokens per second of the recent ticks that drafted below that of the recent plain ones (the plan's costs and
        acceptances are estimates; these are what happened). Then plain, but for one tick in RECHECK_EVERY, which
        keeps the drafting figure current; and one plain tick in RECHECK_EVERY while the plain figure is unknown."""
        drafting = self._rates.get((n, True), ())
        plain = self._rates.get((n, False), ())
        recheck = self._ticks % RECHECK_EVERY == 0
        if not any(choice.d for choice in choices):
            return choices
        if len(plain) < RATES_ENOUGH:
            return [NONE] * n if recheck else choices
        if len(drafting) >= RATES_ENOUGH and statistics.median(drafting) < statistics.median(plain) and not recheck:
            return [NONE] * n
        return choices

    def _probe(self, candidates: list[Candidate], choices: list[StreamDraft]) -> list[StreamDraft]:
        """Now and then a tick in which the draft model drafts PROBE_DRAFTS for the streams it may draft for, while
        there is too little evidence of its acceptance to judge it — neither the engine's policy (no stream has run
        alone yet: its prior then counts for little) nor drafts in a shared batch: a prior from nothing would keep it
        off for good. The first tick that can, then one in PROBE_EVERY, until the pair's draft has PROBE_EVIDENCE of
        evidence (a probe gives PROBE_DRAFTS a stream): a few probes a server, each catching its streams' draft caches
        up with their histories. (Probing first at the 32nd tick left a cold server's first answers undrafted.)"""
        if self._ticks - self._probed_at < PROBE_EVERY or any(choice.model for choice in choices):
            return choices
        if self.model_alpha.seen + self._engine.policy.seen >= PROBE_EVIDENCE:
            return choices  # the pair's draft has been measured, alone or in a shared batch: the plan judges it
        unsure = [c.model is not None and c.room >= PROBE_DRAFTS for c in candidates]
        if not any(unsure):
            return choices
        self._probed_at = self._ticks
        return [StreamDraft(PROBE_DRAFTS, True) if u else NONE for u in unsure]

    def draft_shared(self, chosen: Sequence[tuple[Slot, Generation, int, int]]) -> dict[int, Proposal]:
        """The draft model's drafts for each (slot, generation, d, tokens its draft cache lags), by slot index: each
        slot's draft cache caught up with its history in one batch (a cache far behind, a new request's, first on its
        own), then one batch per drafted token; each token drawn from the stream's own law and rng (`draft_token`,
        as a lone `ModelDrafter` draws), a stream whose draft is unsure (p_min) stopping early."""
        if not chosen:
            return {}
        held = []
        for slot, gen, _, lag in chosen:
            history, draft = gen.history, slot.draft
            n = len(history) - lag
            if lag > CATCH_UP_MAX:
                draft.rollback_to(n)
                draft.sync(history[:-1])  # a new request's prompt: decoded on its own, in chunks
                n = len(history) - 1
            held.append(n)
        # Every cache catches up as many tokens as the furthest behind (re-decoding a few it held): rows of one
        # length are one pass of the draft, where as many lengths as streams were as many passes.
        longest = max(len(gen.history) - n for (_, gen, _, _), n in zip(chosen, held, strict=True))
        catch_up = []
        for (slot, gen, _, _), n in zip(chosen, held, strict=True):
            start = max(0, min(n, len(gen.history) - longest))
            slot.draft.rollback_to(start)
            catch_up.append((slot.draft.ctx, gen.history[start:], start))
        self._decode_drafts(catch_up, last_only=True)
        loops = {}
        for (slot, gen, d, _), (_, tokens, _) in zip(chosen, catch_up, strict=True):
            slot.draft.append(list(tokens), outputs=1)  # takes its rows of the batch
            request = gen.request(d)
            recent = penalty_window(request.history, request.sampling)
            sampled = request.pq and not request.sampling.greedy
            pick = partial(draft_token, slot.draft.ctx, self._laws, recent, request=request, sampled=sampled)
            loops[slot.index] = draft_loop(d, pick, p_min=request.p_min)

        def decode(fed: list[tuple[int, int]]) -> None:  # one batch: each stream's last drafted token
            self._decode_drafts([(slots[i].draft.ctx, [token], slots[i].draft.n_past) for i, token in fed])
            for i, token in fed:
                slots[i].draft.append([token], outputs=1)

        slots = {slot.index: slot for slot, _, _, _ in chosen}
        return drive(loops, decode)

    def _decode_drafts(self, rows: list, *, last_only: bool = False) -> None:
        """`decode_shared` on the draft's slots context, timed into `draft_costs`."""
        before = self._drafts.seconds_decoding
        decode_shared(rows, last_only=last_only)
        sizes = [len(tokens) for _, tokens, _ in rows]
        self.draft_costs.observe(passes(sizes), sum(sizes), self._drafts.seconds_decoding - before)

    def _decoding(self) -> float:
        """Seconds inside llama_decode so far, of the target's context and the draft's slots context."""
        return self._parent.seconds_decoding + (self._drafts.seconds_decoding if self._drafts is not None else 0.0)

    def end(self, streams: Sequence[tuple[Slot, Generation]]) -> None:
        """End the tick after its steps: each stream that verified drafts decoded in it teaches its acceptance, and
        the tick's time outside the decodes is the overhead the next plans count (a plain tick pays it as a drafting
        one does: on the demo pair's 2 cores about 10 ms beside 24 ms of decoding, which made fewer, longer ticks
        pay)."""
        tick, self.tick = self.tick, None
        if tick is None:
            return
        seconds = time.perf_counter() - tick.began
        self._overheads.append(max(0.0, seconds - (self._decoding() - tick.decoding)))
        emitted = sum(len(gen.tokens) for _, gen in streams) - tick.emitted
        drafted = any(stream.n for stream in tick.streams.values())
        self._rates.setdefault((len(streams), drafted), deque(maxlen=16)).append(emitted / seconds)
        for gen, stream in tick.streams.items():
            if not stream.n:
                continue
            stats, (drafted_before, accepted, rejections) = gen.stats, stream.before
            if stats.drafted > drafted_before:  # its step took them (not cancelled first)
                learner = stream.slot.model_acceptance if stream.model else stream.slot.acceptance
                taken, rejected = stats.accepted - accepted, stats.rejections > rejections
                learner.learn(0 if stream.model else stream.match, taken, rejected)
                if stream.model:
                    self.model_alpha.learn(0, taken, rejected)


def _draft_slots(engine: Engine, n: int) -> Context | None:
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
