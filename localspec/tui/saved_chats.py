"""The chat screen's part that opens saved chats again: the chats list (F4), the search (Ctrl+F), and `resume`.

The chats list resumes, deletes, renames or exports a saved conversation; a search hit opens its chat on the hit's
branch, scrolled to it. `SavedChats` is a base class of `ChatScreen`, which keeps the bindings and what is declared
below for the type checker: its conversation, options and the helpers these actions draw with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.screen import Screen

from localspec.errors import LocalspecError

from .safe_text import terminal_safe
from .screens import HistoryScreen, SearchScreen

if TYPE_CHECKING:
    from .conversation import Conversation
    from .message_list import MessageList
    from .settings import ChatOptions
    from .store import StoredMessage


class SavedChats(Screen):
    """Saved chats opened on the chat screen (`ChatScreen` is one)."""

    if TYPE_CHECKING:
        chat: Conversation
        options: ChatOptions

        @property
        def _messages(self) -> MessageList: ...
        def busy(self, what: str) -> bool: ...
        def error(self, message: str) -> None: ...
        def set_status(self, text: str) -> None: ...
        def draw_stats(self) -> None: ...
        async def show_conversation(self, stored: list[StoredMessage] | None = None, start: int = 0) -> None: ...
        async def action_new_chat(self) -> None: ...

    def action_history(self) -> None:
        """Open the saved conversations."""
        self.app.push_screen(
            HistoryScreen(self.chat.store, self.chat.saved_id, self.options.export_dir), self._history_closed
        )

    async def _history_closed(self, result: tuple[str, int] | None) -> None:
        if result is None:
            return
        what, cid = result
        if what == "deleted":
            self.chat.forget(cid)
            await self.action_new_chat()
        elif what == "resume":
            await self.resume(cid)

    async def resume(self, cid: int, at: int | None = None) -> None:
        """Open saved chat `cid` (what the chats list's resume does), scrolled to message `at` when given (a search
        hit, on its branch); refused while an answer or load runs."""
        if self.busy("open another chat"):
            return
        try:
            conversation, stored = self.chat.open(cid, at)
        except LocalspecError as e:
            self.error(str(e))
            return
        self.draw_stats()
        await self.show_conversation(stored)
        if at is not None:
            self._messages.reveal(at)
        here = self.chat.loaded.pair.name if self.chat.loaded else None
        if conversation.pair and here and conversation.pair != here:
            self.notify(f"this chat was with {conversation.pair}; it continues with {here} (F2 switches)")
        self.set_status(f"resumed {terminal_safe(conversation.title)!r}")  # as the chats list shows it

    def action_search(self) -> None:
        """Search every saved chat (Ctrl+F); Enter on a hit opens its chat there."""
        self.app.push_screen(SearchScreen(self.chat.store), self._search_closed)

    async def _search_closed(self, hit: tuple[int, int] | None) -> None:
        if hit is not None:
            await self.resume(*hit)
