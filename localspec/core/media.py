"""Images in a model's token history (DESIGN §11): each image a run of negative ids, one per position it takes.

A `KVSequence` holds its history as token ids; an image takes `n_pos` positions of the target's KV but is no token.
So each image is written into the history as `n_pos` negative ids, unique to the image's content (its sha256) for
the life of the process: the same image at the same place is the same run, another image differs at its first id.
Prefix reuse, the prompt cache and rollback then work on images as on text, and a common prefix never ends inside an
image. `MediaStore` is the target's: it turns an image into its run (with the model's own tokens around it, as mtmd
writes them: Gemma 3's `<start_of_image>`) and decodes a run into a context through the projector. `Filler` is a
draft's: it reads an image's run as as many copies of one plain token (the draft sees a blank where the picture
was, so its proposals after it may be worse, but verification keeps the output the target's: DESIGN §1).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import cast

from localspec.errors import ContextError, LocalspecError
from localspec.llama.context import Context as LlamaContext
from localspec.llama.slots import SeqContext
from localspec.llama.vision import TEXT, Chunk, Chunks, Image, Projector, media_marker

from .kv import MEDIA_STRIDE as STRIDE
from .kv import Context

log = logging.getLogger(__name__)

CHUNKS_KEPT = 8  # images whose preprocessed chunks stay in memory (the others are preprocessed again when read)


class MediaStore:
    """The images an engine's prompts hold, and how the target reads them (its `KVSequence.media`).

    Args:
        projector: the target's projector (llama/vision.py), owned by the engine.
    """

    def __init__(self, projector: Projector) -> None:
        self.projector = projector
        self._handles: dict[str, int] = {}  # image id (sha256) -> handle, never reused
        self._images: dict[int, Image] = {}  # handle -> the image (its bytes: preprocessed again when needed)
        self._chunks: OrderedDict[int, tuple[Chunks, Chunk]] = OrderedDict()  # recent handles' chunks
        self._wrapped: dict[int, tuple[list[int], list[int], int]] = {}  # handle -> (before, after, n_pos)

    @property
    def sees_images(self) -> bool:
        return self.projector.supports_vision

    def tokens(self, image: Image) -> list[int]:
        """The image as the target reads it: the model's own tokens before and after it (as mtmd writes them) around
        one id per position it takes."""
        handle = self._handles.get(image.id)
        if handle is None:
            handle = self._handles[image.id] = len(self._handles) + 1
            self._images[handle] = image
        if handle not in self._wrapped:
            self._chunk(handle)
        before, after, n_pos = self._wrapped[handle]
        return [*before, *(-(handle * STRIDE + i) - 1 for i in range(n_pos)), *after]

    def _chunk(self, handle: int) -> Chunk:
        """The image's chunk, preprocessed again if it was let go."""
        if handle in self._chunks:
            self._chunks.move_to_end(handle)
            return self._chunks[handle][1]
        chunks = self.projector.tokenize(media_marker(), [self._images[handle]])
        try:
            at = [i for i, c in enumerate(chunks) if c.kind != TEXT]
            if len(at) != 1:
                raise LocalspecError(f"the projector cut one image into {len(at)} pieces: not supported yet")
            chunk = chunks[at[0]]
            before = [t for c in list(chunks)[: at[0]] for t in c.tokens]  # the model's own tokens around it
            after = [t for c in list(chunks)[at[0] + 1 :] for t in c.tokens]
        except BaseException:
            chunks.close()
            raise
        self._wrapped[handle] = (before, after, chunk.n_pos)
        self._chunks[handle] = (chunks, chunk)
        while len(self._chunks) > CHUNKS_KEPT:
            self._chunks.popitem(last=False)[1][0].close()
        return chunk

    def decode(self, ctx: Context, run: Sequence[int], n_past: int) -> None:
        """Decode the image whose whole run is `run` into `ctx` at n_past (a `serve --parallel` slot: its sequence)."""
        handle = (-run[0] - 1) // STRIDE
        if handle not in self._images:
            raise ContextError("an image this history holds is not in this engine: attach it again")
        chunk = self._chunk(handle)
        if len(run) != chunk.n_pos or -run[0] - 1 != handle * STRIDE:
            raise ContextError(f"only part of an image ({len(run)} of {chunk.n_pos} positions) was to be read")
        if n_past + chunk.n_pos > ctx.n_ctx:
            raise ContextError(
                f"the image takes {chunk.n_pos} positions and the context has room for {max(ctx.n_ctx - n_past, 0)} "
                f"more (n_ctx {ctx.n_ctx}): start a new chat, or raise --n-ctx"
            )
        if isinstance(ctx, SeqContext):  # a slot: its sequence of the shared context
            ctx.discard()  # rows a shared batch decoded for it: not these
            parent, seq = ctx.parent, ctx.seq
        else:
            parent, seq = cast(LlamaContext, ctx), 0
        self.projector.eval_image(parent, chunk, n_past, seq=seq)

    def close(self) -> None:
        """Free the chunks kept (the projector is the engine's)."""
        for chunks, _ in self._chunks.values():
            chunks.close()
        self._chunks.clear()


class Filler:
    """How a draft reads an image's run: as many copies of one plain token (`token`), so its history stays as long as
    the target's and its positions line up (DESIGN §11)."""

    def __init__(self, token: int) -> None:
        self.token = token

    def decode(self, ctx: Context, run: Sequence[int], n_past: int) -> None:
        ctx.decode([self.token] * len(run), n_past, outputs=0)
