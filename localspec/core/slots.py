"""Slots: the target's context split into sequences (`serve --parallel N`), one per stream generating at once.

Each slot is one llama.cpp sequence (`llama.slots.SeqContext`) with its own `KVSequence`; the slots share one pool
of n_ctx cells, each growing into the free room (a stream that finds none ends, told why; idle slots' cells are freed,
saved to the prompt cache, when a decode needs them: `SlotPool._reclaim`). A slot keeps the prompt and answer it last
held: a request takes the free slot whose tokens share the longest prefix with its prompt (a
chat that grows by one turn decodes only that turn, as with one slot), the one used least recently among equals.
Each stream drafts with its own drafter over its slot's one draft state, alone and in a shared batch
(`SlotPool.drafting`). In a shared batch the drafts go into the shared batch where `core/batchdraft.py` predicts
they pay: a stream's own n-gram copy (each slot keeps the index of its history), or the draft model's, which then
drafts for all the streams it was chosen for together — a second context of the draft model with a sequence per
slot, each slot's draft cache kept as its history, one batch per drafted token (`SlotPool.draft_shared`). A draft
head (the target's MTP head, a Gemma 4 assistant) drafts for each slot over the slot's sequence of its one context
(`follow_heads`). A slot and a tick as data, and the contexts a slot's drafters draft in: core/slotstate.py.
"""

from __future__ import annotations

import copy
import logging
import statistics
import time
from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import cast

from localspec.errors import InvalidParamsError, NoRoomError
from localspec.llama.context import Context
from localspec.llama.slots import SeqContext, decode_shared, passes

from .batchdraft import MAX_DRAFT, NONE, Acceptance, Candidate, DecodeCosts, StreamDraft, plan
from .bridge import BridgedDrafter
from .drafters import (
    Drafter,
    DraftLawBuilder,
    DraftRequest,
    ModelDrafter,
    NgramDrafter,
    NgramFirst,
    Proposal,
    draft_loop,
    draft_token,
    drive,
    make_drafter,
)
from .draftread import DraftReads, reads_of
from .engine import Engine, Generation
from .kv import KVSequence, common_prefix
from .params import needs_draft_model
from .policy import DraftPolicy
from .sampling import penalty_window
from .slotstate import SharedTick, Slot, TickStream, draft_slots, follow_heads, next_rows, prompt_rows
from .step import admitted

__all__ = ["SHARED_DRAFTS_ENV", "Slot", "SlotPool"]  # `Slot` is core/slotstate.py's, found here by the server

log = logging.getLogger(__name__)
PROBE_EVERY = 32  # shared ticks between probes of the draft model in a shared batch (`SlotPool._probe`)
PROBE_DRAFTS = 4  # drafts per stream in a probe
PROBE_EVIDENCE = 8.0  # verified tokens' worth of evidence past which the model's acceptance is judged, not probed
RECHECK_EVERY = 8  # ticks between drafting ticks while drafting measures slower (and plain ones while plain is unknown)
RATES_ENOUGH = 4  # recent ticks of a kind whose median is trusted
# "off" (read by the server): a request with a grammar, a seed at T > 0 or a bridged draft drafts only while it runs
# alone, as before issue 65 — what `bench --clients --structured` measures the default against; not a user's setting.
SHARED_DRAFTS_ENV = "LOCALSPEC_SHARED_DRAFTS"
READ_BESIDE_SPARE = MAX_DRAFT  # rows a stream's drafts keep of a batch that also reads a prompt's part
REMAINING_CAP = 256  # most tokens a stream is counted on to emit still (max_tokens is often far above its answer)


class SlotPool:
    """The engine's target context as `n` slots; `acquire` / `release` on the engine's thread only. `shared_drafts`
    off: streams with a grammar, a seed at T > 0 or a bridged draft draft only while alone (a yardstick).

    Raises:
        InvalidParamsError: the engine's target context (or its draft head's) was made with fewer sequences, or its
            memory cannot drop a tail (recurrent or hybrid models).
    """

    def __init__(self, engine: Engine, n: int, *, shared_drafts: bool = True) -> None:
        parent = engine.target.ctx
        if getattr(parent, "n_seq", 1) < n:
            raise InvalidParamsError(f"the target's context holds {getattr(parent, 'n_seq', 1)} sequences, not {n}")
        if engine.target.mode != "seq_rm":
            raise InvalidParamsError(
                f"--parallel above 1 needs a model whose cache can drop a tail; {parent.model.path.name} cannot "
                "(recurrent or hybrid): use --parallel 1"
            )
        views = [SeqContext(parent, i) for i in range(n)]
        for view in views:
            view.clear()  # what a previous pool left: the new slots' token lists start empty
        self.slots = [Slot(i, view, KVSequence(view, rollback="seq_rm")) for i, view in enumerate(views)]
        follow_heads(engine.drafter, self.slots)
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
        # False: a stream with a grammar, a seed at T > 0 or a bridged draft drafts only while alone, as before issue 65
        # (the yardstick `bench --clients --structured` runs beside the default: LOCALSPEC_SHARED_DRAFTS=off).
        self.shared_drafts = shared_drafts
        # By drafter kind, what the pair's streams learned of drafting (the last released): each stream's start (the
        # engine's own policy for its drafter's kind, until a stream of that kind is released).
        self._policies: dict[str, DraftPolicy] = {}
        self._drafts = draft_slots(engine, n)  # the draft model's context with a sequence per slot, or None
        self._laws = DraftLawBuilder()
        self._overheads: deque[float] = deque(maxlen=12)  # recent ticks' seconds outside the decodes
        self._ticks = 0  # shared ticks so far (`_probe`, `_checked`)
        self._probed_at = -PROBE_EVERY  # the tick of the latest probe (`_probe`): the first is due at once
        self._rates: dict[tuple[int, bool], deque[float]] = {}  # tokens/s of recent ticks by (streams, drafted)
        self.tick: SharedTick | None = None  # the tick in progress (`begin` … `end`): the streams step in its batch
        if self._drafts is not None:
            drafter = engine.model_drafter
            assert isinstance(drafter, ModelDrafter)  # `draft_slots` made the context for one
            for slot in self.slots:
                view = SeqContext(self._drafts, slot.index)
                view.clear()
                slot.draft = KVSequence(view, rollback="seq_rm")
                slot.draft.media = drafter.seq.media
                slot.draft.use_cache(engine.prompt_cache, f"draft:{drafter.seq.ctx.model.path}")
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
        self._prior(best, self._engine.policy)  # until the stream's own drafter is known (`drafting`)
        return best

    def _prior(self, slot: Slot, policy: DraftPolicy) -> None:
        """The draft model's acceptance in a shared batch for `slot`'s new stream starts from what was measured of it
        before: by `policy` alone, or by every stream in a shared batch (`model_alpha`), whichever holds more
        evidence (up to 8 tokens' worth)."""
        pooled = self.model_alpha
        prior, seen = (policy.alpha, policy.seen) if policy.seen >= pooled.seen else (pooled.alpha(0), pooled.seen)
        slot.model_acceptance = Acceptance(prior=prior, weight=min(8.0, max(2.0, seen)))

    def drafting(self, slot: Slot, kind: str) -> tuple[Drafter, DraftPolicy]:
        """The drafter of `kind` (one of DRAFTERS) for the stream `slot` holds, and the stream's own draft-length
        policy. The drafter is made on first use over the slot's own draft state (its sequence of the draft model's
        slots context, its n-gram index) and kept with the slot, so a stream alone and in a shared batch drafts from
        one state and two streams never share a drafter. The policy starts as what the pair's streams of that kind
        learned (the last one released), and what this stream learns is the next one's start (`release`).

        Raises:
            InvalidParamsError: a kind this pool cannot draft with (a draft head, or a model drafter without a draft
                model).
        """
        drafter = slot.drafters.get(kind)
        if drafter is None:
            if kind in ("mtp", "assistant"):  # made for every slot with the pool, where the pair loaded it
                raise InvalidParamsError(
                    f"the drafter '{kind}' was not loaded with this pair: start with --drafter {kind}"
                )
            drafter = make_drafter(kind, self._model(slot) if needs_draft_model(kind) else None)
            if isinstance(drafter, NgramDrafter | NgramFirst):
                drafter.history = slot.ngrams  # one index of the slot's history, alone and in a shared batch
            slot.drafters[kind] = drafter
        engine = self._engine
        learned = self._policies.get(kind, engine.policy if kind == engine.drafter.kind else None)
        policy = copy.deepcopy(learned) if learned is not None else DraftPolicy(draft_size_ratio=drafter.size_ratio)
        slot.stream = (kind, policy)
        self._prior(slot, policy)
        return drafter, policy

    def _model(self, slot: Slot) -> Drafter | None:
        """The draft model's drafter over `slot`'s own sequence of the draft's slots context (with the engine's
        bridge where the vocabularies differ); where there is no such context, the engine's own (one cache that
        each stream's drafts re-sync: exact, only slower)."""
        engine = self._engine
        model = engine.model_drafter
        if slot.draft is None or model is None:
            return model
        for drafter in slot.drafters.values():  # the slot's one model drafter, whatever wraps it
            inner = getattr(drafter, "inner", drafter)
            if isinstance(inner, ModelDrafter):
                return inner
        if isinstance(model, BridgedDrafter):
            return BridgedDrafter(slot.draft, model.bridge)
        return ModelDrafter(slot.draft, size_ratio=model.size_ratio)

    def release(self, slot: Slot) -> None:
        """Give `slot` back; rows decoded in the tick that no step took are removed first."""
        slot.view.discard()
        slot.busy = False
        if slot.stream is not None:  # what its stream's policy learned is the next stream's start
            kind, policy = slot.stream
            self._policies[kind], slot.stream = policy, None
        if self.tick is not None:
            self.tick.streams = {gen: stream for gen, stream in self.tick.streams.items() if stream.slot is not slot}

    def begin(self, streams: Sequence[tuple[Slot, Generation]], running: int | None = None) -> int:
        """Start a tick: decode the next rows of every stream whose next step is a plain one in ONE batch (their
        steps then read their rows from it) — its last token and the tokens its grammar forces, then its drafts: the
        ones `plan` chose for it (its n-gram copy, or the draft model's: `draft_shared`), or, for a stream that drafts
        alone (`Generation.drafts_alone`: a seed at T > 0, another vocabulary), its own drafter's, with the k its own
        policy chooses, as does a tick's one stream (a lone step is a tick of one stream: `running`, the requests
        running, their prompts read or not; default the streams). Its step then verifies them (`SharedTick.drafts_for`).
        Until `end`, the streams step in this tick (`tick`). Returns how many rows it decoded."""
        emitted = sum(len(gen.tokens) for _, gen in streams)
        tick = self.tick = SharedTick(self._decoding(), emitted, len(streams) if running is None else running)
        ready = [(slot, gen, ahead) for slot, gen in streams if (ahead := next_rows(slot, gen)) is not None]
        reading = [(slot, part) for slot, gen in streams if (part := prompt_rows(slot, gen)) is not None]
        free = self._parent.free_cells(sum(len(ahead) for _, _, ahead in ready))  # idle slots' freed where too few
        # Too few cells: the longest answers (then the most cells) are left out, they grew into the room; each finds
        # none in its own step and ends in one line.
        ready.sort(key=lambda one: (len(one[1].tokens), one[0].target.n_past))
        kept, used = [], 0
        for one in ready:
            if used + len(one[2]) > free:
                break
            kept.append(one)
            used += len(one[2])
        solo = len(kept) == 1  # a lone step is a tick of one stream: its own drafter, policy and timing, as alone
        if solo:
            tick.solo = kept[0][1]
        else:
            self._ticks += 1  # the plan's ticks (`_probe`, `_checked`)
        live, candidates, windows, rows = [], [], [], []
        # Parts of prompts being read go into the batch too (one pass with the steps' rows, no logits), where they fit
        # beside the steps' rows and a few drafts; else each is read by a decode of its own, at its stream's turn.
        room = min(self._parent.n_batch, free) - used - READ_BESIDE_SPARE * len(kept)
        for slot, part in reading:
            if len(part) <= room:
                rows.append((slot.view, part, slot.target.n_past))
                room -= len(part)
                used += len(part)
        tick.reads = len(rows)  # its first rows: parts of prompts, no logits
        for slot, gen, ahead in kept:
            stats = gen.stats
            before = (stats.drafted, stats.accepted, stats.rejections)
            if solo or gen.drafts_alone or (not self.shared_drafts and gen.constraint is not None):
                # as alone: its own drafter, its own k (beside others, the yardstick's grammar streams decode plainly)
                own = gen.draft_own(alone=solo) if solo or self.shared_drafts else None
                if own is not None and used + len(own.tokens) > free:  # past the pool's free cells: the first ones
                    own = Proposal(own.tokens[: free - used], own.laws[: free - used], own.cost)
                n = len(own.tokens) if own is not None else 0
                used += n
                tick.streams[gen] = TickStream(slot, own if n else None, n, 0, False, before, own=True)
                rows.append((slot.view, [*ahead, *(own.tokens if n and own else ())], slot.target.n_past))
                continue
            request = gen.request(0, ahead[1:])
            history, room, copy, match = request.history, min(gen.draft_room(), MAX_DRAFT, free - used), [], 0
            if room:
                copy, match = slot.ngrams.follow(history).continuation(room)
            drafts, catch_up, remaining = None, 1, 0  # what the draft model needs to draft for it (None: it may not)
            reads = reads_of(gen.drafter)  # the window of the history its draft cache holds, as alone
            view = reads.window.view(history) if reads is not None else history
            if gen.drafter.needs_model and slot.draft is not None and room and len(view) + room < slot.draft.ctx.n_ctx:
                drafts = slot.model_acceptance
                catch_up = len(view) - min(common_prefix(slot.draft.tokens, view), len(view) - 1)
                remaining = min(REMAINING_CAP, gen.max_tokens - len(gen.tokens))
            live.append((slot, gen, ahead, before))
            windows.append(reads)
            candidates.append(Candidate(copy, match, slot.acceptance, room, drafts, catch_up, remaining))
        overhead = statistics.median(self._overheads) if self._overheads else 0.0
        # The plan's rows: one a stream and its drafts; the rows the others take and a grammar's forced ones are not its
        forced = sum(len(ahead) - 1 for _, _, ahead, _ in live)
        rows_max = min(self._parent.n_batch, free) - sum(len(tokens) for _, tokens, _ in rows) - forced
        choices = plan(candidates, self.costs, max_rows=rows_max, draft_costs=self.draft_costs, overhead=overhead)
        choices = self._checked(len(choices), self._probe(candidates, choices))
        if len(live) + sum(choice.d for choice in choices) > rows_max:  # a probe past the pool's free cells
            choices = [NONE] * len(choices)
        try:
            drafted = self.draft_shared(
                [
                    (slot, gen.request(c.d, ahead[1:]), cand.catch_up, reads)
                    for (slot, gen, ahead, _), c, cand, reads in zip(live, choices, candidates, windows)
                    if c.model
                ]
            )
        except NoRoomError:  # the draft's pool is full: its caches hold what they decoded, the streams go plain
            drafted = {}
        for (slot, gen, ahead, before), candidate, choice in zip(live, candidates, choices, strict=True):
            proposal = drafted.get(slot.index) if choice.model else None
            if choice.d and not choice.model:
                proposal = Proposal(list(candidate.copy[: choice.d]), [None] * choice.d)
            if proposal is not None and gen.constraint is not None:  # the drafts the step will verify (`admitted`)
                proposal = admitted(proposal, gen.constraint, len(ahead) - 1)
            proposal = proposal if proposal is not None and proposal.tokens else None
            n = len(proposal.tokens) if proposal is not None else 0
            tick.streams[gen] = TickStream(slot, proposal, n, candidate.match, choice.model, before)
            if candidate.copy and not choice.d:
                slot.acceptance.idle(candidate.match)
            rows.append((slot.view, [*ahead, *(proposal.tokens if proposal is not None else ())], slot.target.n_past))
        if rows:
            before_decoding = self._parent.seconds_decoding
            decode_shared(rows, [0 if i < tick.reads else len(tokens) for i, (_, tokens, _) in enumerate(rows)])
            sizes = [len(tokens) for _, tokens, _ in rows]
            if not tick.reads:  # a prompt's rows in it: its seconds are no step's shape
                self.costs.observe(passes(sizes), sum(sizes), self._parent.seconds_decoding - before_decoding)
        return sum(len(tokens) for _, tokens, _ in rows)

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
        if self.model_alpha.seen + self._model_seen() >= PROBE_EVIDENCE:
            return choices  # the pair's draft has been measured, alone or in a shared batch: the plan judges it
        unsure = [c.model is not None and c.room >= PROBE_DRAFTS for c in candidates]
        if not any(unsure):
            return choices
        self._probed_at = self._ticks
        return [StreamDraft(PROBE_DRAFTS, True) if u else NONE for u in unsure]

    def _model_seen(self) -> float:
        """The most evidence of the draft model's acceptance the pair's policies hold (its streams alone)."""
        return max([self._engine.policy.seen, *(policy.seen for policy in self._policies.values())])

    def draft_shared(self, chosen: Sequence[tuple[Slot, DraftRequest, int, DraftReads | None]]) -> dict[int, Proposal]:
        """The draft model's drafts for each (slot, its stream's request, tokens its draft cache lags, the window of the
        history that cache holds: its drafter's, as alone), by slot index: each slot's draft cache caught up with the
        request's history under its window in one batch (each its own lag: over the slots' one pool any shape is one
        pass; a cache far behind, a new request's, first on its own, in chunks, where all would not fit one batch),
        then one batch per drafted token; each token drawn from the stream's own law and rng, under its grammar
        (`draft_token`, as a lone `ModelDrafter` draws), a stream whose draft is unsure (p_min) or whose grammar ends
        stopping early."""
        if not chosen:
            return {}
        views = [
            reads.view(request.history) if reads is not None else request.history for _, request, _, reads in chosen
        ]
        lags = [max(1, min(lag, len(view))) for (_, _, lag, _), view in zip(chosen, views, strict=True)]
        assert self._drafts is not None  # the plan drafts with the model only where the pool has its context
        alone, rows = set(), sum(lags)
        for i in sorted(range(len(lags)), key=lambda i: -lags[i]):  # the longest catch-ups alone till the rest fit
            if rows <= self._drafts.n_batch:
                break
            alone.add(i)
            rows -= lags[i] - 1
        catch_up = []
        for i, ((slot, _, _, _), view, lag) in enumerate(zip(chosen, views, lags, strict=True)):
            draft, n = slot.draft, len(view) - lag
            draft.rollback_to(n)
            if i in alone:
                draft.sync(view[:-1])  # a new request's prompt: decoded on its own, in chunks
                n = len(view) - 1
            catch_up.append((draft.ctx, view[n:], n))
        self._decode_drafts(catch_up, outputs=[1] * len(catch_up))  # each cache's last row: the rest is not read
        loops = {}
        for (slot, request, _, _), (_, tokens, _) in zip(chosen, catch_up, strict=True):
            slot.draft.append(list(tokens), outputs=1)  # takes its rows of the batch
            recent = penalty_window(request.history, request.sampling)
            sampled = request.pq and not request.sampling.greedy
            pick = partial(draft_token, slot.draft.ctx, self._laws, recent, request=request, sampled=sampled)
            loops[slot.index] = draft_loop(request.k, pick, p_min=request.p_min, constraint=request.constraint)

        def decode(fed: list[tuple[int, int]]) -> None:  # one batch: each stream's last drafted token
            self._decode_drafts([(slots[i].draft.ctx, [token], slots[i].draft.n_past) for i, token in fed])
            for i, token in fed:
                slots[i].draft.append([token], outputs=1)

        slots = {slot.index: slot for slot, _, _, _ in chosen}
        return drive(loops, decode)

    def _decode_drafts(self, rows: list, outputs: list[int] | None = None) -> None:
        """`decode_shared` on the draft's slots context, timed into `draft_costs`."""
        before = self._drafts.seconds_decoding
        decode_shared(rows, outputs)
        sizes = [len(tokens) for _, tokens, _ in rows]
        self.draft_costs.observe(passes(sizes), sum(sizes), self._drafts.seconds_decoding - before)

    def _decoding(self) -> float:
        """Seconds inside llama_decode so far, of the target's context and the draft's slots context."""
        return self._parent.seconds_decoding + (self._drafts.seconds_decoding if self._drafts is not None else 0.0)

    @staticmethod
    def waits(slot: Slot) -> bool:
        """Whether rows decoded for `slot` in this tick's shared batch wait for its step (which must then come before
        any step that decodes on its own: that would replace the context's logits)."""
        return slot.view.pending

    @staticmethod
    def discard(slots: Sequence[Slot]) -> None:
        """Rows still pending on `slots` after a tick (a stream that ended or was cancelled before its step) removed."""
        for slot in slots:
            slot.view.discard()

    def end(self, streams: Sequence[tuple[Slot, Generation]]) -> None:
        """End the tick after its steps: each stream that verified drafts decoded in it teaches its acceptance, and
        the tick's time outside the decodes is the overhead the next plans count (a plain tick pays it as a drafting
        one does: on the demo pair's 2 cores about 10 ms beside 24 ms of decoding, which made fewer, longer ticks
        pay)."""
        tick, self.tick = self.tick, None
        if tick is None:
            return
        seconds = time.perf_counter() - tick.began
        if not tick.reads and tick.solo is None:  # the plan's pace: a tick of several streams, reading no prompt
            self._overheads.append(max(0.0, seconds - (self._decoding() - tick.decoding)))
            emitted = sum(len(gen.tokens) for _, gen in streams) - tick.emitted
            drafted = any(stream.n and not stream.own for stream in tick.streams.values())
            self._rates.setdefault((len(streams), drafted), deque(maxlen=16)).append(emitted / seconds)
        for gen, stream in tick.streams.items():
            if not stream.n or stream.own:
                continue
            stats, (drafted_before, accepted, rejections) = gen.stats, stream.before
            if stats.drafted > drafted_before:  # its step took them (not cancelled first)
                learner = stream.slot.model_acceptance if stream.model else stream.slot.acceptance
                taken, rejected = stats.accepted - accepted, stats.rejections > rejections
                learner.learn(0 if stream.model else stream.match, taken, rejected)
                if stream.model:
                    self.model_alpha.learn(0, taken, rejected)
