"""`KVSequence`: the single owner of one model's token history and n_past.

Whatever is in the llama.cpp cache is exactly `tokens`, always: every append and rollback goes
through here. Rollback removes the KV tail when the memory allows it; recurrent/hybrid memory made with
llama.cpp's rollback snapshots (`n_rs_seq`) removes a tail of its last decode too ("snapshot"); otherwise, and
sliding-window caches that lost cells, fall back to a state checkpoint, then to a full re-prefill.
`drop` removes a span from the middle and shifts the rest back (context shifting), where the
memory can move positions. With a `PromptCache` (core/promptcache.py), `sync` saves what it is about to drop and
restores an earlier prompt's state instead of reading it again. The `Context` a cache is kept in, and the token
history's helpers, are core/context.py's (imported from here too).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from localspec.errors import ContextError

from .context import Context, Media, StateCache, common_prefix, inside_image, media_run
from .context import whole_images as whole_images  # for callers that import it from here (core/generation.py)

log = logging.getLogger(__name__)

ROLLBACK_MODES = ("auto", "seq_rm", "snapshot", "checkpoint", "refill")
PROGRESS_CHUNK = 256  # tokens per decode when a prefill reports progress (and may be stopped)
SAVE_MIN = 64  # tokens about to be dropped worth keeping in a prompt cache (fewer are read again as fast)
RESTORE_MIN = 32  # tokens to read before a prompt cache is looked up (`PromptCache.best`'s least gain)

Progress = Callable[[int, int], bool]  # (decoded, total) after each chunk; False stops the prefill


class PrefillStopped(Exception):
    """A progress callback asked to stop; the cache holds the tokens decoded so far (still consistent)."""


@dataclass(slots=True)
class Checkpoint:
    """A saved sequence state and how many tokens it holds."""

    n_past: int
    state: bytes
    partial: bool = False  # only a hybrid memory's recurrent part: the attention tail is removed after restoring it


class KVSequence:
    """One model context and the tokens it holds.

    Args:
        ctx: the model's context (this object does not own it; the caller closes it).
        rollback: "auto" probes the memory once; "checkpoint" / "refill" force those paths (tests,
            and models whose tail removal is known to be unreliable).
    """

    def __init__(self, ctx: Context, *, rollback: str = "auto") -> None:
        assert rollback in ROLLBACK_MODES
        self.ctx = ctx
        self.tokens: list[int] = []
        self.n_decoded = 0  # tokens sent through llama_decode (prefix reuse and rollback cost)
        self.n_refills = 0  # full re-prefills forced by a failed rollback
        self.n_dropped = 0  # tokens removed from the middle by `drop` (context shifting)
        self.probed = rollback == "auto"
        self._tail = 0  # tokens in the last decode: a "snapshot" rollback drops fewer (`_snapshot_rollback`)
        self.mode = self._probe() if self.probed else rollback
        self._checkpoint: Checkpoint | None = None
        self._anchor: Checkpoint | None = None  # the last prompt's state (`anchor`)
        self.prompt_cache: StateCache | None = None  # earlier prompts' states (`use_cache`)
        self.media: Media | None = None  # how it reads the images in its history (None: it holds none)
        self.cache_namespace = ""
        self.n_restored = 0  # tokens restored from the prompt cache instead of decoded
        # Where a read of new tokens starts when n are held (`reuse`): one earlier for a draft head that lacks the
        # hidden row before the first new token, so the read brings it (core/head.py). None: at n.
        self.read_start: Callable[[int], int] | None = None

    def use_cache(self, cache: StateCache | None, namespace: str) -> None:
        """Save the states `sync` drops into `cache`, and restore from it, under `namespace` (the states of one
        model's contexts: any sequence of them may restore another's). None: no cache. A memory that can neither
        drop a tail nor restore a state (`refill`) keeps none."""
        self.prompt_cache = cache if self.mode != "refill" else None
        self.cache_namespace = namespace

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def room(self, *, need: int = 1) -> int:
        """How many tokens a decode after these can place now: the positions left to n_ctx, and where the context is
        one pool shared by several sequences (`serve --parallel`) its free cells — fewer than `need` free: idle
        slots' cells are freed first (`llama.context.Context.room`)."""
        return self.ctx.room(self.n_past, need=need)

    def needs_checkpoint(self, k: int, *, one_batch: bool = True) -> bool:
        """True when k tokens about to be decoded, and perhaps rolled back, must be preceded by `checkpoint()`:
        always for "checkpoint" memory; for "snapshot" memory unless they go in one batch (a verify pass: the
        snapshots of earlier decodes are gone) of at most as many tokens as llama.cpp keeps snapshots for."""
        if self.mode == "snapshot":
            return not one_batch or k > self.ctx.n_rs_seq
        return self.mode == "checkpoint"

    def _probe(self) -> str:
        """Find out once whether this memory can drop a partial tail (recurrent memory cannot, unless made with
        rollback snapshots, and then only within its last decode)."""
        self.ctx.clear()
        self.ctx.decode([0, 0], 0, outputs=0)
        if self.ctx.remove_from(1) and self.ctx.pos_range()[1] == 0:
            mode = "snapshot" if self.ctx.n_rs_seq else "seq_rm"
        else:
            try:
                self.ctx.load_state(self.ctx.save_state())
                mode = "checkpoint"
            except ContextError:
                mode = "refill"  # correct but slow: the engine stops speculating on such a model
        self.ctx.clear()
        log.info("%s: rollback by %s", self.ctx.model.path.name, mode)
        return mode

    def warm(self, rows: int = 9) -> None:
        """Run a 1-row and a `rows`-row decode on the empty cache, then empty it again: llama.cpp allocates
        and touches its buffers now, so the first timed steps of the first answer are not the cold ones."""
        assert not self.tokens, "warm an empty sequence only"
        rows = max(1, min(rows, self.ctx.n_ctx - 1))
        self.ctx.decode([0], 0, outputs=1)
        self.ctx.decode([0] * rows, 1, outputs=rows)
        self.ctx.clear()

    def append(self, tokens: list[int], *, outputs: int = 1, progress: Progress | None = None) -> None:
        """Decode `tokens` after the current ones; logits for the last `outputs` rows.

        With `progress`, decode in chunks and report after each one.

        Raises:
            PrefillStopped: `progress` returned False (the chunks decoded so far stay in the cache).
            ContextError: an image in `tokens` and no way to read it, or `outputs` asked of an image's rows.
        """
        if tokens and min(tokens) < 0:
            self._append_media(tokens, outputs=outputs, progress=progress)
            return
        if progress is None or len(tokens) <= PROGRESS_CHUNK:
            if tokens:
                self._tail = 0
                self.ctx.decode(tokens, self.n_past, outputs=outputs)
                self.tokens.extend(tokens)
                self.n_decoded += len(tokens)
                # llama.cpp keeps a snapshot after each token of a decode's (last) batch: a later one overwrites them
                self._tail = len(tokens) if len(tokens) <= self.ctx.n_batch else 0
            return
        for start in range(0, len(tokens), PROGRESS_CHUNK):
            chunk = tokens[start : start + PROGRESS_CHUNK]
            last = start + len(chunk) == len(tokens)
            self.append(chunk, outputs=outputs if last else 0)
            if not progress(start + len(chunk), len(tokens)) and not last:
                raise PrefillStopped()

    def _append_media(self, tokens: list[int], *, outputs: int, progress: Progress | None) -> None:
        """`append` of a history holding images: its text runs decoded as tokens, each image by `media`, whole."""
        if self.media is None:
            raise ContextError(f"{self.ctx.model.path.name} cannot read images: load the pair with its projector")
        total, i = len(tokens), 0
        while i < total:
            n = media_run(tokens, i)
            if n:
                if i + n == total and outputs:
                    raise ContextError("a prompt cannot end with an image: write some text after it")
                self._tail = 0
                self.media.decode(self.ctx, tokens[i : i + n], self.n_past)
                self.tokens.extend(tokens[i : i + n])
                self.n_decoded += n
                i += n
                if progress is not None and not progress(i, total) and i < total:
                    raise PrefillStopped()
                continue
            j = i
            while j < total and tokens[j] >= 0:
                j += 1
            part = None if progress is None else (lambda done, _, base=i: progress(base + done, total))
            self.append(tokens[i:j], outputs=outputs if j == total else 0, progress=part)
            i = j

    def _whole_images(self, n: int) -> int:
        """`n`, or where the image it would cut starts (a history never ends inside an image)."""
        while inside_image(self.tokens, n):
            n -= 1
        return n

    @property
    def can_drop(self) -> bool:
        """True when `drop` can remove a span from the middle (KV memory that can shift positions)."""
        info = self.ctx.model.info
        return self.mode == "seq_rm" and not (info.is_recurrent or info.is_hybrid) and self.ctx.can_shift()

    def can_drop_span(self, start: int, n: int) -> bool:
        """True when `drop(start, n)` would succeed: the memory can shift, and a sliding-window cache
        (without swa_full) keeps every cell the next token's window needs."""
        n_swa = self.ctx.model.info.n_swa
        window_safe = n_swa == 0 or self.ctx.swa_full or start + n <= self.n_past - n_swa
        return window_safe and self.can_drop

    def drop(self, start: int, n: int) -> bool:
        """Remove tokens[start:start+n] from the cache and move the later ones n positions back.

        The later tokens keep their cells (their keys are re-rotated, not recomputed): the cache is
        the model's state from now on, no longer the state a fresh prefill of `tokens` would give.

        Returns:
            False when the memory cannot (see `can_drop_span`); nothing changed then.
        """
        assert start >= 0 and n >= 0 and start + n <= self.n_past
        if n == 0:
            return True
        if not self.can_drop_span(start, n):
            return False
        if start + n == self.n_past:
            self.rollback_to(start)
            return True
        if not self.ctx.remove_span(start, start + n):
            return False
        self._checkpoint = self._anchor = None
        self.ctx.shift(start + n, -n)
        del self.tokens[start : start + n]
        self.n_dropped += n
        return True

    def checkpoint(self) -> None:
        """Save the state so a later `rollback_to` at or after this point can restore it. A hybrid memory saves
        its recurrent part alone — a size that does not grow with the context — and its attention tail is removed
        on restore; the whole state would copy the attention cache every step."""
        self._checkpoint = self._saved()

    def anchor(self) -> None:
        """Keep the state after a prompt, where the memory cannot drop an arbitrary tail (recurrent/hybrid): the
        next turn of a chat diverges soon after it (a template that drops the last reply's reasoning, a
        regenerate), and restoring it then beats re-reading the whole conversation. One at a time; a hybrid keeps
        its recurrent part alone (`checkpoint`). A memory that cannot cut a state back also keeps it whole in the
        prompt cache: the same prompt coming back later restores it."""
        if self.mode in ("snapshot", "checkpoint") and self.tokens:
            self._anchor = self._saved()
        if self.prompt_cache is not None and not self._trims and self.n_past >= SAVE_MIN:  # whole: it cannot be cut
            self.prompt_cache.save(self.cache_namespace, self.tokens, self.ctx.save_state(), trims=False)

    def _saved(self) -> Checkpoint:
        """The state now, as `checkpoint` and `anchor` keep it: a hybrid memory's recurrent part alone."""
        partial = self.ctx.model.info.is_hybrid
        return Checkpoint(self.n_past, self.ctx.save_state(partial=partial), partial)

    def rollback_to(self, n: int) -> None:
        """Keep only the first `n` tokens in the cache and in `tokens` (fewer where n would cut an image: all of it
        goes)."""
        assert 0 <= n <= self.n_past
        if self.media is not None:
            n = self._whole_images(n)
        if n == self.n_past:
            return
        if self._checkpoint is not None and n < self._checkpoint.n_past:
            self._checkpoint = None  # it holds tokens that are about to be dropped
        if self._anchor is not None and n < self._anchor.n_past:
            self._anchor = None
        if n == 0:
            self.ctx.clear()
            self.tokens.clear()
            self._tail = 0
            return
        if self.mode == "seq_rm" and self._window_keeps(n) and self.ctx.remove_from(n) and self._holds_prefix(n):
            del self.tokens[n:]
            return
        if self.mode == "snapshot" and self._snapshot_rollback(n):
            return
        saved = [cp for cp in (self._checkpoint, self._anchor) if cp is not None]  # each holds ≤ n tokens
        if saved and self.mode != "refill":
            cp = max(saved, key=lambda c: c.n_past)  # the fewest tokens to decode again
            if self._restore(cp):
                keep, self.tokens = self.tokens[:n], self.tokens[: cp.n_past]
                self.append(keep[cp.n_past :], outputs=0)
                return
        self._refill(n)

    def _restore(self, cp: Checkpoint) -> bool:
        """Bring the memory back to `cp` (the tokens list is the caller's); False leaves it to a re-prefill."""
        self._tail = 0  # the restored state has no snapshots
        self.ctx.load_state(cp.state, partial=cp.partial)
        return not cp.partial or (self.ctx.remove_from(cp.n_past) and self._holds_prefix(cp.n_past))

    def _snapshot_rollback(self, n: int) -> bool:
        """Drop the tail after n with llama.cpp's snapshots, where they hold the state after token n: within the
        last decode (the snapshots of earlier ones are overwritten, and llama.cpp would restore a stale one without
        a word), at most n_rs_seq back, once."""
        back, tail = self.n_past - n, self._tail
        self._tail = 0  # single use: llama.cpp refuses a second rollback before the next decode
        if not (back < tail and back <= self.ctx.n_rs_seq):
            return False
        if self.ctx.remove_from(n) and self._holds_prefix(n):
            del self.tokens[n:]
            return True
        return False

    def _window_keeps(self, n: int) -> bool:
        # A sliding-window cache reports success for any removal, but the logits after it are silently wrong unless
        # the window's cells before n are all still there. swa_full keeps every cell it decodes — but a state
        # restored from the prompt cache holds the window's cells alone (llama.cpp saves no more), so the cells are
        # asked, not the flag.
        n_swa = self.ctx.model.info.n_swa
        if n_swa == 0:
            return True
        return self.ctx.pos_range()[0] <= max(n - n_swa + 1, 0)

    def _holds_prefix(self, n: int) -> bool:
        pos_min, pos_max = self.ctx.pos_range()
        return pos_max == n - 1 and pos_min >= 0

    def _refill(self, n: int) -> None:
        keep = self.tokens[:n]
        if self.mode != "refill":
            log.warning("%s: rollback to %d failed; re-prefilling", self.ctx.model.path.name, n)
        self.n_refills += 1
        self.ctx.clear()
        self.tokens = []
        self.append(keep, outputs=0)

    def sync(self, tokens: list[int], *, outputs: int = 0, progress: Progress | None = None) -> int:
        """Make the cache hold exactly `tokens`, reusing the longest common prefix.

        Args:
            tokens: the wanted history.
            outputs: rows at the end whose logits are needed (the last token is re-decoded if
                it was already cached, since logits are not kept across decodes).
            progress: called after each chunk of a long decode (see `append`).

        Returns:
            How many tokens were decoded.

        Raises:
            PrefillStopped: `progress` asked to stop; the cache holds a prefix of `tokens`.
        """
        before = self.n_decoded
        self.reuse(tokens, len(tokens) - outputs)
        self.append(tokens[self.n_past :], outputs=outputs, progress=progress)
        return self.n_decoded - before

    def reuse(self, tokens: list[int], limit: int | None = None) -> int:
        """Hold the most of `tokens[:limit]` this cache has without reading them: the common prefix, or a prompt
        cache's state that holds more (what is dropped saved there first); the rest of the cells go. `sync`'s first
        half, and what a prompt read in parts asks before its first part (a recurrent or hybrid memory restores a
        cached state only where all of its tokens come, so it must be looked up with the whole prompt).

        Returns:
            The tokens held: n_past.
        """
        limit = len(tokens) if limit is None else limit
        common = min(common_prefix(self.tokens, tokens), limit)
        if self.prompt_cache is not None:
            common = self._through_cache(tokens, common, limit)
        if self.read_start is not None:
            common = self.read_start(common)
        self.rollback_to(common)  # (fewer where `common` would cut an image)
        return self.n_past

    def reusable(self, tokens: list[int]) -> int:
        """How many of `tokens` `reuse` would hold without reading them (the common prefix, or a prompt cache's state),
        found without changing anything: what a read of `tokens` would spare."""
        common = common_prefix(self.tokens, tokens)
        if self.prompt_cache is not None and len(tokens) - common >= RESTORE_MIN:
            common = self.prompt_cache.peek(self.cache_namespace, tokens, common, trims=self._trims)
        return common

    @property
    def _trims(self) -> bool:
        """Whether a restored state can be cut back to any prefix: plain KV alone. A sliding window's state holds the
        window's cells only, even with swa_full (llama.cpp saves no more): cut back, the cells before the cut that
        the window needs are missing (the output left the target's at the 6th token, measured on the tiny Gemma 4)."""
        return self.mode == "seq_rm" and self.ctx.model.info.n_swa == 0

    def _through_cache(self, tokens: list[int], common: int, limit: int) -> int:
        """Before `sync` keeps `common` tokens and reads the rest of `tokens`: save what it would drop, then restore
        the cached state that holds the most of `tokens[:limit]`, if that spares reading. Returns the tokens held."""
        cache, space, trims = self.prompt_cache, self.cache_namespace, self._trims
        if self.n_past - common >= SAVE_MIN:  # the cells past `common` are about to go: keep them
            cache.save(space, self.tokens, self.ctx.save_state(), trims=trims)
        if limit - common < RESTORE_MIN:  # a step's few tokens (every step syncs): nothing to look up
            return common
        found = cache.best(space, tokens[:limit], common, trims=trims)
        if found is None:
            return common
        entry, n = found
        self._checkpoint = self._anchor = None
        self._tail = 0
        self.ctx.room(0, need=len(entry.tokens))  # a pool the slots share: room for the state (idle slots' freed)
        try:
            self.ctx.load_state(entry.state)
        except ContextError as e:  # the sequence's cells are in doubt: empty them, read the prompt
            log.warning("%s: a cached prompt could not be restored (%s); reading it", self.ctx.model.path.name, e)
            self.ctx.clear()
            self.tokens = []
            return 0
        self.tokens = list(entry.tokens)
        self.n_restored += n
        return n

    def repair(self) -> None:
        """Make `tokens` and the cache agree again after an operation was cut short (Ctrl+C, an error).

        An exception can land between a `llama_decode` and the bookkeeping after it, or between a
        removal and the list update: the cache then holds more cells than `tokens` (drop them) or fewer
        (forget the tokens it lost). A tail that cannot be dropped ends in a re-prefill.
        """
        self._checkpoint = self._anchor = None
        self._tail = 0  # the decode that was cut short may not have been recorded: its snapshots are unknown
        held = self.ctx.pos_range()[1] + 1
        if held < self.n_past:
            del self.tokens[held:]
        elif held > self.n_past and (
            self.mode == "snapshot"  # a removal could land on a stale snapshot (see `_snapshot_rollback`)
            or not (self.ctx.remove_from(self.n_past) and self._holds_prefix(self.n_past))
        ):
            self._refill(self.n_past)

    def check(self) -> None:
        """Check the invariant: the cache holds exactly `tokens`, positions 0..n_past-1.

        Raises:
            AssertionError: it does not (a bug: raised explicitly, so `python -O` keeps the check).
        """
        _, pos_max = self.ctx.pos_range()
        if pos_max != self.n_past - 1:
            raise AssertionError(f"KV holds up to {pos_max}, tokens say {self.n_past}")
