"""The one line the chat shows for an error raised in one of its workers.

A `LocalspecError` already says what is wrong and what to do. Anything else is a bug: the user gets one line
that names what failed and where the traceback went (the log file), never the traceback itself.
"""

from __future__ import annotations

import logging

from localspec.errors import LocalspecError, WorkerLostError
from localspec.paths import get_paths

log = logging.getLogger(__name__)


def error_text(error: Exception, doing: str) -> str:
    """What to show for `error`, raised while `doing` (e.g. "loading"); an unexpected one is logged in full."""
    if isinstance(error, WorkerLostError):
        return str(error.instead("reload the pair (F2): the chat is kept"))
    if isinstance(error, LocalspecError):
        return str(error)
    log.error("%s failed", doing, exc_info=error)
    return f"{doing} failed unexpectedly: {error} (details in {get_paths().log_file})"
