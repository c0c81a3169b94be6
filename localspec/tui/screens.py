"""Modal screens: the pair switcher, the settings form, saved conversations, the search, and three small prompts.

Each screen returns its answer with `dismiss(...)` (a pair name, new `ChatSettings`, an action on a
conversation, some text, yes/no, an image's path); the app decides what to do with it. The history screen acts on the
store directly for rename and delete, which are instant, and hands resume and export back to the app.
"""

from __future__ import annotations

import os
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import Button, DataTable, Input, Label, OptionList, Select, Static, TextArea
from textual.widgets.option_list import Option

from localspec.core.params import VERIFY_MODES
from localspec.core.thinking_support import ThinkingSupport
from localspec.errors import LocalspecError

from .attachments import IMAGE_SUFFIXES
from .export import export_conversation, export_folder
from .loading import PairRow
from .safe_text import plain, terminal_safe
from .search import MARK, SearchHit, search
from .settings import DRAFTERS, FORM_FIELDS, ChatSettings
from .store import ChatStore


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question."""

    BINDINGS = [Binding("escape,n", "answer(False)", "No"), Binding("y", "answer(True)", "Yes")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(terminal_safe(self.question), markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Yes (y)", id="yes", variant="primary")
                yield Button("No (n)", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        """Close with the answer."""
        self.dismiss(yes)


class TextPromptScreen(ModalScreen[str | None]):
    """Ask for a line (rename) or several (system prompt). Ctrl+S or Enter (one line) saves, Esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, title: str, value: str = "", *, multiline: bool = False, cursor_blink: bool = True) -> None:
        super().__init__()
        self.title_text, self.multiline, self.cursor_blink = title, multiline, cursor_blink
        self.value = terminal_safe(value)  # a saved title or message: Input and TextArea draw controls as they are

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(terminal_safe(self.title_text), markup=False)
            if self.multiline:
                area = TextArea(self.value, id="value", soft_wrap=True)
                area.cursor_blink = self.cursor_blink
                yield area
                yield Static("Ctrl+S saves · Esc cancels", classes="hint")
            else:
                yield Input(self.value, id="value")
                yield Static("Enter saves · Esc cancels", classes="hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_save(self) -> None:
        """Close with the text."""
        widget = self.query_one("#value")
        self.dismiss(widget.text if isinstance(widget, TextArea) else widget.value)

    def action_cancel(self) -> None:
        """Close without a change."""
        self.dismiss(None)


class PathSuggester(Suggester):
    """Completes a path from the file system as it is typed: the first folder or image file whose name continues what
    was typed (folders end with "/"); → or Tab takes it."""

    def __init__(self) -> None:
        super().__init__(use_cache=False, case_sensitive=True)

    async def get_suggestion(self, value: str) -> str | None:
        if not value:
            return None
        folder, _, start = value.rpartition("/")
        where = Path(os.path.expanduser(folder)) if folder else Path("/" if value.startswith("/") else ".")
        try:
            entries = sorted(os.scandir(where), key=lambda e: e.name)
        except OSError:
            return None
        for entry in entries:
            hidden = entry.name.startswith(".") and not start.startswith(".")  # dotfiles once a "." is typed
            if hidden or not entry.name.startswith(start) or entry.name == start:
                continue
            try:
                is_dir = entry.is_dir()
            except OSError:
                continue
            if is_dir or Path(entry.name).suffix.lower() in IMAGE_SUFFIXES:
                return value + entry.name[len(start) :] + ("/" if is_dir else "")
        return None


class ImagePathScreen(ModalScreen[str | None]):
    """Ask for an image file's path, completed from the file system as it is typed. Enter attaches, Esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("tab", "complete", "Complete", show=False)]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Attach an image (PNG, JPEG, GIF or BMP): its path", markup=False)
            yield Input(placeholder="~/Pictures/cat.png", id="value", suggester=PathSuggester())
            yield Static(
                "→ or Tab completes · Enter attaches · Esc cancels · Ctrl+L in the chat: the clipboard's image",
                classes="hint",
            )

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_complete(self) -> None:
        """Take the completion shown (as → at the end of the line does)."""
        field = self.query_one("#value", Input)
        field.cursor_position = len(field.value)
        field.action_cursor_right()

    def action_cancel(self) -> None:
        """Close without an image."""
        self.dismiss(None)


class PairScreen(ModalScreen[str | None]):
    """The pairs of the merged models.toml; Enter picks one (the app loads it, or offers to pull it). Under them,
    where the loaded pair went (its placement plan: GPU layers, experts, context)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Close")]

    def __init__(self, rows: list[PairRow], current: str | None, placement: str = "") -> None:
        super().__init__()
        self.rows, self.current, self.placement = rows, current, placement

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("Pairs (Enter switches · Esc closes)")
            yield DataTable(id="pairs", cursor_type="row", zebra_stripes=True)
            if self.placement:
                yield Label(terminal_safe(f"{self.current} placement: {self.placement}"), id="placement", markup=False)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("", "pair", "status", "description")
        for row in self.rows:
            mark = "●" if row.name == self.current else ("★" if row.default else "")
            table.add_row(mark, plain(row.name), plain(row.status), plain(row.description), key=row.name)
        names = [row.name for row in self.rows]
        if self.current in names:
            table.move_cursor(row=names.index(self.current))
        table.focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.dismiss(event.row_key.value)


class SettingsScreen(ModalScreen[ChatSettings | None]):
    """Sampling, speculation and drafter settings and this chat's thinking switch, applied from the next message.

    The switch is offered only for a model whose template has one; otherwise the row says what the model does.
    """

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("ctrl+s", "save", "Save")]
    FIELDS = FORM_FIELDS  # (name, label): the option table's form fields, and max tokens
    CHOICES = (
        ("verify", "verify", VERIFY_MODES),
        ("adaptive", "adaptive draft length", ("on", "off")),
        ("drafter", "drafter", DRAFTERS),
    )

    def __init__(
        self,
        settings: ChatSettings,
        *,
        cursor_blink: bool = True,
        thinking: ThinkingSupport | None = None,
        default_think: bool | None = None,
    ) -> None:
        super().__init__()
        self.settings, self.cursor_blink = settings, cursor_blink
        self.thinking, self.default_think = thinking, default_think

    def compose(self) -> ComposeResult:
        values = self.settings.form_values()
        with Vertical(classes="dialog"):
            yield Label("Settings (applied from the next message)")
            with Grid(id="form"):
                for name, label in self.FIELDS:
                    yield Label(label)
                    field = Input(values[name], id=name, compact=True)
                    field.cursor_blink = self.cursor_blink  # a blinking cursor makes snapshots flaky
                    yield field
                for name, label, options in self.CHOICES:
                    yield Label(label)
                    yield Select(
                        [(o, o) for o in options], value=values[name], allow_blank=False, id=name, compact=True
                    )
                yield Label("thinking")
                yield self._thinking_field(values["think"])
            yield Static("", id="error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Save (Ctrl+S)", id="save", variant="primary")
                yield Button("Cancel (Esc)", id="cancel")

    def _thinking_field(self, value: str):
        """A switch for a model whose template has one; otherwise a line saying what the model does."""
        if self.thinking is None or not self.thinking.can_switch:
            what = self.thinking.describe() if self.thinking is not None else "no model loaded"
            return Static(terminal_safe(what), id="think-note", classes="hint", markup=False)
        default = {None: "the model's", True: "on", False: "off"}[self.default_think]
        options = [(f"default ({default})", "default"), ("on", "on"), ("off", "off")]
        return Select(options, value=value, allow_blank=False, id="think", compact=True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.dismiss(None)

    def on_input_submitted(self) -> None:
        self.action_save()

    def action_save(self) -> None:
        """Validate the form; close with the new settings or show the one-line error."""
        values = {name: self.query_one(f"#{name}", Input).value for name, _ in self.FIELDS}
        for name, _, _ in self.CHOICES:
            values[name] = str(self.query_one(f"#{name}", Select).value)
        if self.query("#think"):
            values["think"] = str(self.query_one("#think", Select).value)
        try:
            settings = self.settings.with_values(values)
        except LocalspecError as e:
            self.query_one("#error", Static).update(terminal_safe(str(e)))
            return
        self.dismiss(settings)


class HistoryScreen(ModalScreen[tuple[str, int] | None]):
    """Saved conversations: Enter resumes, r renames, d deletes, m / j export to Markdown / JSON.

    Closes with ("resume", id), or ("deleted", id) when the open conversation was deleted.
    """

    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
        Binding("m", "export('md')", "Export .md"),
        Binding("j", "export('json')", "Export .json"),
    ]

    def __init__(self, store: ChatStore, current: int | None, export_dir: Path | None) -> None:
        super().__init__()
        self.store, self.current, self.export_dir = store, current, export_dir  # None: resolved at each export

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("Saved chats (Enter resumes · r rename · d delete · m/j export .md/.json · Esc closes)")
            yield DataTable(id="chats", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("", "title", "pair", "messages", "updated")
        self.reload()
        table.focus()

    def reload(self) -> None:
        """Refill the table from the database."""
        table = self.query_one(DataTable)
        table.clear()
        conversations = self.store.conversations()
        for c in conversations:
            table.add_row(
                "●" if c.id == self.current else "",
                plain(c.title),  # a DataTable parses a str cell as markup
                plain(c.pair),
                str(c.n_messages),
                c.updated[:16].replace("T", " "),
                key=str(c.id),
            )
        ids = [c.id for c in conversations]
        if self.current in ids:
            table.move_cursor(row=ids.index(self.current))

    def _selected(self) -> int | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
        return int(key.value)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.dismiss(("resume", int(event.row_key.value)))

    def action_rename(self) -> None:
        """Ask for a new title."""
        cid = self._selected()
        if cid is None:
            return

        def done(title: str | None) -> None:
            if title and title.strip():
                self._guarded(self.store.rename, cid, title.strip())
                self.reload()

        if saved := self._guarded(self.store.get, cid):  # deleted in another window since the list was read
            self.app.push_screen(TextPromptScreen("New title", saved.title), done)
        else:
            self.reload()

    def action_delete(self) -> None:
        """Delete the selected conversation after a confirmation."""
        cid = self._selected()
        if cid is None:
            return

        def done(yes: bool | None) -> None:
            if yes and self._guarded(self.store.delete, cid):
                self.reload()
                if cid == self.current:
                    self.dismiss(("deleted", cid))

        if saved := self._guarded(self.store.get, cid):
            self.app.push_screen(ConfirmScreen(f"Delete {terminal_safe(saved.title)!r}?"), done)
        else:
            self.reload()

    def action_export(self, fmt: str) -> None:
        """Write the selected conversation to the export folder."""
        cid = self._selected()
        if cid is not None:
            path = self._guarded(export_conversation, self.store, cid, fmt, export_folder(self.export_dir))
            if path:
                self.notify(f"exported to {path}")

    def _guarded(self, func, *args):
        """Run a store call; a failure becomes a notification."""
        try:
            return func(*args) or True
        except LocalspecError as e:
            self.notify(str(e), severity="error")
            return None


class SearchScreen(ModalScreen[tuple[int, int] | None]):
    """Search every saved chat as you type; Enter opens the highlighted hit, closing with (chat id, message id)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Close"), Binding("down", "hits", "Results", show=False)]

    def __init__(self, store: ChatStore) -> None:
        super().__init__()
        self.store = store
        self.hits: list[SearchHit] = []

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("Search every chat (Enter opens the chat there · ↓ the results · Esc closes)")
            yield Input(id="query", placeholder="words to find")
            yield Static("", id="found", classes="hint", markup=False)
            yield OptionList(id="hits")

    def on_input_changed(self, event: Input.Changed) -> None:
        hits = self.query_one(OptionList)
        hits.clear_options()
        try:
            self.hits = search(self.store, event.value)
        except LocalspecError as e:
            self.hits = []
            self.query_one("#found", Static).update(terminal_safe(str(e)))
            return
        hits.add_options([Option(_hit_text(hit), id=str(i)) for i, hit in enumerate(self.hits)])
        if self.hits:
            hits.highlighted = 0
        found = f"{len(self.hits)} message{'s' if len(self.hits) != 1 else ''}" if event.value.strip() else ""
        self.query_one("#found", Static).update(found if self.hits or not found else "no message has these words")

    def on_input_submitted(self) -> None:
        hits = self.query_one(OptionList)
        if hits.highlighted is not None and self.hits:
            self._open(hits.highlighted)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self._open(event.option_index)

    def action_hits(self) -> None:
        """Move to the results (↓ from the search box)."""
        if self.hits:
            self.query_one(OptionList).focus()

    def _open(self, index: int) -> None:
        hit = self.hits[index]
        self.dismiss((hit.conversation_id, hit.message_id))


def _hit_text(hit: SearchHit) -> Text:
    """Two lines: the chat's title, who wrote the message and when; the words around the match, the match marked."""
    text = Text()
    text.append(terminal_safe(hit.title), "bold")
    text.append(f"  {'you' if hit.role == 'user' else 'assistant'} · {hit.created[:16].replace('T', ' ')}\n", "dim")
    words = " ".join(hit.snippet.split())
    for i, part in enumerate(words.replace(MARK[1], MARK[0]).split(MARK[0])):  # the marks are controls: cut first
        text.append(terminal_safe(part), "reverse" if i % 2 else "")
    return text
