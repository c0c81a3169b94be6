"""Images attached to a message, without Textual: read from a path (typed, pasted or dropped) or the clipboard, checked.

A terminal pastes a dropped file as its path — quoted, as a `file://` URL, or with its spaces escaped — so a paste
that names existing image files (by their suffix) is read as attachments instead of text. Every file goes through
`read_image` (the format, the size in the header, a cut-off file: one line each) before anything keeps it; the
clipboard is read through the system's own tool (`wl-paste`, `xclip`, `pngpaste`), one line where there is none.
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
from localspec.llama.vision import Image, read_image

# Files a paste is taken for images by: what read_image reads, and formats it refuses in one line (so a dropped
# WebP says "convert it" instead of being typed as a path).
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".heic", ".avif"})
MAX_FILE_BYTES = 64 * 2**20  # a larger file is refused before it is read (the pixel cap is read_image's)
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


def human_size(n: int) -> str:
    """A byte count as people read it: 812 B, 4.2 kB, 3.1 MB."""
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} kB"
    return f"{n / 1_000_000:.1f} MB"


def read_attachment(path: str | Path) -> Attachment:
    """Read and check the image file at `path` (`~` expanded).

    Raises:
        LocalspecError: no such file, a folder, too large, unreadable, or not an image read_image accepts (one line).
    """
    path = Path(path).expanduser()
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise LocalspecError(f"{path} is a folder: choose an image file in it")
        if size > MAX_FILE_BYTES:
            raise LocalspecError(
                f"{path.name} is {human_size(size)}, more than the {human_size(MAX_FILE_BYTES)} an image may be: "
                "scale it down first"
            )
        data = path.read_bytes()
    except FileNotFoundError:
        raise LocalspecError(f"no such file: {path}") from None
    except OSError as e:
        raise LocalspecError(f"cannot read {path}: {e.strerror or e}") from None
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
        data, error = await asyncio.wait_for(process.communicate(), CLIPBOARD_TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise LocalspecError(f"{command[0]} gave no image in {CLIPBOARD_TIMEOUT:g} s: copy the image again") from None
    if process.returncode != 0 or not data:
        why = " ".join(error.decode(errors="replace").split())[:120]
        raise LocalspecError(f"the clipboard holds no image ({command[0]}: {why or 'nothing'}): copy an image first")
    return Attachment("clipboard.png", read_image(data, name="the clipboard's image"))
