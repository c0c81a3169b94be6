"""`PromptCache`: the KV states of earlier prompts kept in RAM, so a prompt that comes back is restored instead of
read again (issue 56; llama-server's `--cache-ram`). Agents that take turns with long system prompts, two chats the
user switches between (F4), a branch: each is one copy out of llama.cpp's buffer and one copy back.

A `KVSequence` about to drop tokens it holds (another prompt takes its cells) saves its sequence's state here
first, keyed by those tokens; one about to read a prompt restores the entry sharing the longest prefix with it when
that saves reading. States are kept per namespace (the target's, each drafter cache's), within one byte budget, the
least recently used dropped first. A memory that can drop any tail (plain KV) restores an entry and trims it to the
common prefix; a recurrent or hybrid memory, or a sliding window without its full cache, only an entry whose tokens
are all a prefix of the prompt (its state cannot be cut back).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

from localspec.llama.context import memory_bytes

from .kv import RESTORE_MIN, SAVE_MIN, common_prefix

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
    """Saved sequence states within `budget` bytes, least recently used dropped first.

    Args:
        budget: the most bytes of state kept (0: keep nothing).
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self.restored = 0  # tokens restored instead of read, over the cache's life
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # oldest use first
        self._next = 0

    def __len__(self) -> int:
        return len(self._entries)

    def save(self, namespace: str, tokens: list[int], state: bytes, *, trims: bool) -> None:
        """Keep `state`, the sequence holding `tokens`. `trims`: the memory can cut a restored state back to any
        prefix, so entries whose tokens are a prefix of these are covered by it and go."""
        if len(state) > self.budget or len(tokens) < SAVE_MIN:
            return
        tokens = list(tokens)
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

    def best(self, namespace: str, tokens: list[int], held: int, *, trims: bool) -> tuple[Entry, int] | None:
        """The entry to restore before reading `tokens` into a sequence that already holds `held` of them, and how
        many of them it gives; None when none spares at least `GAIN_MIN` tokens of reading."""
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
        self._entries.move_to_end(found)
        return self._entries[found], most

    def _drop(self, key: int) -> None:
        self.used -= len(self._entries.pop(key).state)
