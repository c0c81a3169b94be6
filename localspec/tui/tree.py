"""A saved chat's messages as a tree, from each message's parent alone (the store's `parent_id` column): the
siblings a regenerate or an edit made, the branch through a message, the path from the first message to a leaf.
Pure functions over `{message: parent}`; the store (store.py) reads the parents and writes the leaf."""

from __future__ import annotations

Parents = dict[int, int | None]  # each message's parent (None: one of the conversation's first messages)


def children(parents: Parents) -> dict[int | None, list[int]]:
    """The messages that follow each one, oldest first (None: the conversation's first messages)."""
    out: dict[int | None, list[int]] = {}
    for message, parent in parents.items():
        out.setdefault(parent, []).append(message)
    return out


def places(parents: Parents) -> dict[int, tuple[int, int]]:
    """Every message's place among its siblings (1-based) and how many they are."""
    return {m: (i + 1, len(group)) for group in children(parents).values() for i, m in enumerate(group)}


def newest_below(parents: Parents, message: int) -> int:
    """The newest message of the branches through `message` (itself, when none follows it)."""
    below, newest, following = [message], message, children(parents)
    while below:
        newest = max(newest, *below)
        below = [child for m in below for child in following.get(m, ())]
    return newest


def sibling(parents: Parents, message: int, step: int) -> int | None:
    """The sibling `step` places after `message` (before, when negative); None when there is none that way."""
    if message not in parents:
        return None
    siblings = [m for m, p in parents.items() if p == parents[message]]
    place = siblings.index(message) + step
    return siblings[place] if 0 <= place < len(siblings) else None


def path(parents: Parents, leaf: int | None) -> list[int]:
    """The ids from the first message to `leaf`."""
    out: list[int] = []
    while leaf is not None and leaf in parents and leaf not in out:
        out.append(leaf)
        leaf = parents[leaf]
    return out[::-1]
