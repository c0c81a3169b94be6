"""The chat's tool calls on screen: the question before each call, the call run off the UI thread, its result shown,
and the answer going on.

`ToolFlow` is an invisible widget of the chat screen. When an answer ends with tool calls (the `Conversation` found
them and holds a `ToolRound`), it asks about each call (`ToolApprovalScreen`: y runs it, n declines it — the model is
told —, a runs it and every later call of that tool without asking, Esc stops the answer), runs it in a thread worker
that waits on the MCP client's loop (`McpHub.call`) and posts `ToolDone`, shows the result as a "tool" message, and
when every call has its result starts the next turn, which answers with them. Widgets change only in handlers.
"""

from __future__ import annotations

import json
import logging

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Static

from .mcp_client import McpHub, McpTool, ToolOutcome
from .safe_text import terminal_safe
from .tool_calls import DECLINED, NO_RESULT, STOPPED, Call
from .widgets import ChatMessage

log = logging.getLogger(__name__)

SHOWN_RESULT = 2000  # characters of a result shown in the chat (the model gets up to `max_result_chars`)


class ToolApprovalScreen(ModalScreen[str]):
    """Run this tool call? "yes", "no", "always" (this tool, from now on) or "stop" (the answer).

    The whole call is shown, in a box that scrolls when it is longer than the window allows, and y (or a) counts only
    once the call's end has been on screen: a long call must not run with what it ends in (`…; rm -rf ~`) unseen.
    """

    BINDINGS = [
        Binding("y", "answer('yes')", "Run it"),
        Binding("n", "answer('no')", "Decline"),
        Binding("a", "answer('always')", "Always for this tool"),
        Binding("escape", "answer('stop')", "Stop the answer"),
    ]
    # The keys' line is docked, so the call's box gets what is left of the dialog and scrolls: a box of auto height
    # alone outgrew the dialog, which cut it and the keys off unseen.
    DEFAULT_CSS = """
    ToolApprovalScreen { align: center middle; }
    ToolApprovalScreen > Vertical { width: 80%; height: auto; max-height: 90%; border: thick $warning;
        background: $surface; padding: 1 2; }
    ToolApprovalScreen #call { height: auto; max-height: 100%; }
    ToolApprovalScreen #keys { dock: bottom; margin-top: 1; }
    ToolApprovalScreen.-short > Vertical { padding: 0 1; }
    """

    def __init__(self, call: Call, server: str) -> None:
        super().__init__()
        self.call, self.server = call, server
        self.end_seen = False  # the call's last line has been on screen: y and a count from then on

    def compose(self) -> ComposeResult:
        arguments = json.dumps(self.call.parsed_arguments(), ensure_ascii=False, indent=2)
        with Vertical():
            with VerticalScroll(id="call"):
                heading = f"The model calls the tool {self.call.name} of MCP server {self.server}:"
                yield Static(terminal_safe(heading), markup=False)
                yield Static(terminal_safe(arguments), markup=False, id="arguments")
            yield Static("", markup=False, id="keys")

    def on_mount(self) -> None:
        box = self.query_one("#call", VerticalScroll)
        self.watch(box, "scroll_y", self._check_end, init=False)
        box.focus()  # ↓, PgDn, End and the wheel scroll the call

    def on_resize(self) -> None:
        self.call_after_refresh(self._check_end)  # a call that fits (at this size) is seen whole

    def _check_end(self) -> None:
        box = self.query_one("#call", VerticalScroll)
        # in a window too small for the dialog the box overflows it, cut off: its end is then not on screen
        whole = box.size.height > 0 and box.region.bottom <= self.query_one(Vertical).content_region.bottom
        if whole and box.scroll_y >= box.max_scroll_y:
            self.end_seen = True
        if self.end_seen:
            keys = "y run it · n decline · a always run this tool · Esc stop the answer"
        elif not whole:
            keys = "a taller window shows the whole call · n decline · Esc stop the answer"
        else:
            below = box.max_scroll_y - round(box.scroll_y)
            keys = f"↓ {below} more lines (↓ PgDn End) · y once its end is shown · n decline · Esc stop the answer"
        self.query_one("#keys", Static).update(keys)

    def action_answer(self, what: str) -> None:
        if what in ("yes", "always") and not self.end_seen:
            self._check_end()  # laid out since the last check (a call that fits is seen whole at once)
        if what in ("yes", "always") and not self.end_seen:
            self.app.bell()
            return
        self.dismiss(what)


class ToolDone(Message):
    """A call came back from its MCP server (or was given up)."""

    def __init__(self, call: Call, outcome: ToolOutcome) -> None:
        super().__init__()
        self.call, self.outcome = call, outcome


def result_widget(call: Call, text: str, status: str) -> ChatMessage:
    """A call and its result, as the chat shows them (a long result shortened: the model reads more of it)."""
    shown = text if len(text) <= SHOWN_RESULT else f"{text[:SHOWN_RESULT]}\n[… {len(text):,} characters in all]"
    return ChatMessage("tool", shown, caption=f"{call.title()} · {status}")


def calls_text(calls: list[dict]) -> str:
    """An answer that only called tools, as the chat shows it."""
    return "\n".join(f"→ {c['name']} {c['arguments']}" for c in calls)


class ToolFlow(Widget):
    """Runs the tool calls of the answer that just ended, one by one, as the user allows."""

    DEFAULT_CSS = "ToolFlow { display: none; }"

    def __init__(self) -> None:
        super().__init__()
        self.always: set[str] = set()  # tools the user said to run without asking (for this run of the app)
        self._asking: ToolApprovalScreen | None = None

    @property
    def _hub(self) -> McpHub | None:
        return getattr(self.app, "mcp", None)

    async def after_answer(self, answer: ChatMessage | None) -> bool:
        """The screen saved an answer: run its calls, if it made any (True), and show what the model wrote of it."""
        chat = self.screen.chat
        if answer is not None and chat.dialogue and chat.dialogue[-1].role == "assistant":
            shown = chat.dialogue[-1]
            text = shown.content or calls_text([c["function"] for c in shown.tool_calls])
            if text != answer.text:  # the calls, or the generic syntax's answer without its JSON
                runs, thinking = [(text, False)], answer.reasoning_runs
                await answer.finish(text, runs, answer.caption, thinking, answer.thinking_tokens)
        tool_round = chat.tool_round
        if tool_round is None:
            return False
        tool_round.on_cancel.append(self._cancelled)
        await self._next()
        return True

    def _cancelled(self) -> None:
        if self._asking is not None:
            self._asking.dismiss("stop")

    def _tool(self, name: str) -> McpTool | None:
        return next((t for t in self.screen.chat.mcp_tools if t.name == name), None)

    async def _next(self) -> None:
        chat = self.screen.chat
        tool_round = chat.tool_round
        call = tool_round.next_call() if tool_round is not None else None
        if call is None:
            await self._round_done()
            return
        tool, hub = self._tool(call.name), self._hub
        if tool_round.cancelled:
            await self._record(call, "stopped", STOPPED)
        elif tool is None or hub is None:
            await self._record(call, "error", f"no tool {call.name} (its MCP server is not running)")
        elif call.name in self.always:
            self._run(call, tool, hub)
        else:
            self.screen.set_status(f"the model calls {call.name}: run it? (y / n / a / Esc)")
            self._asking = ToolApprovalScreen(call, tool.server)
            self.app.push_screen(self._asking, lambda what: self._answered(call, tool, hub, what))

    async def _answered(self, call: Call, tool: McpTool, hub: McpHub, what: str | None) -> None:
        self._asking = None
        tool_round = self.screen.chat.tool_round
        if tool_round is None or tool_round.next_call() is not call:
            return
        if what == "always":
            self.always.add(call.name)
        if what in ("yes", "always") and not tool_round.cancelled:
            self._run(call, tool, hub)
        elif what == "no":
            await self._record(call, "declined", DECLINED)
        else:
            tool_round.cancel()
            await self._record(call, "stopped", STOPPED)

    def _run(self, call: Call, tool: McpTool, hub: McpHub) -> None:
        self.screen.set_status(f"running {call.name}… (Esc stops)")
        self._call_worker(call, tool, hub)

    @work(thread=True, group="tool", exit_on_error=False)
    def _call_worker(self, call: Call, tool: McpTool, hub: McpHub) -> None:
        tool_round = self.screen.chat.tool_round
        try:
            outcome = hub.call(tool, call.parsed_arguments(), lambda: tool_round is None or tool_round.cancelled)
        except Exception as e:  # never leave the round hanging
            log.exception("tool call %s", call.name)
            outcome = ToolOutcome("error", f"{call.name} failed: {e}")
        self.post_message(ToolDone(call, outcome))

    async def on_tool_done(self, message: ToolDone) -> None:
        tool_round = self.screen.chat.tool_round
        if tool_round is None or tool_round.next_call() is not message.call:
            return
        outcome = message.outcome
        if outcome.status != "ok":  # a tool that failed, hung or was stopped: one line, and the model is told
            self.screen.error(f"tool {message.call.name}: {outcome.text.splitlines()[0] if outcome.text else ''}")
        await self._record(message.call, outcome.status, outcome.text or NO_RESULT)

    async def _record(self, call: Call, status: str, text: str) -> None:
        screen = self.screen
        screen.chat.tool_result(call, status, text)
        await screen.query_one("#messages").mount(result_widget(call, text, status))
        screen.query_one("#messages").scroll_end(animate=False)
        await self._next()

    async def _round_done(self) -> None:
        screen = self.screen
        turn = screen.chat.continue_tools()
        if turn is None:
            screen.set_status(screen.chat.ready_text())
            self.app.answer_ended()
            return
        if not turn.calls:
            screen.notify("the tool-call rounds of this answer are used up: it goes on without tools", timeout=8)
        await screen._start_turn(turn)
