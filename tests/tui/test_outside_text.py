"""Text from models, tools, MCP servers and saved chats is drawn as data (issue 55, items 2–4).

Control sequences never reach the terminal (the real chat in a pseudo-terminal, tests/support/terminal.py: a tool's
result and a saved chat reopened), nothing from outside is Textual markup (a real MCP server whose tool names,
errors and results hold brackets, tests/support/mcp_hostile_server.py), and the question before a tool call shows
the whole call, y counting only once its end was on screen (Pilot at 120×40).
"""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console
from support.mcp_hostile_server import ANSI_SHOWN, CLICK, NOT_FOUND
from support.tui import record_notifications, wait_ready, wait_until
from textual.app import App
from textual.widgets import Static
from textual.widgets._toast import Toast

from localspec.tui.app import make_app
from localspec.tui.mcp_client import McpConfig, McpServer
from localspec.tui.safe_text import terminal_safe
from localspec.tui.screens import HistoryScreen, TextPromptScreen
from localspec.tui.store import ChatStore
from localspec.tui.tool_calls import Call
from localspec.tui.tool_flow import ToolApprovalScreen
from localspec.tui.widgets import ChatMessage, PromptInput

pytestmark = pytest.mark.anyio
HOSTILE = Path(__file__).parents[1] / "support" / "mcp_hostile_server.py"
SIZE = (120, 40)
TITLE, CLEAR, CLIPBOARD = b"\x1b]0;", b"\x1b[2J", b"\x1b]52;"
MARKS = "\x1b]0;PWNED\x07\x1b[2J"  # what the saved chat's every text carries


def screen_text(app) -> str:
    """The characters on the screen now (what a terminal would show)."""
    console = Console(width=app.size.width, height=app.size.height, file=io.StringIO(), record=True)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text(styles=False)


# --- the one function ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\x1b]0;title\x07b", "ab"),  # OSC to BEL: gone whole, no "]0;title" left behind
        ("a\x1b]52;c;cHduZWQ=\x1b\\b", "ab"),  # OSC to ST (the clipboard)
        ("x\x1b[2Jy\x1b[1;31mz\x1b[0m", "xyz"),  # CSI
        ("\x9b2J\x9d0;t\x9cq\x85", "q"),  # the C1 forms, and NEL
        ("line\n\tcell\r\nend\x00\x07\x08\x7f", "line\n\tcell\nend"),  # line feed and tab stay
        ("\x1b]0;never ended; rm -rf ~", "0;never ended; rm -rf ~"),  # unfinished: only its opening goes
        ("[b]é 中文 🙂[/b]", "[b]é 中文 🙂[/b]"),  # printable text, brackets and all, as it is
    ],
)
def test_terminal_safe(text, shown):
    assert terminal_safe(text) == shown


# --- item 2: no control sequence reaches the terminal ---------------------------------------------------------


@pytest.mark.slow
def test_a_tool_result_s_control_sequences_never_reach_the_terminal(chat_in_terminal, chat_home):
    (chat_home.config_dir / "mcp.toml").write_text(
        'tool_choice = "required"\nmax_rounds = 1\n'
        f'[servers.hostile]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(str(HOSTILE))}, "ansi"]\n'
    )
    chat = chat_in_terminal("--max-tokens", "96")
    chat.wait_for("ready ·".encode(), "the models")
    chat.wait_for(b"MCP tools", "the MCP tools")
    chat.type("go\r")
    chat.wait_for(b"y run it", "the question")
    mark = len(chat.output)
    chat.type("y")
    chat.wait_for_after(mark, b"plain words", "the tool's result")
    chat.wait_for_after(mark, b"ready", "the answer after the result")
    assert TITLE not in chat.output and CLIPBOARD not in chat.output
    assert CLEAR not in chat.output[mark:] and b"PWNED" not in chat.output


def save_marked_chat(store: ChatStore) -> int:
    """A saved chat whose every text carries MARKS: title, system prompt, message, tool call, thinking, answer."""
    call = {"id": "c1", "name": f"look{MARKS}", "arguments": "{}", "status": "ok", "result": f"found it{MARKS}"}
    cid, _, _ = store.save_copy(
        f"zebras{MARKS}",
        [
            {"role": "user", "content": f"Tell me{MARKS} about zebras"},
            {"role": "assistant", "content": "", "tool_calls": [call], "reasoning": f"hmm{MARKS}"},
            {"role": "assistant", "content": f"Stripes{MARKS}, **black** and white.", "finish_reason": "stop"},
        ],
        pair="tiny",
        system=f"be brief{MARKS}",
    )
    return cid


def frame(app) -> str:
    """What the app writes to the terminal for the whole screen now, control sequences and all."""
    console = Console(width=app.size.width, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    return app.screen._compositor.render_update(full=True, screen_stack=app._background_screens).render_segments(
        console
    )


@pytest.mark.slow
def test_a_saved_chat_s_control_sequences_never_reach_the_terminal_when_it_is_reopened(chat_in_terminal, chat_home):
    store = ChatStore(chat_home.db_path)
    save_marked_chat(store)
    store.close()
    chat = chat_in_terminal()
    chat.wait_for("ready ·".encode(), "the models")  # a chat opens only once they are loaded
    chat.type("\x1bOS")  # F4: the saved chats (the title is in the list)
    chat.wait_for(b"zebras", "the saved chat in the list")
    chat.type("\r")
    try:
        chat.wait_for(b"and white", "the chat reopened")
    finally:
        chat.wait_for(b"found it", "the tool's result")
    assert TITLE not in chat.output and CLEAR not in chat.output and b"PWNED" not in chat.output


@pytest.mark.slow
async def test_a_saved_chat_is_drawn_without_control_sequences_in_every_view_and_dialog(options, store):
    cid = save_marked_chat(store)
    app = make_app(options, store=store)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await app.chat_screen.resume(cid)
        await pilot.pause()
        assert "and white" in screen_text(app) and "PWNED" not in frame(app)
        for key in ("ctrl+t", "f8"):  # the draft-coloured text, the thinking unfolded
            await pilot.press(key)
            await pilot.pause()
            assert "PWNED" not in frame(app), key
        app.query_one(PromptInput).focus()
        await pilot.press("up")  # the earlier prompt, back in the prompt box
        await pilot.pause()
        assert app.query_one(PromptInput).text == "Tell me about zebras" and "PWNED" not in frame(app)
        app.query(ChatMessage).filter(".user").first().focus()
        await pilot.press("e")  # the edit dialog holds the message
        await wait_until(pilot, lambda: isinstance(app.screen, TextPromptScreen), what="the edit dialog")
        assert app.screen.query_one("#value").text == "Tell me about zebras" and "PWNED" not in frame(app)
        await pilot.press("escape", "f4")
        await wait_until(pilot, lambda: isinstance(app.screen, HistoryScreen), what="the saved chats")
        await pilot.pause()
        assert "zebras" in screen_text(app) and "PWNED" not in frame(app)
        await pilot.press("r")  # rename: the title in an Input
        await wait_until(pilot, lambda: isinstance(app.screen, TextPromptScreen), what="the rename dialog")
        assert "PWNED" not in frame(app)


# --- item 4: nothing from outside is markup ------------------------------------------------------------------------


def hostile(options, tool: str):
    server = McpServer("hostile", (sys.executable, str(HOSTILE), tool), timeout=60.0)
    mcp = McpConfig((server,), tool_choice="required", max_rounds=1, start_timeout=30.0)
    return dataclasses.replace(options, max_tokens=96, mcp=mcp)


def toasts(app) -> str:
    """The text of the toasts on screen."""
    return "\n".join(str(toast.render()) for toast in app.screen.query(Toast))


@pytest.mark.parametrize(
    ("tool", "literal"),
    [("x[/]y", "x[/]y"), ("notfound", NOT_FOUND), ("click", CLICK)],
    ids=["name", "error-path", "error-click"],
)
@pytest.mark.slow
async def test_brackets_from_a_server_are_shown_as_written_and_the_answer_goes_on(options, store, tool, literal):
    app = make_app(hostile(options, tool), store=store)
    seen = record_notifications(app)
    async with app.run_test(size=SIZE, notifications=True) as pilot:  # toasts drawn (run_test's default: not)
        await wait_ready(pilot)
        await wait_until(pilot, lambda: app.chat.mcp_tools, what="the MCP tools")
        await wait_until(pilot, lambda: tool in toasts(app), what="the tools' names")  # before: MarkupError at start
        app.query_one(PromptInput).text = "Go"
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, ToolApprovalScreen), what="the question")
        assert tool in screen_text(app)
        await pilot.press("y")
        await wait_until(pilot, lambda: app.chat.turn is None and app.chat.tool_round is None, what="the answer")
        await pilot.pause()
        assert [m.role for m in app.chat.dialogue] == ["user", "assistant", "tool", "assistant"]
        assert literal in toasts(app) or literal in screen_text(app)  # an error's toast, or the tool's caption
        assert any(literal in s for s in seen)
        shown = [w for w in app.query(ChatMessage) if w.role == "tool"][0]
        assert tool in str(shown.query_one(".caption", Static).render())


@pytest.mark.slow
async def test_a_tool_result_is_drawn_without_its_control_sequences(options, store):
    app = make_app(hostile(options, "ansi"), store=store)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await wait_until(pilot, lambda: app.chat.mcp_tools, what="the MCP tools")
        app.query_one(PromptInput).text = "Go"
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, ToolApprovalScreen), what="the question")
        await pilot.press("y")
        await wait_until(pilot, lambda: app.chat.turn is None and app.chat.tool_round is None, what="the answer")
        await pilot.pause()
        assert "\x1b" in app.chat.dialogue[2].content  # the model reads what came; the screen draws it safe
        shown = [w for w in app.query(ChatMessage) if w.role == "tool"][0]
        assert str(shown.query_one(".plain-body", Static).render()) == ANSI_SHOWN
        assert ANSI_SHOWN in screen_text(app)


# --- item 3: the question before a call shows all of it ------------------------------------------------------------

LONG = "echo " + "lorem ipsum " * 248 + "; rm -rf ~"  # some 3,000 characters, the end that matters last


class Asking(App):
    """A host for the question alone: `answer` is what it was dismissed with."""

    def __init__(self, arguments: dict) -> None:
        super().__init__()
        self.arguments, self.answer = arguments, None

    def on_mount(self) -> None:
        call = Call("c1", "shell", json.dumps(self.arguments))
        self.push_screen(ToolApprovalScreen(call, "files"), lambda what: setattr(self, "answer", what))


@pytest.mark.slow
async def test_a_long_call_is_shown_whole_and_y_counts_only_once_its_end_was_on_screen():
    app = Asking({"command": LONG})
    assert len(json.dumps(app.arguments)) > 3000
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        for key in ("y", "a"):
            await pilot.press(key)
            await pilot.pause()
            assert app.answer is None and isinstance(app.screen, ToolApprovalScreen)  # before: y ran it unseen
        assert "rm -rf ~" not in screen_text(app) and "↓ 9 more lines" in screen_text(app)
        await pilot.press("down", "down", "y")  # scrolled, not to the end
        await pilot.pause()
        assert app.answer is None and app.screen.query_one("#call").scroll_y == 2
        await pilot.press("end")
        await wait_until(pilot, lambda: app.screen.end_seen, what="the end of the call")
        assert "; rm -rf ~" in screen_text(app) and "y run it" in screen_text(app)
        await pilot.press("up", "up")  # scrolled back: the end was seen, y counts
        await pilot.press("y")
        await pilot.pause()
        assert app.answer == "yes"


@pytest.mark.parametrize(("key", "answer"), [("y", "yes"), ("n", "no"), ("escape", "stop")])
async def test_a_short_call_is_answered_at_once(key, answer):
    app = Asking({"path": "notes.txt"})
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert '"path": "notes.txt"' in screen_text(app)
        await pilot.press(key)
        await pilot.pause()
        assert app.answer == answer


async def test_n_and_esc_need_no_scrolling():
    for key, answer in (("n", "no"), ("escape", "stop")):
        app = Asking({"command": LONG})
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await pilot.press(key)
            await pilot.pause()
            assert app.answer == answer


# --- Textual's own notices (issue 63, Low) --------------------------------------------------------------------


@pytest.mark.slow
async def test_textual_s_quit_hint_is_drawn_as_its_markup_means_and_outside_text_stays_data(options):
    """Ctrl+C outside a text box shows Textual's hint, written in its markup: drawn bold, not as "[b]…[/b]"; the
    same brackets from outside (a screen's toast, as a file's name or a tool's error reaches it) stay as written."""
    app = make_app(options)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_ready(pilot)
        app.set_focus(None)  # the prompt box takes Ctrl+C to copy
        await pilot.press("ctrl+c")
        await wait_until(pilot, lambda: "to quit the app" in toasts(app), what="the quit hint")
        assert "Press ctrl+q to quit the app" in toasts(app) and "[b]" not in toasts(app)
        [hint] = [toast.render() for toast in app.screen.query(Toast)]
        assert any(str(span.style) == "b" for span in hint.spans)  # "ctrl+q" in bold
        outside = "Press [b]ctrl+q[/b] to go [@click=app.quit]now[/]"
        app.chat_screen.notify(outside)
        await wait_until(pilot, lambda: "to go" in toasts(app), what="the outside toast")
        assert outside in toasts(app) and app.is_running
