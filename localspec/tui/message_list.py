"""The message list: one `ChatMessage` per message of the branch on screen, the system prompt first.

The screen's handlers hand it what the `Conversation` holds — saved messages (with provenance, stats and their
place among their siblings) or, before the first save, the dialogue — and it draws them: all of them when a chat
opens, only those from the branch point on when an edit, an answer generated again or a branch switch changes the
end of the conversation. It never runs per token: the answer being streamed is its last widget, fed by the screen.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.containers import VerticalScroll

from localspec.core.session import Message

from .attachments import Attachment
from .store import StoredMessage
from .widgets import ChatMessage, answer_caption


def _thinking_tokens(stats: dict | None) -> int | None:
    """A saved answer's thinking tokens, from its stats (None when it did not think or was saved without them)."""
    parts = (stats or {}).get("parts") or {}
    tokens = (parts.get("thinking") or {}).get("tokens")
    return tokens if isinstance(tokens, int) else None


def saved_widget(m: StoredMessage, expanded: bool, images: Sequence[Attachment] = ()) -> ChatMessage:
    """A saved message's widget (an answer with its caption, provenance and thinking; a tool's result; a user
    message with its `images`, read back from the store)."""
    if m.role == "tool":
        call = (m.tool_calls or [{}])[0]
        caption = f"{call.get('name', '?')} {call.get('arguments', '')} · {call.get('status', '?')}"
        return ChatMessage("tool", m.content, caption=caption)
    calls = "\n".join(f"→ {c['name']} {c['arguments']}" for c in m.tool_calls or [])  # an answer that only called
    return ChatMessage(
        m.role,
        m.content or calls,
        m.provenance if m.content else None,
        caption=answer_caption(m.stats, m.finish_reason) if m.role == "assistant" else "",
        reasoning_runs=m.reasoning_provenance or ([(m.reasoning, False)] if m.reasoning else []),
        thinking_tokens=_thinking_tokens(m.stats),
        thinking_expanded=expanded,
        message_id=m.id,
        branch=m.branch,
        images=images,
    )


def shown_widget(m: Message, message_id: int | None, expanded: bool, images: Sequence[Attachment] = ()) -> ChatMessage:
    """A message of the dialogue that has no saved copy to draw from (no provenance, no stats), with its `images`."""
    reasoning = [(m.reasoning, False)] if m.reasoning else []
    if m.role == "tool":
        return ChatMessage("tool", m.content)
    text = m.content or "\n".join(f"→ {c['function']['name']} {c['function']['arguments']}" for c in m.tool_calls)
    return ChatMessage(
        m.role, text, reasoning_runs=reasoning, thinking_expanded=expanded, message_id=message_id, images=images
    )


class MessageList(VerticalScroll):
    """The messages on screen (anchored to the bottom while an answer streams)."""

    @property
    def dialogue(self) -> list[ChatMessage]:
        """The widgets of the dialogue, in order (the system prompt's left out)."""
        return [w for w in self.query_children(ChatMessage) if w.role != "system"]

    async def show(self, system: str, widgets: Sequence[ChatMessage], start: int = 0) -> None:
        """Draw the dialogue's widgets from `start` on (those before it stay); the whole list when `start` is 0.

        Args:
            system: the system prompt (drawn first; only when the whole list is drawn).
            widgets: the dialogue's messages from `start` on.
        """
        if start == 0:
            await self.remove_children()
            widgets = [ChatMessage("system", system), *widgets] if system else list(widgets)
        else:
            await self.cut(start)
        if widgets:
            await self.mount_all(widgets)

    async def cut(self, start: int) -> None:
        """Remove the dialogue's widgets from `start` on."""
        await self.remove_children(self.dialogue[start:])

    def show_branches(self, places: dict[int, tuple[int, int]]) -> None:
        """Each saved message's place among its siblings (the caption's `2/3`), redrawn where it changed."""
        for widget in self.dialogue:
            if widget.message_id is not None:
                widget.set_branch(places.get(widget.message_id, (1, 1)))

    def find(self, message_id: int) -> ChatMessage | None:
        """The widget of saved message `message_id`, if it is on screen."""
        return next((w for w in self.dialogue if w.message_id == message_id), None)

    def reveal(self, message_id: int) -> None:
        """Scroll to message `message_id` and select it (its keys apply: copy, edit, ←/→)."""
        widget = self.find(message_id)
        if widget is not None:
            self.release_anchor()
            widget.focus(scroll_visible=False)
            self.call_after_refresh(self.scroll_to_widget, widget, animate=False, top=True)
