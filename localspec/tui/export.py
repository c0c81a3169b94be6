"""A saved conversation written out: Markdown (the branch on screen, to read) or JSON (the whole tree, to keep).

Both read only what the chat database holds. The JSON export has every message of every branch with its `id` and
`parent_id`, and `branch`: the ids of the branch on screen, in order. An answer's tool calls come with it, each with
its result (Markdown: a section per call). A message's images are written as files into a folder beside the export
(`chat-ID-TITLE-images/`, each named by its content hash), which the Markdown shows (`![name](…)`) and the JSON lists
(`images`: name, file, format, size, hash).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from localspec.errors import HistoryError

from .store import ChatStore, SavedConversation, StoredMessage

log = logging.getLogger(__name__)


def export_markdown(
    conversation: SavedConversation, messages: Sequence[StoredMessage], files: Mapping[str, str] | None = None
) -> str:
    """The conversation as a Markdown document: a title, the system prompt, then each message (its images first,
    linked to `files`: each image's file by its id, relative to the document)."""
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
        for image in message.images:
            lines += [f"![{_label(image.name)}]({(files or {}).get(image.id, image.id)})", ""]
        lines += [message.content, ""]
        for call in message.tool_calls or []:  # each call the answer made, and what came back
            lines += [f"### Tool call: {call.get('name')} {call.get('arguments')} ({call.get('status')})", ""]
            lines += ["```text", *str(call.get("result", "")).splitlines(), "```", ""]
    return "\n".join(lines)


def export_json(
    conversation: SavedConversation,
    messages: Sequence[StoredMessage],
    branch: Sequence[int] | None = None,
    images: Mapping[str, dict] | None = None,
) -> str:
    """The conversation as JSON: its fields, the system prompt, the messages (every branch) with their stats,
    parents and images (`images`: each one's file and facts by its id), and `branch`, the ids of the branch on
    screen (default: every message, in order)."""
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
                "images": [{"name": i.name, **(images or {}).get(i.id, {"id": i.id})} for i in m.images],
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
    messages = branch if fmt == "md" else store.tree(conversation_id)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", conversation.title).strip("-").lower()[:40] or "untitled"
    path = Path(directory) / f"chat-{conversation.id}-{slug}.{fmt}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        images = _write_images(store, messages, path.with_name(f"{path.stem}-images"))
        if fmt == "md":
            text = export_markdown(conversation, branch, {k: v["file"] for k, v in images.items()})
        else:
            text = export_json(conversation, messages, [m.id for m in branch], images)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise HistoryError(f"cannot write {path}: {e.strerror or e}") from e
    return path


def _write_images(store: ChatStore, messages: Sequence[StoredMessage], folder: Path) -> dict[str, dict]:
    """Write the messages' images into `folder` (made only when there is one), each once, named by its hash;
    returns each one's facts by its id, with `file` relative to the export. An image that can no longer be read
    is left out (the store logs it)."""
    written: dict[str, dict] = {}
    for message in messages:
        for saved in message.images:
            if saved.id in written:
                continue
            image = store.image(saved)
            if image is None:
                continue
            folder.mkdir(exist_ok=True)
            name = f"{image.id[:16]}.{image.format}"
            (folder / name).write_bytes(image.data)
            written[saved.id] = {
                "id": image.id,
                "file": f"{folder.name}/{name}",
                "format": image.format,
                "width": image.width,
                "height": image.height,
                "bytes": len(image.data),
            }
    return written


def _label(name: str) -> str:
    """A file name as a Markdown image's alt text: brackets and line breaks would end it."""
    return re.sub(r"[\[\]\n\r]", "_", name)
