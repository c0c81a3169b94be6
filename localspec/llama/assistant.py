"""Gemma 4's assistant (`gemma4-assistant`): a small sidecar model that drafts from the target's own context.

The assistant has no KV cache of its own: its context is made with `ctx_other` = the target's, attends over the
target's cache (its SWA blocks over the target's last SWA layer, its full ones over the last full layer) and writes
none. One draft is one batch row carrying the last token and the target's hidden row (the LM head's input) of the row
that produced it, at exactly the target's last position + 1; a chained draft stays at that position, fed the
assistant's own next hidden row. So a rollback is the target's alone, and the assistant's context must never clear
its memory: that would clear the target's (DESIGN §1). The hidden rows move through
llama-cpp-python's staging calls (`llama_cpp_ext`, as the MTP head's: llama/mtp.py); `assistant_calls` says what a
build lacks.
"""

from __future__ import annotations

import llama_cpp
import numpy as np

from localspec.errors import ContextError, InvalidParamsError

from .context import Context
from .model import Model
from .mtp import FedContext, staging, staging_missing
from .slots import SeqContext

ASSISTANT_ARCHES = frozenset({"gemma4-assistant"})  # sidecar drafters this llama.cpp runs beside a target
TARGET_ARCH = {"gemma4-assistant": "gemma4"}  # the target architecture each reads


def is_assistant(arch: str) -> bool:
    """Whether a GGUF of architecture `arch` is an assistant sidecar, not a draft model of its own."""
    return arch in ASSISTANT_ARCHES


def assistant_calls() -> str:
    """'' when this llama-cpp-python can run an assistant, else what it lacks (one phrase)."""
    missing = [] if hasattr(llama_cpp, "llama_model_n_embd_out") else ["llama_model_n_embd_out"]
    if "ctx_other" not in {field[0] for field in llama_cpp.llama_context_params._fields_}:
        missing.append("ctx_other")
    return ", ".join(missing + staging_missing())


def check_assistant(assistant: Model, target: Model) -> None:
    """That `assistant` was made for `target`: the target's architecture, width and vocabulary.

    Raises:
        InvalidParamsError: one line naming the mismatch and the fix.
    """
    arch, name = assistant.info.arch, assistant.path.name
    wanted = TARGET_ARCH[arch]
    if target.info.arch != wanted:
        raise InvalidParamsError(
            f"{name} is a {arch} sidecar and drafts for a {wanted} target only; {target.path.name} is "
            f"{target.info.arch}: give the assistant made for this target, or another --draft"
        )
    width = int(llama_cpp.llama_model_n_embd_out(assistant.handle))
    if (width, assistant.n_vocab) != (target.info.n_embd, target.n_vocab):
        raise InvalidParamsError(
            f"{name} was made for a target of width {width} and {assistant.n_vocab} tokens; {target.path.name} has "
            f"{target.info.n_embd} and {target.n_vocab}: give the assistant made for this target"
        )


def emit_output_hidden(ctx: Context) -> None:
    """Make the target's context keep the hidden row (the LM head's input) of each row it computes logits for: only
    those, so no row's logits are forced (`output_hidden`)."""
    staging().llama_set_embeddings_nextn(ctx.handle, True, True)


def output_hidden(ctx: Context | SeqContext) -> np.ndarray:
    """The last decode's hidden rows of its output rows, in batch order (a context set up by `emit_output_hidden`):
    an (n_outputs, n_embd) float32 copy; (0, n_embd) when it computed no outputs."""
    (first, n), width = ctx.output_span(), ctx.model.info.n_embd  # a sequence of a shared batch: its own rows
    if n == 0:
        return np.zeros((0, width), np.float32)
    address = staging().llama_get_embeddings_nextn(ctx.handle)
    if not address:
        raise ContextError(f"llama.cpp kept no hidden rows of {ctx.model.path.name} for the assistant")
    return np.ctypeslib.as_array(address, shape=(first + n, width))[first:].copy()


class AssistantContext(FedContext):
    """The assistant's context beside the target's (`ctx_other`): n_ctx and the sliding-window cache follow the
    target's, one row a decode. Each row reads a token and a hidden row of the target's width (`FedContext.stage`).

    It shares the target's memory: `clear` and the other cache edits are refused (llama.cpp would clear the target's
    cells). Close it before the target's context.
    """

    def __init__(self, model: Model, target: Context, *, n_threads: int | None = None) -> None:
        if not is_assistant(model.info.arch):
            raise ContextError(f"{model.path.name} is not an assistant sidecar ({model.info.arch})")
        self._other = target
        width = int(llama_cpp.llama_model_n_embd_out(model.handle))
        # As many sequences as the target's (a context with fewer would take the target's other sequences' cells
        # from it: measured, its decodes then fail), and a batch that holds one output row per sequence.
        n_seq = getattr(target, "n_seq", 1)
        super().__init__(
            model,
            width=width,
            n_ctx=target.n_ctx,
            n_batch=n_seq,
            n_threads=n_threads,
            swa_full=target.swa_full,
            n_seq=n_seq,
        )

    def _configure(self, params) -> None:
        params.ctx_other = self._other.handle

    def follow_threads(self) -> None:
        """Use the target's thread count from the next decode on (the engine tunes the target's to the free cores)."""
        if self.n_threads != self._other.n_threads:
            self.set_threads(self._other.n_threads)

    def clear(self, seq: int | None = None) -> None:
        raise ContextError("the assistant holds no cache of its own: clearing it would clear the target's")

    def remove_from(self, pos: int, seq: int = 0) -> bool:
        raise ContextError("the assistant holds no cache of its own: roll the target back instead")

    def remove_span(self, start: int, end: int, seq: int = 0) -> bool:
        raise ContextError("the assistant holds no cache of its own: edit the target's")
