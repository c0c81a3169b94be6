"""The n-gram index of the whole history (core/ngram.py): what it finds is what a brute-force search of the history
finds, through any edits of the history; following a growing history reads only the new tokens and a new one that
shares a prefix redoes only the rest (no per-token cost that grows with the history); a hash collision is never a
match."""

from __future__ import annotations

import random

import pytest
from support import GREEDY

from localspec.core import ngram
from localspec.core.drafters import NgramDrafter
from localspec.core.ngram import LENGTHS, MATCH_CAP, HistoryIndex, NgramIndex


def brute_force(tokens: list[int], k: int, n_min: int = 2) -> tuple[list[int], int]:
    """The index's answer by searching the whole history: the latest earlier occurrence of the longest suffix
    n-gram (n in LENGTHS), its match length measured back, and k tokens copied from after it (LZ77's overlap)."""
    m = len(tokens)
    for n in reversed(LENGTHS):
        if n < n_min or n >= m:
            continue
        starts = [i for i in range(m - n) if tokens[i : i + n] == tokens[m - n :]]
        if starts:
            follow = starts[-1] + n
            length = n
            while length < MATCH_CAP and follow - length > 0 and tokens[follow - length - 1] == tokens[m - length - 1]:
                length += 1
            seq = list(tokens)
            for j in range(k):
                seq.append(seq[follow + j])
            return seq[m:], length
    return [], 0


@pytest.mark.parametrize("seed", range(6))
def test_the_index_answers_as_a_search_of_the_whole_history_through_any_edits(seed):
    rng = random.Random(seed)
    index, history = NgramIndex(), []
    for _ in range(150):
        vocab = rng.choice([2, 3, 5, 40])  # small vocabularies repeat: long matches, overlapping copies
        if history and rng.random() < 0.15:  # a new generation that shares a prefix (a chat's next turn)
            history = history[: rng.randrange(len(history))] + [rng.randrange(vocab) for _ in range(rng.randrange(6))]
        else:
            history = history + [rng.randrange(vocab) for _ in range(rng.randrange(1, 5))]
        index.follow(history)
        assert index.tokens == history
        k = rng.randrange(1, 20)
        assert index.continuation(k) == brute_force(history, k)
    fresh = NgramIndex()
    fresh.follow(history)
    assert fresh.tables == index.tables  # undoing the forgotten tokens' writes left what a fresh index holds


def test_a_repeating_text_is_copied_as_far_as_k_asks():
    index = NgramIndex()
    index.follow([9, *([1, 2, 3] * 12)])
    copy, length = index.continuation(40)
    assert copy == ([1, 2, 3] * 14)[:40] and length == 33  # the match runs back to the start of the repeat


class Counting(NgramIndex):
    """An index that counts the tokens it appends and the writes it undoes."""

    appended = 0
    undone = 0

    def append(self, token: int) -> None:
        self.appended += 1
        super().append(token)

    def truncate(self, n_tokens: int) -> None:
        self.undone += max(len(self.tokens) - n_tokens, 0)
        super().truncate(n_tokens)


class Watched(list):
    """A history that records how many of its tokens each slice of it reads."""

    read: list[int]

    def __getitem__(self, key):
        out = super().__getitem__(key)
        if isinstance(key, slice):
            self.read.append(len(out))
        return out


def test_following_a_history_costs_only_its_new_tokens(monkeypatch):
    monkeypatch.setattr(ngram, "NgramIndex", Counting)
    rng = random.Random(0)
    follower = HistoryIndex()
    history = Watched(rng.randrange(500) for _ in range(20_000))
    history.read = []
    index = follower.follow(history)
    assert index.appended == 20_000
    for step in range(1, 6):  # a generation appends to its list: each step reads what was added, nothing else
        history += [rng.randrange(500) for _ in range(step)]
        history.read = []
        follower.follow(history)
        assert index.appended == 20_000 + step * (step + 1) // 2
        assert sum(history.read) == step  # no comparison of the history it already holds
    n = len(history)
    turn = history[:-3] + [7, 7, 7, 7]  # the next turn: a new list that differs in its last 3 tokens
    follower.follow(turn)
    assert index.undone == 3 and index.appended == n + 4  # 3 forgotten, 4 new
    assert index.tokens == turn


def test_the_drafter_follows_one_generation_and_the_next(monkeypatch):
    monkeypatch.setattr(ngram, "NgramIndex", Counting)
    import numpy as np

    from localspec.core.drafters import DraftRequest

    def ask(history: list[int]) -> list[int]:
        request = DraftRequest(history=history, k=4, sampling=GREEDY, pq=False, p_min=0.0, rng=np.random.default_rng())
        return drafter.propose(request).tokens

    drafter = NgramDrafter()
    history = [1, 2, 3, 4, 5, 1, 2]
    assert ask(history) == [3, 4, 5, 1]
    history += [3, 4]  # the step's emitted tokens, appended to the same list
    assert ask(history) == [5, 1, 2, 3]
    index = drafter.history.index
    assert index.appended == 9
    assert ask([1, 2, 3, 4, 5, 1, 2, 3, 9, 1, 2]) == [3, 9, 1, 2]  # the next generation: its own list
    assert index.undone == 1 and index.appended == 12


def test_a_hash_collision_is_never_a_match(monkeypatch):
    monkeypatch.setattr(NgramIndex, "_hash", lambda self, end, n: 0)  # every n-gram of a length collides
    rng = random.Random(1)
    index, history = NgramIndex(), []
    for _ in range(300):
        history.append(rng.randrange(4))
        index.follow(history)
        follow, length = index.match()
        if follow >= 0:  # whatever the table pointed at, a match is one: the tokens before it end the history too
            m = len(history)
            assert history[follow - length : follow] == history[m - length :] and follow < m
