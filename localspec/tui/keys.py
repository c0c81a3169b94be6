"""Keys from the terminal: Textual's own input loop, with a parser that never turns an Esc into a typed "^".

Textual 8.2's `XTermParser` holds ESC and the next byte as a possible escape sequence. When that byte is a control
key (Ctrl+T sends 0x14) and another ESC follows in the same burst, it gives up on the sequence and re-issues it
with the ESC replaced by a literal "^": `Escape Ctrl+T Escape` typed quickly (or sent by tmux in one go) lost the
Esc and left a caret in the message box. No escape sequence starts with ESC and a control byte other than ESC
and Tab, which Textual knows, so `KeyParser` reads the pair as the two keys it is. `ChatDriver` is Textual's
Linux driver running its own input loop with that parser.
"""

from __future__ import annotations

import types
from collections.abc import Iterable

from textual import events
from textual._xterm_parser import XTermParser
from textual.drivers import linux_driver
from textual.drivers.linux_driver import LinuxDriver

ESC = "\x1b"


def _is_control(character: str) -> bool:
    return character < " " and character != ESC


class KeyParser(XTermParser):
    """Textual's parser, except that ESC + a control byte is Escape then that control key (not "^" + the key)."""

    def _sequence_to_key_events(self, sequence: str, alt: bool = False) -> Iterable[events.Key]:
        keys = list(super()._sequence_to_key_events(sequence, alt))
        if keys or len(sequence) != 2 or sequence[0] != ESC or not _is_control(sequence[1]):
            return keys
        return [events.Key("escape", ESC), *super()._sequence_to_key_events(sequence[1])]


def _input_loop_with(parser: type[XTermParser]) -> types.FunctionType:
    # Textual's input loop (`LinuxDriver.run_input_thread`) builds its parser from its module's globals: the same
    # code, with `XTermParser` naming ours. Nothing of Textual's is patched and no lines of it are copied.
    loop = LinuxDriver.run_input_thread
    names = {**vars(linux_driver), "XTermParser": parser}
    return types.FunctionType(loop.__code__, names, loop.__name__, loop.__defaults__, loop.__closure__)


class ChatDriver(LinuxDriver):
    """Textual's Linux (and macOS) terminal driver, reading keys with `KeyParser`."""

    run_input_thread = _input_loop_with(KeyParser)
