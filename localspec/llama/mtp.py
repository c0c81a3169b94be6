"""A model's own draft head (MTP, "nextn" layers): the native calls, probed once per use, and the head's context.

llama.cpp runs the head in a second context on the target's model (`ctx_type = MTP`). Each head row reads a token
and a hidden row: the target's last hidden state of the position before it, or the head's own for a chained draft.
The calls that move hidden rows are llama-cpp-python's unstable staging bindings (`llama_cpp_ext`), so nothing here
assumes them: `mtp_calls` says what is missing, and the engine then drafts with n-grams instead.
"""

from __future__ import annotations

import ctypes
import importlib

import llama_cpp
import numpy as np

from localspec.errors import ContextError

from .context import Context

_EXT_CALLS = ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith")


def staging():
    """llama-cpp-python's staging bindings, or None (an older or newer build without them)."""
    try:
        return importlib.import_module("llama_cpp.llama_cpp_ext")
    except (ImportError, AttributeError, OSError):  # AttributeError: a symbol missing from the shared library
        return None


def mtp_calls() -> str:
    """'' when this llama-cpp-python can run an MTP head, else what it lacks (one phrase)."""
    missing = [n for n in ("llama_model_n_layer_nextn", "LLAMA_CONTEXT_TYPE_MTP") if not hasattr(llama_cpp, n)]
    fields = {name for name, _ in llama_cpp.llama_model_params._fields_} | {
        name for name, _ in llama_cpp.llama_context_params._fields_
    }
    missing += [f for f in ("load_mtp", "ctx_type") if f not in fields]
    return ", ".join(missing + staging_missing())


def staging_missing() -> list[str]:
    """The staging calls that move hidden rows (`llama_cpp_ext`) this llama-cpp-python lacks."""
    ext = staging()
    return list(_EXT_CALLS) if ext is None else [n for n in _EXT_CALLS if not hasattr(ext, n)]


# Architectures whose MTP graph this llama.cpp builds (src/models/*: LLM_GRAPH_TYPE_DECODER_MTP). Most of them abort
# (GGML_ASSERT) on a file with more than one MTP block; these three run any one of several (the first, here).
MTP_ARCHES = frozenset(
    "bailingmoe3 cohere2moe deepseek2 deepseek32 deepseek4 glm-dsa glm4moe glm5-next hy_v3 mimo2 nemotron_h_moe "
    "qwen35 qwen35moe qwen3next step35".split()
)
MANY_BLOCK_ARCHES = frozenset({"mimo2", "hy_v3", "step35"})


def head_problem(arch: str, n_layer_nextn: int) -> str:
    """Why this llama.cpp cannot run a head of `n_layer_nextn` MTP blocks on `arch` ("" when it can): asked before
    the head's context is made, since llama.cpp aborts the process rather than refuse."""
    if arch not in MTP_ARCHES:
        return f"this llama.cpp has no MTP graph for {arch}"
    if n_layer_nextn > 1 and arch not in MANY_BLOCK_ARCHES:
        return f"this llama.cpp runs a single MTP block of {arch}, and the file has {n_layer_nextn}"
    return ""


def emit_hidden(ctx: Context) -> None:
    """Make `ctx` keep every batch row's last hidden state (`hidden_rows`), not only the rows with logits."""
    staging().llama_set_embeddings_nextn(ctx.handle, True, False)


def hidden_rows(ctx: Context, n: int) -> np.ndarray:
    """The last decode's n hidden rows (a context set up by `emit_hidden`, or one of its sequences: its own rows of a
    shared batch): a (n, n_embd) float32 copy."""
    address = staging().llama_get_embeddings_nextn(ctx.handle)
    if not address:
        raise ContextError("llama.cpp kept no hidden rows for the MTP head")
    start = ctx.rows_start(n)  # a sequence of a shared batch: its own rows (llama/slots.py)
    return np.ctypeslib.as_array(address, shape=(start + n, ctx.model.info.n_embd))[start:].copy()


class FedContext(Context):
    """A context each of whose batch rows reads a token and a hidden row of `width` floats besides: an MTP head's on
    the target's model (`HeadContext`), a Gemma 4 assistant's beside the target (llama/assistant.py).

    `stage(rows, n_past)` hands the rows for the next decode's positions n_past.. (zeros where none were staged: only
    the probe and warm-up decode without). After a decode, `hidden(i)` is its own hidden row for output row i — what
    a chained draft feeds back.
    """

    def __init__(self, model, *, width: int, **kwargs) -> None:
        super().__init__(model, **kwargs)
        self.width = width
        self._rows = np.zeros((self.n_batch, width), dtype=np.float32)  # (n_batch, width): the batch's embd
        self._batch.embd = self._rows.ctypes.data_as(ctypes.POINTER(ctypes.c_float))  # detached again in close()
        self._staged: tuple[int, np.ndarray] | None = None
        staging().llama_set_embeddings_nextn(self.handle, True, True)

    def close(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self._batch.embd = ctypes.POINTER(ctypes.c_float)()  # ours, not llama_batch_free's to free
        super().close()

    def stage(self, rows: np.ndarray, n_past: int) -> None:
        """The hidden rows of the next decode, which starts at position n_past: (n_tokens, width)."""
        self._staged = (n_past, rows)

    def _submit(self, tokens: list[int], n_past: int, first_out: int) -> None:
        n = len(tokens)
        staged = self._staged
        if staged is not None and staged[0] <= n_past and n_past + n <= staged[0] + len(staged[1]):
            self._rows[:n] = staged[1][n_past - staged[0] : n_past - staged[0] + n]
        else:
            self._rows[:n] = 0.0
        super()._submit(tokens, n_past, first_out)

    def hidden(self, i: int) -> np.ndarray:
        """Its own hidden row for output row i of the last decode (negative from the end): a copy."""
        address = staging().llama_get_embeddings_nextn_ith(self.handle, i)
        if not address:
            raise ContextError(f"no hidden row {i}: it was not requested in the last decode")
        return np.ctypeslib.as_array(address, shape=(self.width,)).copy()


class HeadContext(FedContext):
    """The MTP head's own context on the target's model (its KV cache holds the head's layer only). Each decoded row
    reads a token and the target's hidden row before it (`FedContext`)."""

    def __init__(self, model, **kwargs) -> None:
        if not model.mtp_loaded or model.n_layer_nextn == 0:
            raise ContextError(f"{model.path.name} was loaded without an MTP head")
        super().__init__(model, width=model.info.n_embd, **kwargs)

    def _configure(self, params) -> None:
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
