"""Images in a model's token history (DESIGN §11): each image a run of negative ids, one per position it takes.

A `KVSequence` holds its history as token ids; an image takes `n_pos` positions of the target's KV but is no token.
So each image is written into the history as `n_pos` negative ids, unique to the image's content (its sha256) for
the life of the process: the same image at the same place is the same run, another image differs at its first id.
Prefix reuse, the prompt cache and rollback then work on images as on text, and a common prefix never ends inside an
image. `MediaStore` is the target's: it turns an image into its run (with the model's own tokens around it, as mtmd
writes them: Gemma 3's `<start_of_image>`) and decodes a run into a context through the projector. `Filler` is a
draft's: it reads an image's run as as many copies of one plain token (the draft sees a blank where the picture
was, so its proposals after it may be worse, but verification keeps the output the target's: DESIGN §1).
A server preprocesses a request's images off the engine thread (`MediaStore.prepare`), counting the positions they
take before decoding each; the image files kept to preprocess again are bounded by bytes, least recently used first.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np

from localspec.errors import ContextError, LocalspecError
from localspec.llama.context import Context as LlamaContext
from localspec.llama.pictures import Image, blank_image
from localspec.llama.slots import SeqContext
from localspec.llama.vision import TEXT, Chunk, Chunks, Projector, input_width, media_marker

from .context import MEDIA_STRIDE as STRIDE
from .context import Context

log = logging.getLogger(__name__)

EMBEDDINGS_KEPT = 4  # images whose embeddings stay for the draft (a draft reads an image right after the target)
CHUNKS_KEPT = 8  # images whose preprocessed chunks stay in memory (the others are preprocessed again when read)
IMAGE_BYTES_KEPT = 128 * 2**20  # image files kept to preprocess again; past this the least recently used are let go
PROBE_SIDE = 32  # pixels a side of the blank picture whose positions are the fewest an image of this projector takes


class MediaStore:
    """The images an engine's prompts hold, and how the target reads them (its `KVSequence.media`).

    Preprocessing (libmtmd decodes the file and resizes it) may run on any thread: a server does it in `prepare`, off
    the engine thread, before the request's job; the engine thread then finds the chunk ready. A lock keeps the
    chunks from being let go while the engine thread reads one, and `close` waits for a `prepare` in progress.

    Args:
        projector: the target's projector (llama/vision.py), owned by the engine.
    """

    def __init__(self, projector: Projector) -> None:
        self.projector = projector
        self._lock = threading.Condition()
        self._handles: dict[str, int] = {}  # image id (sha256) -> handle, never reused
        self._images: OrderedDict[int, Image] = OrderedDict()  # handle -> its file, to preprocess again (LRU by bytes)
        self._image_bytes = 0
        self._chunks: OrderedDict[int, tuple[Chunks, Chunk]] = OrderedDict()  # recent handles' chunks
        self._wrapped: dict[int, tuple[list[int], list[int], int]] = {}  # handle -> (before, after, n_pos)
        self._by_size: dict[tuple[int, int], int] = {}  # (width, height) -> positions: preprocessing reads the size
        self._fewest: int | None = None  # the positions of a small blank picture: what any image takes at least
        self._busy = 0  # preprocessings in progress (`close` waits for them)
        self._closed = False
        self._embedded: OrderedDict[int, np.ndarray] = OrderedDict()  # recent images' embeddings, for a draft
        self.keeps_embeddings = False  # a draft reads the target's image embeddings (`Embedded`): encode once for both

    @property
    def sees_images(self) -> bool:
        return self.projector.supports_vision

    @property
    def images_kept(self) -> int:
        """Bytes of image files kept to preprocess again (at most `IMAGE_BYTES_KEPT`, and the last image)."""
        return self._image_bytes

    def tokens(self, image: Image) -> list[int]:
        """The image as the target reads it: the model's own tokens before and after it (as mtmd writes them) around
        one id per position it takes."""
        handle = self._register(image)
        if handle not in self._wrapped:
            self._chunk(handle)
        before, after, n_pos = self._wrapped[handle]
        return [*before, *(-(handle * STRIDE + i) - 1 for i in range(n_pos)), *after]

    def prepare(self, images: Sequence[Image], room: int, stopped: Callable[[], bool] = lambda: False) -> bool:
        """Preprocess a prompt's `images` now, on the calling thread, so the engine thread reads them at once: the
        positions they take are counted before each is decoded — from the sizes seen before, and at least a small
        blank picture's — and they are refused as soon as they cannot fit.

        Args:
            images: the images of one prompt, in order.
            room: the positions the context holds (the prompt's text needs some too).
            stopped: asked between images; True stops (the client left, the server stops).

        Returns:
            True when every image is ready; False when `stopped` said stop first.

        Raises:
            ContextError: the images take `room` positions or more.
            LocalspecError: libmtmd could not decode one (its header was sound, its data is not).
        """
        fewest = self._fewest_positions()
        known = [self._positions(image) for image in images]
        for i, image in enumerate(images):
            need = sum(fewest if n is None else n for n in known)
            if need >= room:
                raise ContextError(
                    f"the {len(images)} images take {'' if None not in known else 'at least '}{need} positions and "
                    f"the context holds {room}: send fewer images, or smaller ones"
                )
            if stopped():
                return False
            handle = self._register(image)
            if handle not in self._chunks:
                self._chunk(handle)
            known[i] = self._positions(image)
        need = sum(n or 0 for n in known)
        if need >= room:
            raise ContextError(
                f"the {len(images)} images take {need} positions and the context holds {room}: send fewer images"
            )
        return True

    def _positions(self, image: Image) -> int | None:
        """What `tokens(image)` is long, where known without preprocessing it (None: not known yet)."""
        handle = self._handles.get(image.id)
        if handle is not None and handle in self._wrapped:
            before, after, n_pos = self._wrapped[handle]
            return len(before) + n_pos + len(after)
        return self._by_size.get((image.width, image.height))

    def _fewest_positions(self) -> int:
        """The positions a small blank picture takes (preprocessed once): no image of this projector takes fewer."""
        if self._fewest is None:
            chunks = self._preprocess(blank_image(PROBE_SIDE, PROBE_SIDE))
            self._fewest = sum(c.n_pos if c.kind != TEXT else len(c.tokens) for c in chunks)
            chunks.close()
        return self._fewest

    def _register(self, image: Image) -> int:
        """The image's handle (a new one for new content), its file kept to preprocess again (the least recently
        used files let go past `IMAGE_BYTES_KEPT`: a request that brings one again registers it again)."""
        with self._lock:
            handle = self._handles.get(image.id)
            if handle is None:
                handle = self._handles[image.id] = len(self._handles) + 1
            if handle in self._images:
                self._images.move_to_end(handle)
            else:
                self._images[handle] = image
                self._image_bytes += len(image.data)
            while self._image_bytes > IMAGE_BYTES_KEPT and len(self._images) > 1:
                self._image_bytes -= len(self._images.popitem(last=False)[1].data)
            return handle

    def _chunk(self, handle: int) -> Chunk:
        """The image's chunk, preprocessed again if it was let go."""
        with self._lock:
            if handle in self._chunks:
                self._chunks.move_to_end(handle)
                return self._chunks[handle][1]
            image = self._images.get(handle)
        if image is None:
            raise ContextError("an image this history holds is no longer kept: attach it again")
        chunks = self._preprocess(image)
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
        with self._lock:
            if handle in self._chunks:  # another thread preprocessed it meanwhile
                chunks.close()
                return self._chunks[handle][1]
            self._wrapped[handle] = (before, after, chunk.n_pos)
            self._by_size[image.width, image.height] = len(before) + chunk.n_pos + len(after)
            self._chunks[handle] = (chunks, chunk)
            while len(self._chunks) > CHUNKS_KEPT:
                self._chunks.popitem(last=False)[1][0].close()
        return chunk

    def _preprocess(self, image: Image) -> Chunks:
        """libmtmd's chunks of `image` alone (decoded and resized: the slow part, outside the lock)."""
        with self._lock:
            if self._closed:
                raise ContextError("the model was unloaded while its images were read: send the request again")
            self._busy += 1
        try:
            return self.projector.tokenize(media_marker(), [image])
        finally:
            with self._lock:
                self._busy -= 1
                self._lock.notify_all()

    def decode(self, ctx: Context, run: Sequence[int], n_past: int, *, draft: str = "") -> None:
        """Decode the image whose whole run is `run` into `ctx` at n_past (a `serve --parallel` slot: its sequence);
        `draft`: `ctx` is a draft's, which reads the target's embeddings of it ("embeddings", `Embedded`) or as many
        rows of zeros of its own width ("zeros", `ZeroRows`)."""
        handle = (-run[0] - 1) // STRIDE
        if handle not in self._wrapped:
            raise ContextError("an image this history holds is not in this engine: attach it again")
        if isinstance(ctx, SeqContext):  # a slot: its sequence of the shared context
            ctx.discard()  # rows a shared batch decoded for it: not these
            parent, seq = ctx.parent, ctx.seq
        else:
            parent, seq = cast(LlamaContext, ctx), 0
        while True:
            chunk = self._chunk(handle)
            with self._lock:  # the chunk is not let go while it is read
                if self._chunks.get(handle, (None, None))[1] is not chunk:
                    continue  # let go between the two lines: preprocess it again
                if len(run) != chunk.n_pos or -run[0] - 1 != handle * STRIDE:
                    raise ContextError(f"only part of an image ({len(run)} of {chunk.n_pos} positions) was to be read")
                if n_past + chunk.n_pos > ctx.n_ctx:
                    raise ContextError(
                        f"the image takes {chunk.n_pos} positions and the context has room for "
                        f"{max(ctx.n_ctx - n_past, 0)} more (n_ctx {ctx.n_ctx}): start a new chat, or raise --n-ctx"
                    )
                rows: np.ndarray | None = None  # None: the target encodes and reads it in one call
                if draft == "zeros":
                    rows = np.zeros((chunk.n_tokens, input_width(parent.model)), np.float32)  # (n_tokens, its width)
                elif draft or self.keeps_embeddings:
                    rows = self._embeddings(handle, chunk)
                self.projector.eval_image(parent, chunk, n_past, seq=seq, embeddings=rows)
                return

    def _embeddings(self, handle: int, chunk: Chunk) -> np.ndarray:
        """The image's embeddings: kept from the target's read (or the draft's), else encoded now (under the lock)."""
        if handle in self._embedded:
            self._embedded.move_to_end(handle)
            return self._embedded[handle]
        rows = self._embedded[handle] = self.projector.encode(chunk)  # (n_tokens, width)
        while len(self._embedded) > EMBEDDINGS_KEPT:
            self._embedded.popitem(last=False)
        return rows

    def close(self) -> None:
        """Free the chunks kept, once a `prepare` in progress has ended (the projector is the engine's)."""
        with self._lock:
            self._closed = True
            self._lock.wait_for(lambda: self._busy == 0)
            for chunks, _ in self._chunks.values():
                chunks.close()
            self._chunks.clear()
            self._embedded.clear()
            self._images.clear()
            self._image_bytes = 0


class Embedded:
    """How a draft whose input width is the target's reads an image: the target's own embeddings of it, encoded once
    for both (llama-server's way; `Projector.feeds`), so it drafts after a picture as after text."""

    def __init__(self, store: MediaStore) -> None:
        self.store = store
        store.keeps_embeddings = True

    def decode(self, ctx: Context, run: Sequence[int], n_past: int) -> None:
        self.store.decode(ctx, run, n_past, draft="embeddings")


class ZeroRows:
    """How a draft of another width reads an image: as many rows of zeros of its own width at the image's positions
    (one position per row: not M-RoPE). It drafts a little better after a picture than a blank of spaces (measured
    on the tiny trio, k = 2, T 0: 14 % accepted against 11 %; the target's own embeddings: 74 %)."""

    def __init__(self, store: MediaStore) -> None:
        self.store = store

    def decode(self, ctx: Context, run: Sequence[int], n_past: int) -> None:
        self.store.decode(ctx, run, n_past, draft="zeros")


class Filler:
    """How a draft reads an image's run: as many copies of one plain token (`token`), so its history stays as long as
    the target's and its positions line up (DESIGN §11)."""

    def __init__(self, token: int) -> None:
        self.token = token

    def decode(self, ctx: Context, run: Sequence[int], n_past: int) -> None:
        ctx.decode([self.token] * len(run), n_past, outputs=0)
