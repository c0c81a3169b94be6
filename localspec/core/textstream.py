"""Token bytes → streamed text that never splits a UTF-8 character or leaks part of a stop string.

Incomplete UTF-8 sequences are held back by the stdlib incremental decoder; text that could be the
start of a stop string is held back until it is known not to be one.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    """Feed token bytes, get the text that is safe to show.

    Args:
        stop: strings that end the generation; they are not part of the output.
    """

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [s for s in stop if s]
        self._held = ""  # decoded text not yet released (a possible stop-string prefix)
        self.text = ""  # everything released so far
        self.stopped = False

    def push(self, data: bytes) -> str:
        """Add one token's bytes; return the newly releasable text ("" while holding back)."""
        assert not self.stopped
        pending = self._held + self._decoder.decode(data)
        for stop in self._stop:
            cut = pending.find(stop)
            if cut >= 0:
                self.stopped = True
                pending = pending[:cut]
                self._held = ""
                return self._release(pending)
        keep = prefix_held(pending, self._stop)
        self._held = pending[len(pending) - keep :] if keep else ""
        return self._release(pending[: len(pending) - keep])

    def flush(self) -> str:
        """Release everything still held (end of generation without a stop string)."""
        rest = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return self._release(rest)

    def _release(self, text: str) -> str:
        self.text += text
        return text


def prefix_held(text: str, strings: Sequence[str]) -> int:
    """Length of the longest end of `text` that is a proper start of one of `strings` (it may yet become that string,
    so it is held back: a stop string here, a thinking marker in thinking.py)."""
    best = 0
    for string in strings:
        for n in range(min(len(string) - 1, len(text)), best, -1):
            if text.endswith(string[:n]):
                best = n
                break
    return best
