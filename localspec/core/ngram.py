"""N-gram drafting over the whole history: an index of every n-gram of the prompt and the output, by rolling hash.

`NgramIndex` keeps, for each of a few lengths n (2 to 32), where the latest earlier occurrence of each n-gram ended,
updated in O(1) per token (one hash and one table write per length, logged); a new generation that shares only a prefix
of the last one (a chat's next turn, a regenerated answer) undoes and redoes only what differs, so no per-token cost
grows with the history. `continuation` finds the longest n-gram ending the history that occurred before and copies what
followed it — up to 64 tokens, past the end of the history where the text repeats itself (LZ77's overlapping copy) —
with the match's length, which says how far to trust it. `NgramDrafter` (`--drafter ngram`) proposes that copy;
`NgramFirst` (`--drafter model+ngram`) proposes it where the match is long enough and lets the draft model draft the
rest (core/drafters.py's `ModelDrafter` or a bridged one) — or all of it where the history has no such match. A copied
token is a point law (one-hot, DESIGN §1): it is a function of the history alone.
"""

from __future__ import annotations

from array import array

LENGTHS = (2, 3, 4, 6, 8, 12, 16, 24, 32)  # the n-gram lengths indexed: the longest that matches wins
_BASE = 0x9E3779B97F4A7C15  # an odd 64-bit multiplier (the golden ratio's): a polynomial hash mod 2^64
_MASK = (1 << 64) - 1
MATCH_CAP = 64  # a match is measured back to at most this many tokens (its length only says how far to trust it)


class NgramIndex:
    """Every n-gram of one token history (n in `LENGTHS`), each mapped to where its latest occurrence ended.

    `prefix[i]` is the rolling hash of tokens[:i]; the n-gram tokens[i-n:i] hashes to prefix[i] − prefix[i-n]·Bⁿ
    (mod 2⁶⁴), so adding a token costs one multiply and one table write per length whatever n is. An n-gram enters
    the table when the token after it arrives (the table maps it to that token's index), so the n-gram that ends the
    history is never its own match. Each write is logged with the entry it replaced, so `truncate` puts back what
    the forgotten tokens overwrote, in O(tokens forgotten). A hash may collide: a match is checked against the
    tokens before it is used.
    """

    def __init__(self, lengths: tuple[int, ...] = LENGTHS) -> None:
        self.lengths = tuple(sorted(lengths))
        self.tokens: list[int] = []
        self.prefix: list[int] = [0]
        self.tables: dict[int, dict[int, int]] = {n: {} for n in self.lengths}
        self._powers = {n: pow(_BASE, n, 1 << 64) for n in self.lengths}
        # The undo log: the key of each table write and the index it replaced (-1: none), in the order written;
        # token i's writes start at _writes[i], one per length ≤ i, shortest first.
        self._keys = array("Q")
        self._replaced = array("q")
        self._writes = array("q", [0])

    def __len__(self) -> int:
        return len(self.tokens)

    def _hash(self, end: int, n: int) -> int:
        """The hash of tokens[end-n:end]."""
        return (self.prefix[end] - self.prefix[end - n] * self._powers[n]) & _MASK

    def append(self, token: int) -> None:
        """Add one token: the n-grams that end just before it now point at it. O(len(lengths))."""
        i = len(self.tokens)  # the new token's index: each n-gram tokens[i-n:i] is followed by it
        for n in self.lengths:
            if n > i:
                break
            key = self._hash(i, n)
            table = self.tables[n]
            self._keys.append(key)
            self._replaced.append(table.get(key, -1))
            table[key] = i
        self.tokens.append(token)
        self.prefix.append((self.prefix[-1] * _BASE + token + 1) & _MASK)
        self._writes.append(len(self._keys))

    def truncate(self, n_tokens: int) -> None:
        """Forget every token from index `n_tokens` on, and put back what their writes replaced (newest first)."""
        for i in range(len(self.tokens) - 1, n_tokens - 1, -1):
            start = self._writes[i]
            for j in range(self._writes[i + 1] - 1, start - 1, -1):
                table, key, before = self.tables[self.lengths[j - start]], self._keys[j], self._replaced[j]
                if before < 0:
                    del table[key]
                else:
                    table[key] = before
        if n_tokens < len(self.tokens):
            keep = self._writes[n_tokens]
            del self._keys[keep:], self._replaced[keep:], self._writes[n_tokens + 1 :]
            del self.tokens[n_tokens:], self.prefix[n_tokens + 1 :]

    def follow(self, history: list[int], *, same: bool = False) -> None:
        """Make the index hold exactly `history`: keep the common prefix, forget the rest, add what is new.

        Args:
            history: the token history.
            same: the caller knows `history` extends what the index holds (the list one generation appends to):
                only the new tokens are read, so following a growing history costs O(1) per token.
        """
        tokens = self.tokens
        if not same:
            n = min(len(tokens), len(history))
            if tokens[:n] != history[:n]:
                n = next(i for i in range(n) if tokens[i] != history[i])
            self.truncate(n)
        for token in history[len(self.tokens) :]:
            self.append(token)

    def match(self, n_min: int = 2) -> tuple[int, int]:
        """The latest earlier occurrence of the longest n-gram (n ≥ `n_min`, in `lengths`) that ends the history:
        (the index of the token that followed it, the match's length measured back up to MATCH_CAP); (-1, 0) if none.
        """
        tokens, m = self.tokens, len(self.tokens)
        for n in reversed(self.lengths):
            if n < n_min:
                break
            if n >= m:
                continue
            follow = self.tables[n].get(self._hash(m, n), -1)
            if follow < 0 or tokens[follow - n : follow] != tokens[m - n :]:
                continue  # none, or a hash collision
            length = n
            while length < MATCH_CAP and follow - length > 0 and tokens[follow - length - 1] == tokens[m - length - 1]:
                length += 1
            return follow, length
        return -1, 0

    def continuation(self, k: int, n_min: int = 2) -> tuple[list[int], int]:
        """Up to k tokens that followed the longest earlier match of the history's end, and that match's length.

        The copy runs on past the end of the history into its own tokens where the match is recent (in "a b a b",
        the match "a b" at 0 continues "a b a b …"): a repeating text is drafted as far as k asks.
        """
        follow, length = self.match(n_min)
        if follow < 0:
            return [], 0
        tokens, m = self.tokens, len(self.tokens)
        out: list[int] = []
        for j in range(follow, follow + k):
            token = tokens[j] if j < m else out[j - m]
            if token < 0:
                break  # an image's position (core/media.py) is never a draft
            out.append(token)
        return out, length


class HistoryIndex:
    """The `NgramIndex` of the history a drafter is asked after, kept current across steps and generations."""

    def __init__(self) -> None:
        self.index = NgramIndex()
        self._history: list[int] | None = None  # the list the index followed last (one generation appends to it)

    def follow(self, history: list[int]) -> NgramIndex:
        # Within one generation the loop appends to one list, so only its new tokens are read; a new list (the next
        # generation) is compared with what the index holds and only the part that differs is redone.
        same = history is self._history and len(history) >= len(self.index)
        self.index.follow(history, same=same)
        self._history = history
        return self.index

    def keep(self, n: int) -> None:
        self.index.truncate(n)
