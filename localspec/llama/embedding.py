"""`EmbeddingContext`: a llama.cpp context over a loaded model that answers one pooled, L2-normalised embedding per
text (the server's `/v1/embeddings`).

The pooling is the model's own (`<arch>.pooling_type` in its GGUF: mean, CLS, last); a model that names none (a chat
model) is pooled by the mean of its last hidden states. It is a second context beside the generation's, so it never
touches the caches speculation keeps; each input is decoded alone, from an empty cache, as llama.cpp's
`llama-embedding` does.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np

from localspec.errors import ContextError

from .log import llama_error
from .model import Model
from .threads import physical_cores

POOLING_NAMES = {
    llama_cpp.LLAMA_POOLING_TYPE_MEAN: "mean",
    llama_cpp.LLAMA_POOLING_TYPE_CLS: "cls",
    llama_cpp.LLAMA_POOLING_TYPE_LAST: "last",
}


def model_pooling(model: Model) -> int:
    """The pooling the model's GGUF names, or mean where it names none (or none that gives one vector per text)."""
    value = model.meta(f"{model.info.arch}.pooling_type")
    try:
        pooling = int(value) if value is not None else llama_cpp.LLAMA_POOLING_TYPE_MEAN
    except ValueError:
        pooling = llama_cpp.LLAMA_POOLING_TYPE_MEAN
    return pooling if pooling in POOLING_NAMES else llama_cpp.LLAMA_POOLING_TYPE_MEAN


class EmbeddingContext:
    """Pooled embeddings of token sequences of at most `n_ctx` tokens."""

    def __init__(self, model: Model, *, n_ctx: int, n_threads: int | None = None) -> None:
        """Raises:
        ContextError: llama.cpp could not make the context."""
        self.model = model
        self.n_ctx = min(n_ctx, model.info.n_ctx_train)
        self.pooling = model_pooling(model)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = self.n_ctx
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = n_threads or physical_cores()
        params.embeddings = True
        params.pooling_type = self.pooling
        params.no_perf = True
        self._call = model._call
        handle = self._call(llama_cpp.llama_init_from_model, model.handle, params)
        if not handle:
            raise ContextError(f"could not create an embeddings context for {model.path.name}{llama_error()}")
        self._handle = handle
        self.n_embd = int(llama_cpp.llama_model_n_embd(model.handle))
        self._encoder = bool(llama_cpp.llama_model_has_encoder(model.handle))
        self._batch = llama_cpp.llama_batch_init(self.n_ctx, 0, 1)

    @property
    def pooling_name(self) -> str:
        return POOLING_NAMES[self.pooling]

    def embed(self, tokens: list[int]) -> np.ndarray:
        """The L2-normalised pooled embedding of `tokens` ((n_embd,) float32).

        Raises:
            ContextError: no tokens, more than the context holds, or llama.cpp failed.
        """
        if not tokens or len(tokens) > self.n_ctx:
            raise ContextError(f"an embedding input must have 1 to {self.n_ctx} tokens, not {len(tokens)}")
        handle = self._handle
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(handle), True)
        batch = self._batch
        batch.n_tokens = len(tokens)
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i] = token, i
            batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, 0, 1
        run = llama_cpp.llama_encode if self._encoder else llama_cpp.llama_decode
        if self._call(run, handle, batch) != 0:
            raise ContextError(f"llama.cpp could not embed {len(tokens)} tokens{llama_error()}")
        pointer = self._call(llama_cpp.llama_get_embeddings_seq, handle, 0)
        if not pointer:
            raise ContextError(f"llama.cpp returned no pooled embedding for {self.model.path.name}")
        vector = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), (self.n_embd,)).copy()
        norm = float(np.linalg.norm(vector))
        return vector / norm if norm > 0 else vector

    def close(self) -> None:
        if getattr(self, "_handle", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._call(llama_cpp.llama_free, self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()
