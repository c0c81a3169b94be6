"""Tools through MCP in the chat (issue 48, item 4): a real MCP server process over stdio (tests/support/mcp_server.py,
the official SDK's `MCPServer`), the real app in Textual's Pilot on the tiny pair, real llama.cpp and SQLite.

How the tiny model calls a tool for certain, honestly: its template (ChatML) cannot render tools, so the chat teaches
the generic syntax in the system message (core/tools.py, the server's), and with `tool_choice = "required"` the first
answer to each message is grammar-constrained to `{"tool_calls": [...]}`. The test server offers ONE tool without
parameters, and the chat allows one call per answer, so the grammar leaves exactly one way to write the call: every
token of it is forced, whatever the random tiny model's logits. With `max_rounds = 1` the answer after the result is
free text; the model "uses" the result in that it reads it: the tokens the target decoded for that answer contain it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from support.mcp_server import SECRET
from support.tui import record_notifications, send, wait_ready, wait_until

from localspec.tui.app import make_app
from localspec.tui.export import export_conversation
from localspec.tui.mcp_client import McpConfig, McpServer, load_mcp_config
from localspec.tui.store import ChatStore
from localspec.tui.tool_calls import DECLINED, STOPPED
from localspec.tui.tool_flow import ToolApprovalScreen
from localspec.tui.widgets import ChatMessage, PromptInput

pytestmark = pytest.mark.anyio
SERVER = Path(__file__).parents[1] / "support" / "mcp_server.py"


def mcp(*tools: str, timeout: float = 60.0, **settings) -> McpConfig:
    server = McpServer("test", (sys.executable, str(SERVER), *tools), timeout=timeout)
    return McpConfig((server,), tool_choice="required", max_rounds=1, start_timeout=30.0, **settings)


@pytest.fixture
def tool_options(options):
    return dataclasses.replace(options, max_tokens=64, mcp=mcp("secret"))


async def ready_with_tools(pilot) -> None:
    await wait_ready(pilot)
    await wait_until(pilot, lambda: pilot.app.chat.mcp_tools, what="the MCP tools")


async def ask(pilot, text: str) -> None:
    """Send `text` and wait for the question about the tool call."""
    pilot.app.query_one(PromptInput).text = text
    await pilot.press("enter")
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, ToolApprovalScreen), what="the tool question")


async def answered(pilot) -> None:
    """Wait until the answer, its tool round and the answer after it are over."""
    chat = pilot.app.chat
    await wait_until(pilot, lambda: chat.turn is None and chat.tool_round is None, what="the answer to end")
    await pilot.pause()


def decoded(app) -> str:
    """What the target's cache holds now: the last prompt and its answer."""
    engine = app.chat.loaded.engine
    return engine.target_model.detokenize(list(engine.target.tokens))


@pytest.mark.slow
async def test_yes_runs_the_call_and_the_answer_goes_on_with_its_result(tool_options, store, tmp_path):
    app = make_app(tool_options, store=store)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready_with_tools(pilot)
        await ask(pilot, "What is the secret word?")
        assert app.screen.call.name == "secret"
        await pilot.press("y")
        await answered(pilot)
        chat = app.chat
        assert [m.role for m in chat.dialogue] == ["user", "assistant", "tool", "assistant"]
        call = chat.dialogue[1].tool_calls[0]
        assert call["function"] == {"name": "secret", "arguments": "{}"}
        assert chat.dialogue[2].content == SECRET and chat.dialogue[2].tool_call_id == call["id"]
        assert SECRET in decoded(app)  # the answer after the call was generated reading its result
        shown = [w for w in app.query(ChatMessage) if w.role == "tool"]
        assert len(shown) == 1 and shown[0].text == SECRET and "ok" in shown[0].caption
        rows = store.messages(chat.saved_id)
        assert [m.role for m in rows] == ["user", "assistant", "assistant"]
        assert rows[1].tool_calls == [
            {"id": call["id"], "name": "secret", "arguments": "{}", "status": "ok", "result": SECRET}
        ]
        markdown = export_conversation(store, chat.saved_id, "md", tmp_path).read_text()
        assert "### Tool call: secret {} (ok)" in markdown and SECRET in markdown
        data = json.loads(export_conversation(store, chat.saved_id, "json", tmp_path).read_text())
        assert data["messages"][1]["tool_calls"][0]["result"] == SECRET
        saved_id = chat.saved_id

    store = ChatStore(store.path)  # the app closed it
    again = make_app(dataclasses.replace(tool_options, mcp=None), store=store)  # reopened, with no server this time
    async with again.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await again.chat_screen.resume(saved_id)
        assert [m.role for m in again.chat.dialogue] == ["user", "assistant", "tool", "assistant"]
        assert [w.text for w in again.query(ChatMessage) if w.role == "tool"] == [SECRET]
        await send(pilot, "And now?")  # a chat with tool messages goes on without tools
        assert again.chat.dialogue[-1].role == "assistant" and len(store.messages(saved_id)) == 5


@pytest.mark.slow
async def test_no_tells_the_model_it_was_declined(tool_options, store):
    app = make_app(tool_options, store=store)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready_with_tools(pilot)
        await ask(pilot, "What is the secret word?")
        await pilot.press("n")
        await answered(pilot)
        assert [m.role for m in app.chat.dialogue] == ["user", "assistant", "tool", "assistant"]
        assert app.chat.dialogue[2].content == DECLINED and DECLINED in decoded(app)
        assert SECRET not in decoded(app)
        assert store.messages(app.chat.saved_id)[1].tool_calls[0]["status"] == "declined"


@pytest.mark.slow
async def test_always_runs_that_tool_from_then_on_without_asking(tool_options, store):
    app = make_app(tool_options, store=store)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready_with_tools(pilot)
        await ask(pilot, "What is the secret word?")
        await pilot.press("a")
        await answered(pilot)
        asked = []
        push = app.push_screen
        app.push_screen = lambda screen, *a, **k: (asked.append(screen), push(screen, *a, **k))[1]
        app.query_one(PromptInput).text = "Again?"
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(app.chat.dialogue) == 8, timeout=60, what="the second round")
        await answered(pilot)
        assert not [s for s in asked if isinstance(s, ToolApprovalScreen)]
        assert [m.content for m in app.chat.dialogue if m.role == "tool"] == [SECRET, SECRET]


@pytest.mark.slow
async def test_esc_stops_the_answer_and_the_chat_goes_on(tool_options, store):
    app = make_app(tool_options, store=store)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready_with_tools(pilot)
        await ask(pilot, "What is the secret word?")
        await pilot.press("escape")
        await answered(pilot)
        assert [m.role for m in app.chat.dialogue] == ["user", "assistant", "tool"]  # no answer after a stop
        assert app.chat.dialogue[-1].content == STOPPED
        await ask(pilot, "Try again")  # the chat keeps working: the next message calls again
        await pilot.press("y")
        await answered(pilot)
        assert app.chat.dialogue[-2].content == SECRET


@pytest.mark.parametrize(
    ("tools", "settings", "line", "result"),
    [
        (("fail",), {}, "tool fail: ", "Error executing tool fail"),
        (("hang",), {"timeout": 1.0}, "did not answer in 1 s", "did not answer in 1 s"),
        (("big",), {"max_result_chars": 300}, None, "the tool returned 10,000,000 characters; the first 300"),
    ],
    ids=["error", "hang", "10 MB"],
)
@pytest.mark.slow
async def test_a_tool_that_fails_hangs_or_floods_is_one_line_and_the_answer_goes_on(
    options, store, tools, settings, line, result
):
    app = make_app(dataclasses.replace(options, max_tokens=64, mcp=mcp(*tools, **settings)), store=store)
    seen = record_notifications(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready_with_tools(pilot)
        await ask(pilot, "Go")
        await pilot.press("y")
        await answered(pilot)
        tool = app.chat.dialogue[2]
        assert tool.role == "tool" and result in tool.content
        assert app.chat.dialogue[-1].role == "assistant"  # the model read what came back and answered
        assert result in decoded(app)
        if line is not None:
            assert any(line in s for s in seen), seen
        assert store.messages(app.chat.saved_id)[1].tool_calls[0]["result"] == tool.content


@pytest.mark.parametrize("command", [("/nonexistent/mcp-server",), (sys.executable, str(SERVER), "--crash")])
@pytest.mark.slow
async def test_a_server_that_does_not_start_is_one_line_and_the_chat_works_without_it(options, store, command):
    config = McpConfig((McpServer("broken", command),), start_timeout=15.0)
    app = make_app(dataclasses.replace(options, mcp=config), store=store)
    seen = record_notifications(app)  # before it runs: the line may come before the first frame
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await wait_until(pilot, lambda: any("did not start" in s for s in seen), what="the error line")
        assert [s for s in seen if "did not start" in s][0].startswith("MCP server broken (")
        assert "Traceback" not in " ".join(seen)
        await send(pilot, "Hello")
        assert [m.role for m in app.chat.dialogue] == ["user", "assistant"] and not app.chat.mcp_tools


@pytest.mark.slow
async def test_a_result_too_long_for_the_context_is_cut_to_the_room_left_and_named(options, store):
    """8,000 characters of result (the default cut) are some 8,000 tokens of the tiny vocabulary: four times the
    2,048-token context. Not the user's message: the result is cut to the room left, and the line names it."""
    app = make_app(dataclasses.replace(options, max_tokens=64, mcp=mcp("big")), store=store)
    seen = record_notifications(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready_with_tools(pilot)
        await ask(pilot, "hello")
        await pilot.press("y")
        await answered(pilot)
        assert not [s for s in seen if "does not fit in the context" in s], seen  # the user's message is not blamed
        [line] = [s for s in seen if "the result of big" in s]
        assert "does not fit the 2,048-token context" in line and "\n" not in line
        assert [m.role for m in app.chat.dialogue] == ["user", "assistant", "tool", "assistant"]
        result = app.chat.dialogue[2].content
        assert result.startswith("xxxx") and "cut to fit the context: the result was 8,0" in result
        assert "cut to fit the context: the result was 8,0" in decoded(app)  # the model read it, its note at the end
        assert store.messages(app.chat.saved_id)[1].tool_calls[0]["result"] == result  # kept as the model read it


async def test_tools_too_long_for_the_context_are_named_and_the_message_is_answered_without_them(options, store):
    """A tool's description of 16,000 characters: the tools alone overflow the context, whatever the message."""
    app = make_app(dataclasses.replace(options, max_tokens=64, mcp=mcp("wide")), store=store)
    seen = record_notifications(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready_with_tools(pilot)
        await send(pilot, "hello")
        assert not [s for s in seen if "does not fit in the context" in s], seen
        [line] = [s for s in seen if "the MCP tools take" in s]
        assert "tokens of the 2,048-token context" in line and "without them" in line and "\n" not in line
        assert [(m.role, m.content) for m in app.chat.dialogue][0] == ("user", "hello")
        assert [m.role for m in app.chat.dialogue] == ["user", "assistant"]
        assert [m.role for m in store.messages(app.chat.saved_id)] == ["user", "assistant"]


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie has ended: only its exit status is left to collect)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def server_pid(pidfile: Path) -> int | None:
    text = pidfile.read_text().strip() if pidfile.exists() else ""
    return int(text) if text else None


@pytest.mark.slow
async def test_a_server_that_never_lists_its_tools_is_one_line_and_the_others_tools_are_kept(options, store, tmp_path):
    pidfile = tmp_path / "mute.pid"
    mute = McpServer("mute", (sys.executable, str(SERVER), "--no-listing", "--pidfile", str(pidfile), "secret"))
    good = McpServer("good", (sys.executable, str(SERVER), "secret"))
    config = McpConfig((mute, good), start_timeout=4.0)
    app = make_app(dataclasses.replace(options, mcp=config), store=store)
    seen = record_notifications(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await wait_until(pilot, lambda: app.chat.mcp_tools, timeout=30, what="the good server's tools")
        assert [(t.server, t.name) for t in app.chat.mcp_tools] == [("good", "secret")]
        [line] = [s for s in seen if "mute" in s]
        assert line.startswith("MCP server mute (") and "did not list its tools in 4 s: its tools are left out" in line
        assert "good" not in line and "\n" not in line
        await wait_until(pilot, lambda: not alive(server_pid(pidfile)), timeout=15, what="the mute server to end")


@pytest.mark.parametrize("start_timeout", [1.0, 60.0], ids=["timed out", "quit while it starts"])
@pytest.mark.slow
async def test_a_server_that_hangs_in_initialize_does_not_outlive_the_chat(options, store, tmp_path, start_timeout):
    pidfile = tmp_path / "silent.pid"
    command = (sys.executable, str(SERVER), "--silent", "--pidfile", str(pidfile))
    config = McpConfig((McpServer("silent", command),), start_timeout=start_timeout)
    app = make_app(dataclasses.replace(options, mcp=config), store=store)
    seen = record_notifications(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await wait_until(pilot, lambda: server_pid(pidfile), timeout=30, what="the server's process")
        pid = server_pid(pidfile)
        assert alive(pid)
        if start_timeout < 10:  # given up on: ended then, not at quit
            await wait_until(pilot, lambda: any("did not start in 1 s" in s for s in seen), what="the error line")
            await wait_until(pilot, lambda: not alive(pid), timeout=15, what="the server to end")
    assert not alive(pid)


def test_the_config_file_and_the_flags(tmp_path):
    path = tmp_path / "mcp.toml"
    path.write_text(
        'tool_choice = "required"\nmax_rounds = 2\n\n[servers.files]\ncommand = "npx"\nargs = ["-y", "fs", "/tmp"]\n'
        'env = { TOKEN = "x" }\ntimeout = 5\n\n[servers.web]\nurl = "http://127.0.0.1:9/mcp"\n'
    )
    config = load_mcp_config(path, ("uvx my-server --flag", "https://example.org/mcp"))
    assert [(s.name, s.command, s.url) for s in config.servers] == [
        ("files", ("npx", "-y", "fs", "/tmp"), ""),
        ("web", (), "http://127.0.0.1:9/mcp"),
        ("uvx", ("uvx", "my-server", "--flag"), ""),
        ("mcp2", (), "https://example.org/mcp"),
    ]
    assert config.servers[0].env == {"TOKEN": "x"} and config.servers[0].timeout == 5
    assert (config.tool_choice, config.max_rounds) == ("required", 2)
    assert load_mcp_config(tmp_path / "absent.toml").servers == ()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[servers", "mcp.toml"),
        ('[servers.x]\nurl = "http://a"\ncommand = ["b"]\n', "either `command`"),
        ("[servers.x]\ncommand = []\n", "list of strings"),
        ('tool_choice = "sometimes"\n', "tool_choice"),
        ("max_rounds = 0\n", "max_rounds"),
    ],
)
def test_a_bad_config_file_is_one_line(tmp_path, text, match):
    from localspec.errors import ConfigError

    path = tmp_path / "mcp.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as caught:
        load_mcp_config(path)
    assert "\n" not in str(caught.value)


def test_a_database_of_todays_main_opens_with_every_chat_intact_and_no_tool_calls(tmp_path):
    """The schema step of the tool calls on a database written by the store of the release before it (schema 5)."""
    from support import store_v5

    path = tmp_path / "chats.sqlite3"
    old = store_v5.ChatStore(path)
    first, _, ids = old.save_copy("Zebras", [{"role": "user", "content": "Tell me about zebras"}], system="brief")
    answer = old.add_message(first, "assistant", "Stripes.", finish_reason="stop", stats={"emitted": 2})
    old.add_message(first, "assistant", "Black and white.", parent_id=ids[0], finish_reason="stop")  # a branch
    old.set_leaf(first, answer)
    second = old.create_conversation("empty")
    rows = {t: old.db.execute(f"SELECT * FROM {t} ORDER BY id").fetchall() for t in ("conversations", "messages")}
    old.close()
    store = ChatStore(path)
    try:
        for table, before in rows.items():
            after = store.db.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
            assert [row[: len(before[0])] for row in after] == before
        chat = store.messages(first)
        assert [(m.content, m.tool_calls, m.branch) for m in chat] == [
            ("Tell me about zebras", None, (1, 1)),
            ("Stripes.", None, (1, 2)),
        ]
        assert store.get(second).n_messages == 0
    finally:
        store.close()
