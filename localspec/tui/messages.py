"""Messages the app's thread workers post to the UI thread (Textual `Message`s).

Workers never touch widgets: loading, pulling and generating report through these, and the app's
handlers change the screen. Each generation message carries its turn id so a late message from a
finished or abandoned turn is recognised and ignored.
"""

from __future__ import annotations

from textual.message import Message

from .live import Chunk, Finished, Reading
from .loading import Loaded


class LoadProgress(Message):
    """A loading or pulling step began (one line for the status bar)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class PullBytes(Message):
    """Bytes of a file being downloaded."""

    def __init__(self, filename: str, done: int, total: int | None) -> None:
        super().__init__()
        self.filename, self.done, self.total = filename, done, total


class EngineReady(Message):
    """Models are loaded and the chat can start."""

    def __init__(self, loaded: Loaded) -> None:
        super().__init__()
        self.loaded = loaded


class LoadFailed(Message):
    """Loading or pulling failed; `error` is the one-line message to show."""

    def __init__(self, error: str, *, pulled: bool = False) -> None:
        super().__init__()
        self.error, self.pulled = error, pulled


class PullDone(Message):
    """A pair's files are downloaded; loading it comes next."""

    def __init__(self, pair: str) -> None:
        super().__init__()
        self.pair = pair


class AnswerChunk(Message):
    """New answer text and a stats snapshot."""

    def __init__(self, turn_id: int, chunk: Chunk) -> None:
        super().__init__()
        self.turn_id, self.chunk = turn_id, chunk


class PromptReading(Message):
    """Progress of reading a long prompt before the answer starts."""

    def __init__(self, turn_id: int, reading: Reading) -> None:
        super().__init__()
        self.turn_id, self.reading = turn_id, reading


class AnswerDone(Message):
    """The turn ended: stop, length, cancelled, or an error."""

    def __init__(self, turn_id: int, finished: Finished) -> None:
        super().__init__()
        self.turn_id, self.finished = turn_id, finished


class TurnFailed(Message):
    """The turn could not start (e.g. the message does not fit the context)."""

    def __init__(self, turn_id: int, error: str) -> None:
        super().__init__()
        self.turn_id, self.error = turn_id, error


class McpReady(Message):
    """The MCP servers started (or some did not): their tools, and one line per server that failed."""

    def __init__(self, tools: list, errors: list[str]) -> None:
        super().__init__()
        self.tools, self.errors = tools, errors
