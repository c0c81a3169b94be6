"""Every error a user can see, in one family.

Each message is one line that says what is wrong and what to do next; the CLI and the TUI print
`str(error)` and nothing else. Internal invariants use `assert`, never these classes.
"""

from __future__ import annotations


class LocalspecError(Exception):
    """Base class: an error with a message meant for the user."""


class ModelFileError(LocalspecError):
    """A model file is missing, not GGUF, truncated, or cannot be loaded."""


class NonFiniteLogitsError(ModelFileError):
    """A model's logits came out NaN or infinite: damaged weights, or a build that computes them wrongly.

    Raised where a row is read (no model named yet); `naming` says whose row it was.
    """

    def __init__(self, detail: str = "", model: str = "") -> None:
        self.detail, self.model = detail, model
        who = model or "the model"
        super().__init__(
            f"{who} computed logits that are not numbers (NaN or infinite{detail}): its weights may be damaged, "
            "or this llama.cpp build computes it wrongly — re-download it, or check the build with `localspec doctor`"
        )

    def naming(self, model: str, position: int | None = None) -> NonFiniteLogitsError:
        """The same error, naming the model (and the position) whose row it was."""
        where = f" at position {position}" if position is not None else ""
        return NonFiniteLogitsError(f"{self.detail}{where}", model)


class IncompatibleDraftError(LocalspecError):
    """The draft model cannot be paired with the target (different vocabulary)."""


class ContextError(LocalspecError):
    """A context cannot be created (n_ctx too large) or has run out of room."""


class NoRoomError(ContextError):
    """A decode found too few free cells for its rows (llama_decode's 1): the context, or the one pool the slots of
    `serve --parallel` share, is full. Nothing was decoded: the caches are as before."""


class InvalidParamsError(LocalspecError):
    """A sampling or speculation setting is out of range."""


class ChatTemplateError(LocalspecError):
    """The model has no chat template, or the template cannot be rendered."""


class ConfigError(LocalspecError):
    """models.toml or another settings file is invalid."""


class HistoryError(LocalspecError):
    """The chat database cannot be opened, is from a newer localspec, or has no such conversation."""


class ConversationGone(HistoryError):
    """The conversation a window appends to was deleted (in another window) since it was opened."""


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
