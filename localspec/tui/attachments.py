"""Images attached to a message, without Textual: read from a path (typed, pasted or dropped) or the clipboard, checked.

A terminal pastes a dropped file as its path — quoted, as a `file://` URL, or with its spaces escaped — so a paste
that names existing image files (by their suffix) is read as attachments instead of text. Only a regular file is
read, to the size cap at most (a device, a FIFO or a folder is one line, never opened or waited on), and every file
goes through `read_image` (the format, the size in the header, a cut-off file: one line each) before anything keeps
it; the clipboard is read through the system's own tool (`wl-paste`, `xclip`, `pngpaste`), to the same cap, one line
where there is none.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from localspec.errors import LocalspecError
from localspec.llama.pictures import Image, human_size, read_image, read_image_file

# Files a paste is taken for images by: what read_image reads, and formats it refuses in one line (so a dropped
# WebP says "convert it" instead of being typed as a path).
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".heic", ".avif"})
MAX_FILE_BYTES = 64 * 2**20  # a larger file is refused before it is read (the pixel cap is read_image's)
READ_CHUNK = 2**20  # bytes the clipboard tool's output is read by
CLIPBOARD_TIMEOUT = 5.0  # seconds the clipboard tool may take
NO_CLIPBOARD = (
    "no tool here reads an image from the clipboard: install wl-clipboard (Wayland), xclip (X11) or pngpaste (macOS), "
    "or attach the file by its path (Ctrl+O)"
)


@dataclass(frozen=True, slots=True)
class Attachment:
    """An image the user attached: the file name it came as (for the chip, the search and the export) and the
    checked image."""

    name: str
    image: Image

    def chip(self) -> str:
        """The image as one line: its name, pixels and bytes (drawn through `terminal_safe`: the name is a file's)."""
        return f"{self.name} · {self.image.width}x{self.image.height} · {human_size(len(self.image.data))}"


def read_attachment(path: str | Path) -> Attachment:
    """Read and check the image file at `path` (`~` expanded). It may block on a slow disk: call it in a thread.

    Raises:
        LocalspecError: no such file, not a regular file (a folder, a device, a FIFO…), too large, unreadable, or
            not an image read_image accepts (one line).
    """
    path = Path(path).expanduser()
    data = read_image_file(path, MAX_FILE_BYTES)
    return Attachment(path.name, read_image(data, name=path.name))


def pasted_paths(text: str) -> list[Path] | None:
    """The image files a paste names (a dropped file: a path, quoted, as a `file://` URL or with escaped spaces;
    several dropped at once are several), or None when it is text to type: not one line, or a word that is not an
    existing file with an image's suffix."""
    text = text.strip()
    if not text or "\n" in text:
        return None
    try:
        words = shlex.split(text)
    except ValueError:  # an unbalanced quote: text
        return None
    paths = []
    for word in words:
        if word.startswith("file://"):
            url = urlparse(word)
            if url.netloc not in ("", "localhost"):
                return None
            word = unquote(url.path)
        path = Path(word).expanduser()
        if path.suffix.lower() not in IMAGE_SUFFIXES or not path.is_file():
            return None
        paths.append(path)
    return paths or None


def clipboard_command(
    env: Mapping[str, str] = os.environ, which: Callable[[str], str | None] = shutil.which, platform: str = sys.platform
) -> list[str] | None:
    """The command that writes the clipboard's image as PNG to stdout on this system, or None when there is none."""
    candidates = []
    if platform == "darwin":
        candidates.append(["pngpaste", "-"])
    if env.get("WAYLAND_DISPLAY"):
        candidates.append(["wl-paste", "--no-newline", "--type", "image/png"])
    if env.get("DISPLAY"):
        candidates.append(["xclip", "-selection", "clipboard", "-t", "image/png", "-o"])
    return next((c for c in candidates if which(c[0])), None)


async def clipboard_attachment(command: list[str] | None = None) -> Attachment:
    """The clipboard's image, read through the system's tool (`clipboard_command`), checked as a file is.

    Raises:
        LocalspecError: no tool here, the tool failed or took too long, the clipboard holds no image (one line).
    """
    command = command or clipboard_command()
    if command is None:
        raise LocalspecError(NO_CLIPBOARD)
    try:
        process = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except OSError as e:
        raise LocalspecError(f"cannot run {command[0]}: {e.strerror or e}") from None
    try:
        data, error = await asyncio.wait_for(_output(process), CLIPBOARD_TIMEOUT)
    except TimeoutError:
        raise LocalspecError(f"{command[0]} gave no image in {CLIPBOARD_TIMEOUT:g} s: copy the image again") from None
    finally:
        if process.returncode is None:  # timed out, or wrote more than an image may be
            process.kill()
            await process.wait()
    if len(data) > MAX_FILE_BYTES:
        raise LocalspecError(
            f"the clipboard's image is more than the {human_size(MAX_FILE_BYTES)} an image may be: copy a smaller one"
        )
    if process.returncode != 0 or not data:
        why = " ".join(error.decode(errors="replace").split())[:120]
        raise LocalspecError(f"the clipboard holds no image ({command[0]}: {why or 'nothing'}): copy an image first")
    image = await asyncio.to_thread(read_image, data, name="the clipboard's image")  # a hash of up to 64 MB
    return Attachment("clipboard.png", image)


async def _output(process: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
    """The tool's stdout, at most `MAX_FILE_BYTES` + 1 bytes (more: the caller stops it), and the start of its
    stderr; when its stdout ends in time, the tool is waited for."""
    assert process.stdout is not None and process.stderr is not None
    errors = asyncio.ensure_future(_at_most(process.stderr, 4096))
    try:
        data = await _at_most(process.stdout, MAX_FILE_BYTES)
        if len(data) > MAX_FILE_BYTES:
            return data, b""
        error = await errors
        await process.wait()
        return data, error
    finally:
        errors.cancel()


async def _at_most(stream: asyncio.StreamReader, cap: int) -> bytes:
    """What `stream` gives until its end or past `cap` bytes (then `cap` + 1 of them)."""
    data = bytearray()
    while len(data) <= cap and (chunk := await stream.read(min(READ_CHUNK, cap + 1 - len(data)))):
        data += chunk
    return bytes(data)
