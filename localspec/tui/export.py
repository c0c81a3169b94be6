"""A saved conversation written out: Markdown (the branch on screen, to read) or JSON (the whole tree, to keep).

Both read only what the chat database holds. The JSON export has every message of every branch with its `id` and
`parent_id`, and `branch`: the ids of the branch on screen, in order. An answer's tool calls come with it, each with
its result (Markdown: a section per call).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path

from localspec.errors import HistoryError

from .store import ChatStore, SavedConversation, StoredMessage

log = logging.getLogger(__name__)


def export_markdown(conversation: SavedConversation, messages: Sequence[StoredMessage]) -> str:
    """The conversation as a Markdown document: a title, the system prompt, then each message."""
    lines = [f"# {conversation.title}", "", f"*{conversation.created} · pair: {conversation.pair or '?'}*", ""]
    if conversation.system:
        lines += ["## System", "", conversation.system, ""]
    for message in messages:
        heading = "You" if message.role == "user" else "Assistant"
        if message.role == "assistant" and message.finish_reason == "cancelled":
            heading += " (stopped)"
        elif message.role == "assistant" and message.finish_reason == "interrupted":
            heading += " (cut short: the chat ended while writing it)"
        if message.branch[1] > 1:  # an edited message or an answer generated again: which of them this is
            heading += f" (branch {message.branch[0]}/{message.branch[1]})"
        lines += [f"## {heading}", ""]
        if message.reasoning:  # the thinking, labelled and quoted, before the answer it led to
            lines += ["> **Thinking**", ">", *[f"> {line}".rstrip() for line in message.reasoning.splitlines()], ""]
        lines += [message.content, ""]
        for call in message.tool_calls or []:  # each call the answer made, and what came back
            lines += [f"### Tool call: {call.get('name')} {call.get('arguments')} ({call.get('status')})", ""]
            lines += ["```text", *str(call.get("result", "")).splitlines(), "```", ""]
    return "\n".join(lines)


def export_json(
    conversation: SavedConversation, messages: Sequence[StoredMessage], branch: Sequence[int] | None = None
) -> str:
    """The conversation as JSON: its fields, the system prompt, the messages (every branch) with their stats and
    parents, and `branch`, the ids of the branch on screen (default: every message, in order)."""
    data = {
        "id": conversation.id,
        "title": conversation.title,
        "pair": conversation.pair,
        "created": conversation.created,
        "updated": conversation.updated,
        "system": conversation.system,
        "branch": [m.id for m in messages] if branch is None else list(branch),
        "messages": [
            {
                "id": m.id,
                "parent_id": m.parent_id,
                "role": m.role,
                "content": m.content,
                "reasoning": m.reasoning,
                "created": m.created,
                "finish_reason": m.finish_reason,
                "stats": m.stats,
                "tool_calls": m.tool_calls,  # [{id, name, arguments, status, result}] or null
            }
            for m in messages
        ],
    }
    return json.dumps(data, ensure_ascii=False, indent=2) + "\n"


def export_folder(configured: Path | None) -> Path:
    """Where exports go: the configured folder, else the working folder, else (it was deleted) the home folder."""
    if configured is not None:
        return Path(configured)
    try:
        return Path.cwd()
    except OSError:
        log.warning("the working folder is gone: exporting to the home folder")
        return Path.home()


def export_conversation(store: ChatStore, conversation_id: int, fmt: str, directory: Path) -> Path:
    """Write a conversation to `directory` as `chat-ID-TITLE.md` or `.json`; returns the file.

    Raises:
        HistoryError: unknown conversation or format, or the file cannot be written.
    """
    if fmt not in ("md", "json"):
        raise HistoryError(f"unknown export format {fmt!r}: use md or json")
    conversation = store.get(conversation_id)
    branch = store.messages(conversation_id)
    if fmt == "md":
        text = export_markdown(conversation, branch)
    else:
        text = export_json(conversation, store.tree(conversation_id), [m.id for m in branch])
    slug = re.sub(r"[^A-Za-z0-9]+", "-", conversation.title).strip("-").lower()[:40] or "untitled"
    path = Path(directory) / f"chat-{conversation.id}-{slug}.{fmt}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise HistoryError(f"cannot write {path}: {e.strerror or e}") from e
    return path
