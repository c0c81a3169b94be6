"""Text a user hands us (arguments, stdin, typed text) turned into valid Unicode, never an exception.

Our choice for bytes that are not UTF-8: decode what can be decoded and replace each invalid byte with
U+FFFD (`errors="replace"`), then say how many were replaced. Python hands undecodable argv bytes over as
lone surrogates ("surrogateescape"); they are turned back into bytes first, so both routes agree.
"""

from __future__ import annotations

from typing import BinaryIO

REPLACEMENT = "\ufffd"


def to_text(data: bytes) -> tuple[str, int]:
    """Decode bytes as UTF-8; returns (text, how many U+FFFD replacements were made)."""
    text = data.decode("utf-8", errors="replace")
    return text, text.count(REPLACEMENT) - data.count(REPLACEMENT.encode("utf-8"))


def clean(text: str) -> tuple[str, int]:
    """Valid Unicode from a str that may hold lone surrogates; returns (text, replacements made)."""
    try:
        text.encode("utf-8")
        return text, 0
    except UnicodeEncodeError:
        pass
    try:
        data = text.encode("utf-8", errors="surrogateescape")  # argv / os.environ bytes back to bytes
    except UnicodeEncodeError:
        data = text.encode("utf-8", errors="surrogatepass")  # other lone surrogates: invalid bytes, replaced below
    return to_text(data)


def read_stream(stream: BinaryIO | None) -> tuple[str, int]:
    """All of a binary stream (stdin's buffer) as text; ("", 0) when there is no stream."""
    if stream is None:
        return "", 0
    return to_text(stream.read())


def replaced_notice(n: int, what: str) -> str:
    """The note shown when `n` bytes of `what` were not UTF-8."""
    return f"{what} had {n} byte{'s' if n != 1 else ''} that are not UTF-8: each became U+FFFD"


def one_line(message: str) -> str:
    """A message as exactly one printable line: line breaks escaped, lone surrogates as \\udcXX."""
    escaped = "".join(c.encode("unicode_escape").decode("ascii") if c in _BREAKS else c for c in message)
    return escaped.encode("utf-8", errors="backslashreplace").decode("utf-8")


_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")  # what str.splitlines() splits on
