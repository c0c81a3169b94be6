"""Every error a user can see, in one family.

Each message is one line that says what is wrong and what to do next; the CLI and the TUI print
`str(error)` and nothing else. Internal invariants use `assert`, never these classes.
"""

from __future__ import annotations


class LocalspecError(Exception):
    """Base class: an error with a message meant for the user."""


class ModelFileError(LocalspecError):
    """A model file is missing, not GGUF, truncated, or cannot be loaded."""


class IncompatibleDraftError(LocalspecError):
    """The draft model cannot be paired with the target (different vocabulary)."""


class ContextError(LocalspecError):
    """A context cannot be created (n_ctx too large) or has run out of room."""


class InvalidParamsError(LocalspecError):
    """A sampling or speculation setting is out of range."""


class ChatTemplateError(LocalspecError):
    """The model has no chat template, or the template cannot be rendered."""


class ConfigError(LocalspecError):
    """models.toml or another settings file is invalid."""


class DownloadError(LocalspecError):
    """A model download failed (network, disk, gated repository, missing file)."""


class RpcError(LocalspecError):
    """An RPC worker cannot be used: unreachable, busy, another protocol version, or no RPC in this build."""


class WorkerLostError(RpcError):
    """An RPC worker stopped answering while the target was on it (the model must be loaded again).

    `then` says what to do once the worker runs again, in the words of whoever shows it (`instead`).
    """

    def __init__(self, where: str, detail: str, then: str = "load the model again") -> None:
        super().__init__(f"lost the RPC worker {where} ({detail}): restart `localspec worker` there and {then}")
        self.where, self.detail = where, detail

    def instead(self, then: str) -> WorkerLostError:
        """The same loss, with another next step (the CLI's, the chat's)."""
        return WorkerLostError(self.where, self.detail, then)
