"""`PromptCache`: the KV states of earlier prompts kept in RAM, and with a directory on disk too, so a prompt that comes
back is restored instead of read again (issue 56; llama-server's `--cache-ram`). Agents that take turns with long
system prompts, two chats the user switches between (F4), a branch: each is one copy out of llama.cpp's buffer and
one copy back; from disk, the same prompts after a restart.

A `KVSequence` about to drop tokens it holds (another prompt takes its cells) saves its sequence's state here
first, keyed by those tokens; one about to read a prompt restores the entry sharing the longest prefix with it when
that saves reading. States are kept per namespace (the target's, each drafter cache's), within one byte budget, the
least recently used dropped first. A memory that can drop any tail (plain KV) restores an entry and trims it to the
common prefix; a recurrent or hybrid memory, or a sliding window without its full cache, only an entry whose tokens
are all a prefix of the prompt (its state cannot be cut back).

On disk too with `--cache-dir` (core/promptdisk.py `DiskTier`): RAM stays the first tier, the disk the second.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from dataclasses import dataclass

from localspec.llama.context import memory_bytes

from .kv import RESTORE_MIN, SAVE_MIN, common_prefix
from .promptdisk import DiskTier

log = logging.getLogger(__name__)

GAIN_MIN = RESTORE_MIN  # a restore must spare reading at least this many tokens
AUTO_MAX = 8 * 2**30  # the default budget's cap (llama-server's --cache-ram default)


def cache_budget(asked: int | None) -> int:
    """The byte budget for `asked` (`LoadParams.cache_ram`): itself, or for None an eighth of the memory free now
    (after the models loaded), at most `AUTO_MAX`."""
    if asked is not None:
        return asked
    return min(AUTO_MAX, memory_bytes() // 8)


@dataclass(frozen=True, slots=True)
class Entry:
    """A saved sequence state and the tokens it holds."""

    namespace: str
    tokens: list[int]  # a list, as the token lists it is compared with (a tuple never equals a list)
    state: bytes


class PromptCache:
    """Saved sequence states within `budget` bytes, least recently used dropped first; with `disk`, on disk too.

    Args:
        budget: the most bytes of state kept in RAM (0: keep none there).
        disk: the states' files (`--cache-dir`), for the namespaces `identify` names; None: RAM alone.
    """

    def __init__(self, budget: int, disk: DiskTier | None = None) -> None:
        self.budget = budget
        self.used = 0
        self.restored = 0  # tokens restored instead of read, over the cache's life
        self.disk = disk
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # oldest use first
        self._next = 0
        self._identities: dict[str, str] = {}  # namespace -> its identity on disk (`identify`)

    def __len__(self) -> int:
        return len(self._entries)

    def identify(self, namespace: str, model_path: str | os.PathLike) -> None:
        """Keep `namespace`'s states on disk too (with a disk tier), as states of the model file at `model_path`:
        they are restored only into the same namespace of the same file, after a restart too."""
        if self.disk is not None and namespace not in self._identities:
            try:
                self._identities[namespace] = self.disk.identity(namespace, model_path)
            except OSError as e:  # no file to name it by (a model built in memory): its states stay in RAM
                log.debug("prompt cache: %s stays in RAM (%s)", namespace, e)

    def save(self, namespace: str, tokens: list[int], state: bytes, *, trims: bool) -> None:
        """Keep `state`, the sequence holding `tokens`. `trims`: the memory can cut a restored state back to any
        prefix, so entries whose tokens are a prefix of these are covered by it and go."""
        if len(tokens) < SAVE_MIN:
            return
        tokens = list(tokens)
        self._keep(namespace, tokens, state, trims=trims)
        if (identity := self._identities.get(namespace)) is not None:
            self.disk.put(identity, tokens, state, trims=trims)

    def best(self, namespace: str, tokens: list[int], held: int, *, trims: bool) -> tuple[Entry, int] | None:
        """The entry to restore before reading `tokens` into a sequence that already holds `held` of them, and how
        many of them it gives; None when none spares at least `GAIN_MIN` tokens of reading. RAM first; a file on
        disk that gives more is read (and kept in RAM)."""
        found = self._best_in_ram(namespace, tokens, held, trims=trims)
        identity = self._identities.get(namespace)
        if identity is None:
            return found
        most = found[1] if found is not None else held + GAIN_MIN - 1
        while (hit := self.disk.lookup(identity, tokens, most, trims=trims)) is not None:
            state = self.disk.read(hit[0])
            if state is not None:  # else damaged or gone (said, forgotten): the next best
                self._keep(namespace, hit[0].tokens, state, trims=trims)
                return Entry(namespace, list(hit[0].tokens), state), hit[1]
        if found is not None:
            self.disk.touch(identity, found[0].tokens)  # its file, if any, stays as recent as its use
        return found

    def peek(self, namespace: str, tokens: list[int], held: int, *, trims: bool) -> int:
        """How many of `tokens` a sequence holding `held` of them would hold after `best`'s restore (`held` where
        none), asking RAM and the files' headers: no state read, no entry touched."""
        found = self._best_in_ram(namespace, tokens, held, trims=trims, touch=False)
        most = held if found is None else found[1]
        identity = self._identities.get(namespace)
        if identity is not None and self.disk is not None:
            hit = self.disk.lookup(identity, tokens, most, trims=trims)
            most = most if hit is None else hit[1]
        return most

    def flush(self) -> None:
        """Wait until the states saved so far are on disk (a no-op without a disk tier)."""
        if self.disk is not None:
            self.disk.flush()

    def _keep(self, namespace: str, tokens: list[int], state: bytes, *, trims: bool) -> None:
        if len(state) > self.budget:
            return
        for key, entry in list(self._entries.items()):
            if entry.namespace != namespace:
                continue
            covered = entry.tokens == tokens or (trims and tokens[: len(entry.tokens)] == entry.tokens)
            if covered:
                self._drop(key)
        while self.used + len(state) > self.budget:
            self._drop(next(iter(self._entries)))
        self._entries[self._next] = Entry(namespace, tokens, state)
        self._next += 1
        self.used += len(state)

    def _best_in_ram(
        self, namespace: str, tokens: list[int], held: int, *, trims: bool, touch: bool = True
    ) -> tuple[Entry, int] | None:
        found, most = None, held + GAIN_MIN - 1
        for key, entry in self._entries.items():
            if entry.namespace != namespace:
                continue
            n = common_prefix(entry.tokens, tokens)
            if not trims and n < len(entry.tokens):
                continue  # its state holds tokens past the prompt's, and this memory cannot cut them off
            if n > most:
                found, most = key, n
        if found is None:
            return None
        if touch:
            self._entries.move_to_end(found)
        return self._entries[found], most

    def _drop(self, key: int) -> None:
        self.used -= len(self._entries.pop(key).state)
