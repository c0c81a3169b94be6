"""`EmbeddingContext`: a llama.cpp context over a loaded model that answers one pooled, L2-normalised embedding per
text (the server's `/v1/embeddings`).

The pooling is the model's own (`<arch>.pooling_type` in its GGUF: mean, CLS, last); a model that names none (a chat
model) is pooled by the mean of its last hidden states. It is a second context beside the generation's, so it never
touches the caches speculation keeps. Several inputs are decoded in one batch, a sequence each, from an empty cache
(as llama.cpp's `llama-embedding` does): the cells are one pool (`kv_unified`), so an input may be as long as the
context whatever the number of sequences, and `packs` splits a request's inputs into batches that fit.
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


SEQ_MAX = 64  # inputs decoded together in one batch, at most


def packs(lengths: list[int], n_ctx: int, seq_max: int = SEQ_MAX) -> list[range]:
    """The inputs' indices split, in order, into batches of at most `seq_max` inputs and `n_ctx` tokens in all (an
    input longer than that is a batch alone)."""
    out, start, used = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and (used + n > n_ctx or i - start == seq_max):
            out.append(range(start, i))
            start, used = i, 0
        used += n
    if lengths:
        out.append(range(start, len(lengths)))
    return out


class EmbeddingContext:
    """Pooled embeddings of token sequences of at most `n_ctx` tokens, up to `SEQ_MAX` of them in one decode."""

    def __init__(self, model: Model, *, n_ctx: int, n_threads: int | None = None) -> None:
        """Raises:
        ContextError: llama.cpp could not make the context."""
        self.model = model
        self.n_ctx = min(n_ctx, model.info.n_ctx_train)
        self.pooling = model_pooling(model)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = self.n_ctx
        params.n_seq_max = SEQ_MAX
        params.kv_unified = True  # one pool of cells: any input up to n_ctx, however many share the batch
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
        return self.embed_batch([tokens])[0]

    def embed_batch(self, inputs: list[list[int]]) -> list[np.ndarray]:
        """The L2-normalised pooled embeddings of `inputs`, decoded in one batch (a sequence each): at most `SEQ_MAX`
        inputs and `n_ctx` tokens in all (`packs` splits a longer list).

        Raises:
            ContextError: an empty input, more than the batch holds, or llama.cpp failed.
        """
        total = sum(len(tokens) for tokens in inputs)
        if not inputs or len(inputs) > SEQ_MAX or total > self.n_ctx or not all(inputs):
            raise ContextError(f"an embeddings batch holds 1 to {SEQ_MAX} inputs of {self.n_ctx} tokens in all")
        handle = self._handle
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(handle), True)
        batch, row = self._batch, 0
        batch.n_tokens = total
        for seq, tokens in enumerate(inputs):
            for pos, token in enumerate(tokens):
                batch.token[row], batch.pos[row] = token, pos
                batch.n_seq_id[row], batch.seq_id[row][0], batch.logits[row] = 1, seq, 1
                row += 1
        run = llama_cpp.llama_encode if self._encoder else llama_cpp.llama_decode
        if self._call(run, handle, batch) != 0:
            raise ContextError(f"llama.cpp could not embed {total} tokens{llama_error()}")
        return [self._pooled(seq) for seq in range(len(inputs))]

    def _pooled(self, seq: int) -> np.ndarray:
        pointer = self._call(llama_cpp.llama_get_embeddings_seq, self._handle, seq)
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
