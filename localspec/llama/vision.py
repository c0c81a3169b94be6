"""Images into the target's KV: the projector (an mmproj GGUF opened through llama.cpp's mtmd), a prompt with media
markers cut into chunks, one image chunk encoded, and its embeddings decoded at a given n_past (into the target, or a
draft of the same width).

Native code never sees an unchecked input: an image's header is read first (llama/pictures.py: format, size, a
cut-off file), and
an untrusted projector is opened in a child process before this one (a projector missing a tensor loads, then crashes
the process at its first encode: DESIGN §11), the way the canary probes kernels. The core owns the text tokens and
n_past; it decodes text chunks itself and hands only image chunks here. An image chunk takes `n_pos` positions,
which differ from its `n_tokens` on M-RoPE models: n_past follows positions.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Iterator, Sequence
from ctypes import byref
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
import numpy as np

from localspec.errors import ContextError, LocalspecError, ModelFileError

from .context import Context
from .model import Model
from .mtmd import media_marker
from .mtmd import mtmd_error as _mtmd_error
from .mtmd import native as _mtmd
from .pictures import Image
from .projector_probe import check_projector_file, probe_projector, refusal
from .threads import physical_cores

log = logging.getLogger(__name__)

TEXT, IMAGE, AUDIO = "text", "image", "audio"  # a chunk's kind
_KINDS = {0: TEXT, 1: IMAGE, 2: AUDIO}  # mtmd_input_chunk_type


# --- chunks -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of a tokenized prompt: text tokens, or one image's (or audio clip's) embeddings."""

    kind: str  # TEXT, IMAGE or AUDIO
    tokens: tuple[int, ...]  # a text chunk's token ids; () for media
    n_tokens: int  # KV cells it fills
    n_pos: int  # positions it takes (≠ n_tokens on M-RoPE models): n_past after it is n_past + n_pos
    id: str  # the image's id (`Image.id`), "" for text
    index: int  # its place in `owner`
    owner: Chunks = field(repr=False, compare=False)


class Chunks:
    """The chunks of one prompt (`Projector.tokenize`), owning mtmd's list of them. Use as a context manager or call
    `close()`; a chunk read from it is valid until then."""

    def __init__(self, native: int) -> None:
        """Take over mtmd's list `native` (the caller frees it if this raises)."""
        mtmd = _mtmd()[0]
        self._native: int | None = native
        try:
            self._items = [self._read(i) for i in range(mtmd.mtmd_input_chunks_size(native))]
        except BaseException:
            self._native = None
            raise

    def _read(self, i: int) -> Chunk:
        mtmd = _mtmd()[0]
        chunk = self.native_chunk(i)
        kind = _KINDS.get(mtmd.mtmd_input_chunk_get_type(chunk), "unknown")
        tokens: tuple[int, ...] = ()
        if kind == TEXT:
            n = ctypes.c_size_t(0)
            ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            tokens = tuple(ids[: n.value]) if n.value else ()
        raw_id = mtmd.mtmd_input_chunk_get_id(chunk) if kind != TEXT else None
        return Chunk(
            kind=kind,
            tokens=tokens,
            n_tokens=int(mtmd.mtmd_input_chunk_get_n_tokens(chunk)),
            n_pos=int(mtmd.mtmd_input_chunk_get_n_pos(chunk)),
            id=raw_id.decode() if raw_id else "",
            index=i,
            owner=self,
        )

    def native_chunk(self, i: int) -> int:
        """mtmd's pointer to chunk `i` (valid while this list is open)."""
        if self._native is None:
            raise RuntimeError("the chunks are closed")
        return _mtmd()[0].mtmd_input_chunks_get(self._native, i)

    @property
    def n_tokens(self) -> int:
        return sum(c.n_tokens for c in self._items)

    @property
    def n_pos(self) -> int:
        return sum(c.n_pos for c in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Chunk]:
        return iter(self._items)

    def __getitem__(self, i: int) -> Chunk:
        return self._items[i]

    def close(self) -> None:
        """Free mtmd's list (idempotent)."""
        if getattr(self, "_native", None) is not None:
            _mtmd()[0].mtmd_input_chunks_free(self._native)
            self._native = None

    def __enter__(self) -> Chunks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


# --- the projector ------------------------------------------------------------------------------------------


class Projector:
    """An mmproj GGUF opened through mtmd beside a loaded target. Use as a context manager or call `close()`."""

    def __init__(
        self,
        path: str | os.PathLike,
        target: Model,
        *,
        n_threads: int | None = None,
        use_gpu: bool | None = None,
        warmup: bool = True,
        probe: bool = True,
    ) -> None:
        """Open `path` for `target`, first in a child process (`probe`) unless this file was probed before.

        Args:
            path: the projector (an mmproj-*.gguf file made for the target).
            target: the loaded text model whose KV the images go into.
            n_threads: CPU threads for the encoder; None = physical cores.
            use_gpu: encode on a GPU; None = where the target's layers are (`Model.on_local_gpu`).
            warmup: let mtmd build the encoder's graph once at start (its memory is then reserved up front).
            probe: open it in a child process first; False only for a file already known to be sound.

        Raises:
            ModelFileError: not a projector, damaged, crashed llama.cpp in the child, or not made for `target`.
            LocalspecError: this llama-cpp-python has no libmtmd.
        """
        mtmd, _ = _mtmd()
        self.path, self.target = Path(path), target
        self._handle = None
        check_projector_file(self.path)
        if probe:
            found = probe_projector(self.path, target.path)
            if found.failure:
                raise ModelFileError(found.failure)
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = target.on_local_gpu if use_gpu is None else use_gpu
        params.print_timings = False
        params.n_threads = n_threads or physical_cores()
        params.warmup = warmup
        _mtmd_error()  # what mtmd logs from here on explains a refusal
        handle = target._call(mtmd.mtmd_init_from_file, os.fsencode(self.path), target.handle, params)
        if not handle:
            raise ModelFileError(refusal(self.path, target.path, _mtmd_error()))
        self._handle = handle
        self.supports_vision = bool(mtmd.mtmd_support_vision(handle))
        self.supports_audio = bool(mtmd.mtmd_support_audio(handle))
        self.uses_mrope = bool(mtmd.mtmd_decode_use_mrope(handle))  # positions are (t, x, y), not one per token

    @property
    def handle(self):
        if self._handle is None:
            raise RuntimeError("projector is closed")
        return self._handle

    def close(self) -> None:
        """Free mtmd's context now (idempotent)."""
        if getattr(self, "_handle", None) is not None:
            placement = self.target.placement
            if placement is None or not placement.lost:
                self.target._call(_mtmd()[0].mtmd_free, self._handle)
            self._handle = None

    def __enter__(self) -> Projector:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def tokenize(
        self, text: str, images: Sequence[Image], *, add_special: bool = False, parse_special: bool = True
    ) -> Chunks:
        """Cut a prompt into text and image chunks: each `media_marker()` in `text` is the next of `images`.

        Args:
            text: the prompt (the chat template's output, markers where the images go).
            images: checked images (`read_image`), as many as markers.
            add_special: add BOS as the target is configured to.
            parse_special: turn template markup (`<|im_start|>`) into control tokens.

        Returns:
            The chunks; close them (or use `with`) when done.

        Raises:
            LocalspecError: the markers and images differ in number, or libmtmd could not decode an image.
        """
        mtmd, _ = _mtmd()
        if not self.supports_vision and images:
            raise LocalspecError(f"{self.path.name} reads no images (it is an audio projector): choose a vision one")
        n_markers = text.count(media_marker())
        if n_markers != len(images):
            raise LocalspecError(f"the prompt has {n_markers} image markers for {len(images)} images")
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * max(len(images), 1))()
        native = mtmd.mtmd_input_chunks_init()
        try:
            for i, image in enumerate(images):
                bitmaps[i] = self._bitmap(image)
            data = text.encode("utf-8", errors="replace")
            prompt = mtmd.mtmd_input_text(data, len(data), add_special, parse_special)
            rc = mtmd.mtmd_tokenize(self.handle, native, ctypes.byref(prompt), bitmaps, len(images))
            if rc != 0:
                why = {1: "the markers and images differ in number", 2: "an image could not be preprocessed"}
                raise LocalspecError(f"mtmd could not tokenize the prompt: {why.get(rc, f'code {rc}')}")
            chunks, native = Chunks(native), None
            return chunks
        finally:
            for bitmap in bitmaps:
                if bitmap:  # mtmd_tokenize copied what it needs into the chunks
                    mtmd.mtmd_bitmap_free(bitmap)
            if native is not None:
                mtmd.mtmd_input_chunks_free(native)

    def _bitmap(self, image: Image) -> int:
        """A native bitmap of `image`, decoded by libmtmd, its id set to the content hash; the caller frees it."""
        mtmd, _ = _mtmd()
        buf = (ctypes.c_uint8 * len(image.data)).from_buffer_copy(image.data)
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.handle, buf, len(image.data), False)
        if not bitmap:
            raise LocalspecError(
                f"libmtmd could not decode the {image.format.upper()} image {image.id[:12]} "
                f"({image.width}×{image.height}): save it again as PNG"
            )
        mtmd.mtmd_bitmap_set_id(bitmap, image.id.encode())
        return bitmap

    @property
    def width(self) -> int:
        """The width of the embeddings the projector writes: its target's input width."""
        return input_width(self.target)

    def feeds(self, model: Model) -> bool:
        """Whether `model` (a draft) can read this projector's image embeddings as they are: the same input width and
        one position per embedding (not M-RoPE), llama-server's condition for handing them to its draft."""
        return not self.uses_mrope and input_width(model) == self.width

    def encode(self, chunk: Chunk) -> np.ndarray:
        """The embeddings of a media chunk, encoded now: (n_tokens, width) float32, a copy of mtmd's buffer.

        Raises:
            ContextError: the encoder failed.
        """
        mtmd, _ = _mtmd()
        assert chunk.kind != TEXT, "text chunks are decoded as tokens (Context.decode)"
        _mtmd_error()
        rc = self.target._call(mtmd.mtmd_encode_chunk, self.handle, chunk.owner.native_chunk(chunk.index))
        if rc != 0:
            detail = _mtmd_error()
            raise ContextError(
                f"llama.cpp could not encode the {chunk.kind} (code {rc}{': ' + detail if detail else ''})"
            )
        out = mtmd.mtmd_get_output_embd(self.handle)
        return np.ctypeslib.as_array(out, shape=(chunk.n_tokens, self.width)).copy()  # (n_tokens, width)

    def eval_image(
        self, ctx: Context, chunk: Chunk, n_past: int, *, seq: int = 0, embeddings: np.ndarray | None = None
    ) -> int:
        """Encode an image (or audio) chunk and decode its embeddings into `ctx`'s KV at positions n_past… of
        sequence `seq`. mtmd asks no logits of these rows: the next token's come from the text decoded after it
        (a chat turn always has some, the end of the user's turn).

        Args:
            ctx: a context of this projector's target, or of a model it `feeds` (with `embeddings`).
            chunk: a media chunk of open `Chunks` from `tokenize`.
            n_past: the position the chunk starts at.
            seq: the sequence it goes into.
            embeddings: the chunk's embeddings from `encode`, decoded as they are (None: encoded here).

        Returns:
            n_past after the chunk: n_past + chunk.n_pos.

        Raises:
            ContextError: no room for it in the context, a batch smaller than the image, or the decode failed.
        """
        mtmd, _ = _mtmd()
        assert chunk.kind != TEXT, "text chunks are decoded as tokens (Context.decode)"
        assert ctx.model is self.target or embeddings is not None, "another model reads embeddings encoded before"
        assert 0 <= seq < ctx.n_seq
        if n_past + max(chunk.n_pos, chunk.n_tokens) > ctx.n_ctx:
            raise ContextError(
                f"the {chunk.kind} takes {chunk.n_tokens} tokens and the context has room for "
                f"{max(ctx.n_ctx - n_past, 0)} more (n_ctx {ctx.n_ctx}): start a new chat, or raise --n-ctx"
            )
        if chunk.n_tokens > ctx.n_batch:  # some encoders' rows attend to each other: one batch for the whole image
            raise ContextError(
                f"the {chunk.kind} takes {chunk.n_tokens} tokens, more than the context's batch of {ctx.n_batch}: "
                f"raise --n-batch to {chunk.n_tokens} or more"
            )
        new_n_past = llama_cpp.llama_pos(0)
        _mtmd_error()
        t0 = time.perf_counter()
        native = chunk.owner.native_chunk(chunk.index)
        if embeddings is None:
            single = mtmd.mtmd_helper_eval_chunk_single  # False: mtmd asks no logits of media rows
            rc = ctx._call(single, self.handle, ctx.handle, native, n_past, seq, ctx.n_batch, False, byref(new_n_past))
        else:
            assert embeddings.shape == (chunk.n_tokens, input_width(ctx.model)) and embeddings.dtype == np.float32
            rows = embeddings.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            no_callback = mtmd.mtmd_helper_post_decode_callback()  # a NULL function pointer
            decode = mtmd.mtmd_helper_decode_image_chunk
            rc = ctx._call(
                decode, self.handle, ctx.handle, native, rows, n_past, seq, ctx.n_batch, byref(new_n_past), no_callback,
                None,
            )  # fmt: skip
        ctx.seconds_decoding += time.perf_counter() - t0
        ctx.decodes += 1
        if rc != 0:
            detail = _mtmd_error()
            raise ContextError(
                f"llama.cpp could not read the {chunk.kind} (code {rc}{': ' + detail if detail else ''})"
            )
        return int(new_n_past.value)

    def eval_chunks(self, ctx: Context, chunks: Chunks, n_past: int = 0, *, seq: int = 0) -> int:
        """Decode every chunk in order, text through `ctx.decode` (the last text row's logits computed) and media
        through `eval_image`: the core's path, in one call.

        Returns:
            n_past after the last chunk.

        Raises:
            ContextError: as `eval_image` and `Context.decode`.
        """
        last_text = max((c.index for c in chunks if c.kind == TEXT), default=-1)
        for chunk in chunks:
            if chunk.kind == TEXT:
                ctx.decode(list(chunk.tokens), n_past, outputs=int(chunk.index == last_text), seq=seq)
                n_past += len(chunk.tokens)
            else:
                n_past = self.eval_image(ctx, chunk, n_past, seq=seq)
        return n_past


def input_width(model: Model) -> int:
    """The width of the rows `model` reads as input embeddings (an image's rows, as mtmd decodes them)."""
    return int(llama_cpp.llama_model_n_embd_inp(model.handle))
