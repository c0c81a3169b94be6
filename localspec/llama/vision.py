"""Images into the target's KV: the projector (an mmproj GGUF opened through llama.cpp's mtmd), checked image bytes,
a prompt with media markers cut into chunks, and one image chunk evaluated at a given n_past.

Native code never sees an unchecked input: an image's header is read here first (format, size, a cut-off file), and
an untrusted projector is opened in a child process before this one (a projector missing a tensor loads, then crashes
the process at its first encode: DESIGN §11), the way the canary probes kernels. The core owns the text tokens and
n_past; it decodes text chunks itself and hands only image chunks here. An image chunk takes `n_pos` positions,
which differ from its `n_tokens` on M-RoPE models: n_past follows positions.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import re
import signal
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from ctypes import byref
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import llama_cpp
import numpy as np

from localspec.errors import ContextError, LocalspecError, ModelFileError

from .context import Context
from .footprint import read_header
from .log import LlamaLog, init
from .model import Model, check_gguf_file
from .threads import physical_cores

log = logging.getLogger(__name__)

MAX_PIXELS = 50_000_000  # read from the header before decoding: a 20000×20000 PNG is refused, never allocated
PROBE_TIMEOUT = 120.0  # seconds for the child that opens a projector first
PROBE_OK = "ok"  # the child's stdout on success: "ok <vision 0|1> <audio 0|1>"
TEXT, IMAGE, AUDIO = "text", "image", "audio"  # a chunk's kind
_KINDS = {0: TEXT, 1: IMAGE, 2: AUDIO}  # mtmd_input_chunk_type
_MISMATCH = re.compile(r"text model \(n_embd = (\d+)\) and mmproj \(n_embd = (\d+)\)")
_MISSING = re.compile(r"unable to find tensor (\S+)")


# --- the native library -------------------------------------------------------------------------------------


class _MtmdLog(LlamaLog):
    """mtmd's log lines into the `llama.cpp` channel, its INFO lines (one per tensor loaded) as DEBUG; its own last
    errors, so a refused projector is explained by mtmd's words and not by an older llama.cpp line."""

    def _on_log(self, level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        super()._on_log(1 if level == 2 else level, text, user_data)  # ggml_log_level: 1 DEBUG, 2 INFO


@functools.cache
def _mtmd() -> tuple[ModuleType, _MtmdLog]:
    """llama-cpp-python's mtmd binding (libmtmd) and its log bridge, loaded once per process on first use."""
    init()
    try:
        from llama_cpp import mtmd_cpp
    except (ImportError, OSError) as e:  # a llama-cpp-python built without libmtmd
        raise LocalspecError(f"this llama-cpp-python has no libmtmd, so it cannot read images ({e})") from None
    bridge = _MtmdLog()
    mtmd_cpp.mtmd_log_set(bridge.callback, ctypes.c_void_p(0))
    mtmd_cpp.mtmd_helper_log_set(bridge.callback, ctypes.c_void_p(0))
    return mtmd_cpp, bridge


def media_marker() -> str:
    """The text that stands for one image (or audio clip) in a prompt given to `Projector.tokenize`: `<__media__>`."""
    return _mtmd()[0].mtmd_default_marker().decode()


def _mtmd_error() -> str:
    """mtmd's first error since the last call (then forgotten), its first line, without the functions it passed
    through ("mismatch between text model (n_embd = 64) and mmproj (n_embd = 48)", then a hint on a line of its own)."""
    bridge = _mtmd()[1]
    detail = bridge.last_error()
    bridge.recent_errors.clear()
    return detail.strip().splitlines()[0] if detail.strip() else ""


# --- images -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Image:
    """Image bytes whose header was read and checked: a format libmtmd decodes, its size, and its content hash."""

    data: bytes = field(repr=False)
    format: str  # "png", "jpeg", "gif" or "bmp"
    width: int
    height: int
    id: str  # sha256 of `data`, hex: the bitmap's id in mtmd, and what caches key an image chunk by


def read_image(data: bytes, *, name: str = "the image", max_pixels: int = MAX_PIXELS) -> Image:
    """Check image bytes before native code decodes them: the format, the size in the header, a file cut short.

    Args:
        data: the file's bytes.
        name: how the messages call it (a file name).
        max_pixels: the most pixels (width × height, as the header says) accepted.

    Returns:
        The checked image, with its content hash.

    Raises:
        LocalspecError: not an image, a format libmtmd does not read, a damaged or cut-off file, or too many pixels;
            one line that says what to do.
    """
    data = bytes(data)
    kind = _sniff(data)
    if kind not in _HEADERS:
        what = f"a {kind} image" if kind else "not an image libmtmd reads (PNG, JPEG, GIF or BMP)"
        raise LocalspecError(f"{name} is {what}: convert it to PNG or JPEG")
    try:
        width, height = _HEADERS[kind](data)
    except (struct.error, ValueError, IndexError) as e:
        raise LocalspecError(
            f"{name} is a damaged or cut-off {kind.upper()} file ({e}): save or download it again"
        ) from None
    if width <= 0 or height <= 0:
        raise LocalspecError(f"{name} says it is {width}×{height} pixels: a damaged {kind.upper()} file")
    if width * height > max_pixels:
        raise LocalspecError(
            f"{name} is {width}×{height} pixels ({width * height / 1e6:.0f} megapixels), more than the "
            f"{max_pixels / 1e6:.0f} allowed: scale it down first"
        )
    return Image(data, kind, width, height, hashlib.sha256(data).hexdigest())


# A FIFO's open must not wait for a writer, nor a terminal's make it ours (the flags a platform lacks are left out).
_OPEN_FLAGS = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
_READ_CHUNK = 2**20  # bytes a file is read by
_NOT_FILES = (  # what a path may name besides a file and a folder, as the refusal says it
    (stat.S_ISFIFO, "a FIFO (a named pipe)"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a disk device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_image_file(path: Path, cap: int, *, timeout: float | None = None) -> bytes:
    """The bytes of the regular file at `path` (the chat's attachments, `--image`, a server's `--allow-image-urls`
    path), refused when it holds more than `cap`, read without ever waiting on what is not a file: a device, a FIFO
    or a socket is refused from its `stat` (never opened); the file is opened non-blocking (a FIFO put there since
    cannot hold the open), checked again on the descriptor, and read to at most `cap` + 1 bytes (a file that grew
    meanwhile is refused, not read to its end) within `timeout` seconds (None: no bound).

    Raises:
        LocalspecError: one line naming the path and what it is, or why it cannot be read.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        _refuse_unless_regular(path, os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
        try:
            status = os.fstat(fd)
            _refuse_unless_regular(path, status.st_mode)
            if status.st_size > cap:
                raise LocalspecError(_too_large(path, cap, status.st_size))
            data = bytearray()
            while len(data) <= cap and (chunk := os.read(fd, min(_READ_CHUNK, cap + 1 - len(data)))):
                data += chunk
                if deadline is not None and time.monotonic() > deadline:
                    raise LocalspecError(f"reading {path} took over {timeout:g} s: copy it to a local disk first")
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise LocalspecError(f"no such file: {path}") from None
    except OSError as e:
        raise LocalspecError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError:  # a NUL character in the path
        raise LocalspecError("that path holds a NUL character: choose an image file") from None
    if len(data) > cap:
        raise LocalspecError(_too_large(path, cap))  # it grew while it was read
    return bytes(data)


def human_size(n: int) -> str:
    """A byte count as people read it: 812 B, 4.2 kB, 3.1 MB."""
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} kB"
    return f"{n / 1_000_000:.1f} MB"


def _too_large(path: Path, cap: int, size: int | None = None) -> str:
    holds = f"is {human_size(size)}," if size is not None else "holds"
    return f"{path.name} {holds} more than the {human_size(cap)} an image may be: scale it down first"


def _refuse_unless_regular(path: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise LocalspecError(f"{path} is a folder: choose an image file in it")
    what = next((kind for test, kind in _NOT_FILES if test(mode)), "something else")
    raise LocalspecError(f"{path} is {what}, not a file: choose an image file")


def blank_image(width: int, height: int) -> Image:
    """A mid-grey picture of `width`×`height` pixels (a 24-bit BMP made here): what a projector's fewest positions
    are measured on."""
    stride = (width * 3 + 3) & ~3
    rows = b"\x80" * (stride * height)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(rows), 2835, 2835, 0, 0)
    head = b"BM" + struct.pack("<IHHI", 14 + len(info) + len(rows), 0, 0, 14 + len(info))
    return read_image(head + info + rows, name="a blank picture")


def _sniff(data: bytes) -> str:
    """The format the first bytes name ("" when none is recognised)."""
    signatures = {
        b"\x89PNG\r\n\x1a\n": "png",
        b"\xff\xd8\xff": "jpeg",
        b"GIF87a": "gif",
        b"GIF89a": "gif",
        b"BM": "bmp",
        b"II*\x00": "TIFF",
        b"MM\x00*": "TIFF",
        b"8BPS": "PSD",
        b"\x00\x00\x00\x0cjP  ": "JPEG 2000",
    }
    for magic, kind in signatures.items():
        if data.startswith(magic):
            return kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP"
    if data[4:8] == b"ftyp":
        brand = data[8:12]
        return "AVIF" if brand in (b"avif", b"avis") else "HEIC" if brand.startswith((b"hei", b"mif")) else ""
    return ""


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height from IHDR, after walking the chunks to IEND (a file cut short ends before it)."""
    if data[12:16] != b"IHDR":
        raise ValueError("no IHDR chunk first")
    width, height = struct.unpack(">II", data[16:24])
    at = 8
    while True:
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind = data[at + 4 : at + 8]
        at += 12 + length  # length, type, data, CRC
        if at > len(data):
            name = kind.decode("latin-1") if kind.isalpha() else "last"
            raise ValueError(f"its {name} chunk ends past the file's end")
        if kind == b"IEND":
            return width, height


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """Width and height from the first start-of-frame segment; the end-of-image marker must come after it."""
    at = 2
    while True:
        while data[at] != 0xFF or data[at + 1] == 0xFF:  # fill bytes before a marker
            at += 1
        marker = data[at + 1]
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # SOFn (not DHT, JPG, DAC)
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            if data.rfind(b"\xff\xd9") < at:
                raise ValueError("no end-of-image marker")
            return width, height
        if marker == 0xDA:  # scan data before any frame header
            raise ValueError("no frame header")
        at += 2 + length
        if at >= len(data):
            raise ValueError("no frame header before the file's end")


def _gif_size(data: bytes) -> tuple[int, int]:
    """The logical screen's width and height; the file must end with the GIF trailer."""
    if len(data) < 14 or data.rstrip(b"\x00")[-1:] != b";":
        raise ValueError("no GIF trailer at the end")
    return struct.unpack("<HH", data[6:10])


def _bmp_size(data: bytes) -> tuple[int, int]:
    """Width and height from the DIB header; the file must hold the size its header declares, and an uncompressed
    one every row of pixels its size and depth need (a cut file would otherwise read as black)."""
    declared, _, _, offset, header = struct.unpack("<IHHII", data[2:18])
    if header == 12:  # BITMAPCOREHEADER: 16-bit sizes
        width, height = struct.unpack("<HH", data[18:22])
        (bits,), compression = struct.unpack("<H", data[24:26]), 0
    else:
        width, height, _, bits, compression = struct.unpack("<iiHHI", data[18:34])
    if offset >= len(data) or (declared and declared > len(data)):
        raise ValueError(f"{len(data)} bytes where the header declares {max(declared, offset + 1)}")
    if compression in (0, 3, 6) and bits:  # BI_RGB, BI_BITFIELDS, BI_ALPHABITFIELDS: rows of a known size
        need = offset + (width * bits + 31) // 32 * 4 * abs(height)
        if need > len(data):
            raise ValueError(f"{len(data)} bytes where {abs(height)} rows of {width} pixels need {need}")
    return width, abs(height)  # a negative height: rows stored top-down


_HEADERS = {"png": _png_size, "jpeg": _jpeg_size, "gif": _gif_size, "bmp": _bmp_size}


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


@dataclass(frozen=True, slots=True)
class Probe:
    """What the child saw opening a projector beside a target: `failure` is "" when it opened."""

    failure: str = ""
    vision: bool = False
    audio: bool = False


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
        _check_projector_file(self.path)
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
            raise ModelFileError(_refusal(self.path, target.path, _mtmd_error()))
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
        return int(llama_cpp.llama_model_n_embd_inp(self.target.handle))

    def feeds(self, model: Model) -> bool:
        """Whether `model` (a draft) can read this projector's image embeddings as they are: the same input width and
        one position per embedding (not M-RoPE), llama-server's condition for handing them to its draft."""
        return not self.uses_mrope and int(llama_cpp.llama_model_n_embd_inp(model.handle)) == self.width

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
            assert embeddings.shape == (chunk.n_tokens, self.width) and embeddings.dtype == np.float32
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


def _check_projector_file(path: Path) -> None:
    """Refuse, in one line, a file that is no GGUF, no projector, or cut short, before a child or mtmd reads it."""
    check_gguf_file(path)
    header = read_header(path)
    if header.arch != "clip":
        raise ModelFileError(
            f"{path} is not a projector (its architecture is {header.arch}): give the mmproj-*.gguf file "
            "published beside the model"
        )
    if header.data_end > header.file_size:
        raise ModelFileError(f"{path} is truncated (its tensors end past the file's end): re-download it")


def _refusal(path: Path, target: Path, detail: str) -> str:
    """The one-line message for a projector mtmd refused to open beside `target`, from mtmd's own error."""
    if found := _MISMATCH.search(detail):
        model_embd, projector_embd = found.groups()
        return (
            f"{path} does not match target {target.name} (its output size {projector_embd} ≠ the model's n_embd "
            f"{model_embd}): use the mmproj file published with {target.name}"
        )
    if found := _MISSING.search(detail):
        return f"{path} lacks the tensor {found.group(1)}: the file is incomplete or damaged — re-download it"
    why = f" (mtmd: {detail})" if detail else ""
    return f"could not open the projector {path} beside {target.name}{why}: use the mmproj file published with it"


# --- the probe: a projector opened in a child process first -------------------------------------------------


def probe_projector(path: Path, target: Path, *, timeout: float = PROBE_TIMEOUT) -> Probe:
    """Open projector `path` beside the model file `target` in a child process, with mtmd's warm-up (which builds
    the encoder's graph: where a projector missing a tensor crashes). Remembered per file, size, mtime and target for
    the life of this process, so a second open is instant."""
    stat = Path(path).stat()
    return _probe(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns, str(Path(target).resolve()), timeout)


@functools.lru_cache(maxsize=64)
def _probe(path: str, _size: int, _mtime_ns: int, target: str, timeout: float) -> Probe:
    try:
        child = subprocess.run(
            [sys.executable, "-m", "localspec.llama.vision", "--probe", path, target],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return Probe(
            f"opening the projector {path} beside {Path(target).name} took over {timeout:.0f} s: re-download it"
        )
    words = child.stdout.split()
    if child.returncode == 0 and words[:1] == [PROBE_OK]:
        return Probe("", vision=words[1:2] == ["1"], audio=words[2:3] == ["1"])
    if child.returncode < 0:
        try:
            how = signal.Signals(-child.returncode).name
        except ValueError:
            how = f"signal {-child.returncode}"
        log.info("the projector probe of %s died (%s): %s", path, how, child.stderr[-2000:])
        return Probe(
            f"the projector {path} crashed llama.cpp ({how}) when opened beside {Path(target).name}: it is damaged "
            "or lacks a tensor — re-download it, or use the mmproj file published with the model"
        )
    lines = child.stderr.strip().splitlines()
    return Probe(lines[-1] if lines else f"the projector probe of {path} ended with code {child.returncode}")


def _probe_child(path: str, target: str) -> int:
    """The child's side: load the target's weights (memory-mapped, on the CPU, not repacked), open the projector
    with warm-up; print "ok <vision> <audio>" and exit 0, or the reason on stderr and exit 3."""
    import faulthandler

    faulthandler.enable(all_threads=True)
    mtmd, _ = _mtmd()
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    params.use_extra_bufts = False  # repacking reads every weight; the projector needs the model's sizes only
    model = llama_cpp.llama_model_load_from_file(os.fsencode(target), params)
    if not model:
        print(f"could not load {target} to try its projector beside it", file=sys.stderr)
        return 3
    ctx_params = mtmd.mtmd_context_params_default()
    ctx_params.use_gpu = False
    ctx_params.print_timings = False
    ctx_params.n_threads = 1
    ctx_params.warmup = True
    _mtmd_error()
    handle = mtmd.mtmd_init_from_file(os.fsencode(path), model, ctx_params)
    if not handle:
        print(_refusal(Path(path), Path(target), _mtmd_error()), file=sys.stderr)
        return 3
    print(PROBE_OK, int(mtmd.mtmd_support_vision(handle)), int(mtmd.mtmd_support_audio(handle)), flush=True)
    mtmd.mtmd_free(handle)
    llama_cpp.llama_model_free(model)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m localspec.llama.vision --probe MMPROJ TARGET`: the probe's child (see `probe_projector`)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] != "--probe":
        print("usage: python -m localspec.llama.vision --probe MMPROJ TARGET", file=sys.stderr)
        return 2
    return _probe_child(argv[1], argv[2])


if __name__ == "__main__":
    sys.exit(main())
