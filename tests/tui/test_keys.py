"""Key bursts from a real terminal (issue #21): `Escape Ctrl+T Escape` in one burst typed a "^".

Textual 8.2's parser re-issued ESC + a control byte with the ESC replaced by a literal caret when another ESC
followed; `tui/keys.KeyParser` reads the pair as Escape then the control key. The parser is fed bytes as the
terminal sends them, and the real chat gets the burst on a pseudo-terminal.
"""

from __future__ import annotations

import time

import pytest
from textual._xterm_parser import XTermParser

from localspec.tui.keys import KeyParser
from localspec.tui.store import ChatStore

ESC, CTRL_T = "\x1b", "\x14"


def keys(parser_class, data: str) -> list[str]:
    """The keys a parser makes of `data` arriving in one read, then the end of input."""
    parser = parser_class()
    return [event.key for event in [*parser.feed(data), *parser.feed("")] if hasattr(event, "key")]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (ESC + CTRL_T + ESC, ["escape", "ctrl+t", "escape"]),
        (ESC + CTRL_T, ["escape", "ctrl+t"]),
        (ESC + "\x12" + ESC + "\x0e", ["escape", "ctrl+r", "escape", "ctrl+n"]),
        # what Textual already read right stays as it was
        (ESC + "[A", ["up"]),
        ("a^b", ["a", "circumflex_accent", "b"]),
        (ESC + ESC, ["escape", "escape"]),
        (ESC + "\t", ["shift+tab"]),
        (ESC + "a", ["alt+a"]),
    ],
)
def test_escape_then_a_control_key_is_two_keys(data, expected):
    assert keys(KeyParser, data) == expected


def test_textuals_own_parser_still_types_a_caret():
    """The bug worked around: when this fails, Textual fixed it and `KeyParser` can go."""
    assert keys(XTermParser, ESC + CTRL_T + ESC) == ["circumflex_accent", "ctrl+t", "escape"]


@pytest.mark.slow
def test_a_key_burst_in_a_real_terminal_types_nothing(chat_in_terminal, chat_home):
    chat = chat_in_terminal()
    chat.wait_for("ready ·".encode(), "ready (models loaded)")
    for _ in range(4):  # the 4 of 4 tries
        chat.type(ESC + CTRL_T + ESC)  # one write: one burst
        time.sleep(0.3)  # the last Esc waits out ESCDELAY (0.1 s)
    chat.type("hi\r")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        store = ChatStore(chat_home.db_path)
        try:
            sent = [m.content for c in store.conversations() for m in store.messages(c.id) if m.role == "user"]
        finally:
            store.close()
        if sent:
            break
        time.sleep(0.1)
    assert sent == ["hi"]
