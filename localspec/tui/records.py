"""A saved conversation and a saved message as the chat reads them (`SavedConversation`, `StoredMessage`, its
`SavedImage`s), and a message's row in the chat database: its columns, and its JSON columns read forgivingly (an
unreadable one is a warning and None, never a lost chat). The store (store.py) runs the SQL."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

Provenance = list[tuple[str, bool]]
"""An answer's text as runs of (text, came from the draft)."""

COLUMNS = (
    "id, role, content, created, finish_reason, stats, provenance, reasoning, reasoning_provenance, parent_id,"
    " tool_calls, images"
)


@dataclass(frozen=True, slots=True)
class SavedConversation:
    """One saved conversation (without its messages)."""

    id: int
    title: str
    pair: str
    system: str
    created: str
    updated: str
    n_messages: int = 0
    think: bool | None = None  # the chat's thinking switch (None: the pair's default)


@dataclass(frozen=True, slots=True)
class SavedImage:
    """One image of a saved message: its content hash (the `images` row that holds its bytes) and the file name it
    was attached as (a name from outside: drawn through `terminal_safe`)."""

    id: str
    name: str


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One saved message."""

    id: int
    role: str
    content: str
    created: str
    finish_reason: str | None = None
    stats: dict | None = None
    provenance: Provenance | None = None
    reasoning: str = ""  # an answer's thinking, apart from its content
    reasoning_provenance: Provenance | None = None
    parent_id: int | None = None  # the message it follows (None: the conversation's first)
    branch: tuple[int, int] = (1, 1)  # its place among the messages that follow the same one (1-based), and how many
    tool_calls: list[dict] | None = None  # an answer's tool calls and their results (tool_calls.py: `SavedCall`)
    images: tuple[SavedImage, ...] = ()  # a message's images, in order (their bytes: `ChatStore.image`)


def stored(r: tuple) -> StoredMessage:
    """A `StoredMessage` from a row of `COLUMNS` (its `branch` is the store's to set)."""
    return StoredMessage(
        id=r[0],
        role=r[1],
        content=r[2],
        created=r[3],
        finish_reason=r[4],
        stats=loads(r[5]),
        provenance=_provenance(loads(r[6])),
        reasoning=r[7],
        reasoning_provenance=_provenance(loads(r[8])),
        parent_id=r[9],
        tool_calls=loads(r[10]),
        images=saved_images(loads(r[11])),
    )


def json_or_none(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def loads(text: str | None):
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        log.warning("ignoring an unreadable JSON column in the chat database")
        return None


def saved_images(value) -> tuple[SavedImage, ...]:
    """The `images` column's [{id, name}] (an entry that is not one is left out, with a warning)."""
    if not isinstance(value, list):
        return ()
    images = tuple(
        SavedImage(item["id"], str(item.get("name", "")))
        for item in value
        if isinstance(item, dict) and isinstance(item.get("id"), str)
    )
    if len(images) != len(value):
        log.warning("ignoring %d unreadable image entries in the chat database", len(value) - len(images))
    return images


def _provenance(value) -> Provenance | None:
    if not isinstance(value, list):
        return None
    return [(str(text), bool(from_draft)) for text, from_draft in value]
