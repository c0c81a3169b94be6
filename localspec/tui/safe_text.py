"""Text from outside the chat — a model, a tool, an MCP server, a file, a saved chat — made safe to draw.

A terminal obeys the control characters it is sent: `ESC ] 0 ; … BEL` sets its title, `ESC [ 2 J` clears it, OSC 52
writes the clipboard. Every widget that draws such text passes it through `terminal_safe`, and draws it as data,
never as Textual markup (`plain` for the places that take a Rich renderable). The store keeps the text as it came.
"""

from __future__ import annotations

import re

from rich.text import Text

# A complete escape sequence goes whole, so that no "]0;title" is left behind: CSI (ESC [ or 0x9B, parameters, one
# final byte); the string sequences OSC, DCS, SOS, PM and APC up to their end (BEL or ST, ESC \ or 0x9C); any other
# ESC with its intermediate and final bytes. A sequence left unfinished loses only its opening bytes (the fallback
# below matches "ESC ]" alone): what follows stays in sight rather than vanish to the end of the text.
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[ -/]*[0-~]"
)
# What is left of C0 but line feed and tab, DEL, and C1 (0x80–0x9F).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """`text` without control characters: escape sequences dropped whole, other C0 controls but line feed and tab,
    DEL and the C1 controls dropped alone (a carriage return too: a line break is a line feed here)."""
    if _CONTROL.search(text) is None:  # the usual case, one scan
        return text
    return _CONTROL.sub("", _SEQUENCE.sub("", text))


def plain(text: str, style: str = "") -> Text:
    """Outside text as a Rich `Text` (a table cell, an option list's line): drawn as it reads, never parsed as
    markup — a plain `str` there would be."""
    return Text(terminal_safe(text), style=style)
