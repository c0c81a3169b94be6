"""Image files checked before native code sees a byte: `Image` (bytes whose header was read: the format libmtmd decodes,
the size, the content hash), `read_image` (a format not read, a file cut short, too many pixels: one line each),
`read_image_file` (a regular file only, never waited on, to a byte cap: the chat's attachments, `--image`, a server's
`--allow-image-urls` paths) and `blank_image`. No native code here: llama/vision.py hands these to libmtmd.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from localspec.errors import LocalspecError

MAX_PIXELS = 50_000_000  # read from the header before decoding: a 20000×20000 PNG is refused, never allocated


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
