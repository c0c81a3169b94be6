"""A request's images, as every route names them — an OpenAI `image_url` part, a Responses `input_image`, an
Anthropic `image` block — read into checked `Image`s (llama/pictures.py `read_image`: the format, a cut-off file and
the pixel cap from the header, before native code sees a byte).

A data URL (or Anthropic's base64 source) is always read. A remote URL or a local path is refused in one line unless
the server was started with `--allow-image-urls`: the server never fetches or reads files on a client's behalf
otherwise. Every refusal is a 400 naming the content part (`messages.0.content.1`). With that flag a path is read only
if it names a regular file (a FIFO, a device or a folder is refused without waiting on it), within the byte bound and
the deadline, on the reader's own small pool; a body without URLs is translated on the event loop. A request's images
may add up to `MAX_REQUEST_PIXELS`, counted from their headers before any is decoded.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import functools
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from localspec.errors import LocalspecError
from localspec.llama.pictures import Image, read_image, read_image_file

from .api import ApiError

FETCH_TIMEOUT_S = 30.0  # an image URL that answers slower is refused (`--allow-image-urls` only)
MAX_IMAGE_BYTES = 20 * 2**20  # the most bytes fetched or read from a file for one image
MAX_REQUEST_PIXELS = 200_000_000  # the most pixels (as the headers say) a request's images may add up to
READERS = 4  # threads that fetch URLs and read files (`--allow-image-urls`): the server's own threads never wait on one
READABLE = "image/png, image/jpeg, image/gif or image/bmp"
INLINE = "send it inline as a data URL (data:image/png;base64,...)"

T = TypeVar("T")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


@dataclass(frozen=True, slots=True)
class ImageReader:
    """How the server reads a request's images: data always; http(s) URLs and local files only with `allow_urls`
    (`serve --allow-image-urls`), fetched within `timeout` seconds and `max_bytes`."""

    allow_urls: bool = False
    timeout: float = FETCH_TIMEOUT_S
    max_bytes: int = MAX_IMAGE_BYTES
    pool: ThreadPoolExecutor | None = field(default=None, compare=False)  # where URLs and files are read
    on_loop: bool = False  # on the event loop: a URL or a path raises `_Remote` instead of being read

    @classmethod
    def serving(cls, allow_urls: bool, timeout: float) -> ImageReader:
        """The server's reader: with `allow_urls`, a small pool of its own to read them on."""
        pool = ThreadPoolExecutor(READERS, thread_name_prefix="localspec-image-read") if allow_urls else None
        return cls(allow_urls=allow_urls, timeout=timeout, pool=pool)

    def url(self, url: str, where: str) -> Image:
        """The image a URL names: a data URL, or (when allowed) an http(s) URL or a local file.

        Args:
            url: what the client sent (`image_url.url`, `image_url`, Anthropic's `source.url`).
            where: the content part, as the error names it ("messages.0.content.1").

        Raises:
            ApiError: 400: a URL refused or that failed, bad base64, not an image type, or an image `read_image`
                refuses (damaged, cut off, unsupported, too many pixels).
        """
        found = _SCHEME.match(url[:32])
        scheme = found.group(1).lower() if found else ""
        if scheme == "data":
            return self._data_url(url, where)
        if len(scheme) == 1:  # a Windows drive letter ("C:\\..."): a path
            scheme = ""
        if scheme not in ("http", "https", "file", ""):
            raise _refused(f"'{where}' is a {scheme}: URL, which localspec does not read: {INLINE}", where)
        if not self.allow_urls:
            what = "a local file, which this server does not read for a client"
            if scheme.startswith("http"):
                what = f"an {scheme} URL, which this server does not fetch"
            raise _refused(f"'{where}' is {what}: {INLINE}, or start the server with --allow-image-urls", where)
        if self.on_loop:
            raise _Remote
        data = self._fetch(url, where) if scheme.startswith("http") else self._file(url, scheme, where)
        return _checked(data, where)

    def base64(self, data: str, media_type: str, where: str) -> Image:
        """The image of Anthropic's base64 source (`media_type`, `data`).

        Raises:
            ApiError: 400, as `url`.
        """
        _an_image_type(media_type, where)
        return _checked(_decoded(data, where), where)

    def _data_url(self, url: str, where: str) -> Image:
        head, comma, body = url[5:].partition(",")
        if not comma:
            raise _bad(f"'{where}' is a data URL without a comma before its data: {INLINE}", where)
        params = [p.strip() for p in head.split(";")]
        _an_image_type(params[0].lower() or "text/plain", where)  # a data URL without a type is text (RFC 2397)
        if "base64" in (p.lower() for p in params[1:]):
            return _checked(_decoded(body, where), where)
        return _checked(urllib.parse.unquote_to_bytes(body), where)

    def _fetch(self, url: str, where: str) -> bytes:
        request = urllib.request.Request(url, headers={"User-Agent": "localspec"})
        try:
            deadline = time.monotonic() + self.timeout  # the whole fetch, not each read: a slow drip ends too
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                data = bytearray()
                while len(data) <= self.max_bytes and (piece := response.read(2**16)):
                    data += piece
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"not sent within {self.timeout:g} s")
        except urllib.error.HTTPError as e:
            why = f"'{where}': fetching the image answered HTTP {e.code} {e.reason}: check the URL"
            raise _bad(why, where) from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            cause = getattr(e, "reason", None) or e
            why = f"'{where}': the image could not be fetched ({cause}): check the URL, or {INLINE}"
            raise _bad(why, where) from None
        return self._bounded(bytes(data), where)

    def _file(self, url: str, scheme: str, where: str) -> bytes:
        path = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path) if scheme == "file" else url)
        try:
            return read_image_file(path.expanduser(), self.max_bytes, timeout=self.timeout)
        except LocalspecError as e:
            raise _bad(f"'{where}': {e}", where) from None

    def _bounded(self, data: bytes, where: str) -> bytes:
        if len(data) > self.max_bytes:
            raise _bad(f"'{where}': the image is larger than {self.max_bytes // 2**20} MiB: scale it down", where)
        return data


class _Remote(Exception):
    """A URL or a path met while translating on the event loop: translate again on the reader's pool."""


DATA_ONLY = ImageReader()  # data URLs only: what a server started without --allow-image-urls reads


async def translated(reader: ImageReader, to_request: Callable[..., T], *args) -> T:
    """`to_request(*args, images=reader)`: on the event loop where no image is fetched or read from a file, else on
    the reader's own small pool (a URL may take up to the reader's timeout; the server keeps answering meanwhile, and
    slow fetches never hold the threads the rest of the server runs on)."""
    if not reader.allow_urls:
        return to_request(*args, images=reader)
    try:
        return to_request(*args, images=dataclasses.replace(reader, on_loop=True))
    except _Remote:  # a URL or a path: read them all off the event loop
        pass
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(reader.pool, functools.partial(to_request, *args, images=reader))


def request_pixels(images: Sequence[Image]) -> None:
    """Refuse a request whose images add up to more than `MAX_REQUEST_PIXELS`, before any is decoded.

    Raises:
        ApiError: 400 `too_many_pixels`.
    """
    pixels = sum(image.width * image.height for image in images)
    if pixels > MAX_REQUEST_PIXELS:
        raise ApiError(
            400,
            f"the request's {len(images)} images add up to {pixels / 1e6:.0f} megapixels, more than the "
            f"{MAX_REQUEST_PIXELS / 1e6:.0f} a request may have: send fewer or smaller images",
            param="messages",
            code="too_many_pixels",
        )


def _an_image_type(media_type: str, where: str) -> None:
    kind = media_type.split(";")[0].strip().lower()
    if not kind.startswith("image/"):
        raise _bad(f"'{where}' is {kind or 'data without a media type'}, not an image: send {READABLE}", where)


def _decoded(text: str, where: str) -> bytes:
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        why = f"'{where}': the image's base64 is not valid ({e}): send the file's bytes base64-encoded"
        raise _bad(why, where) from None
    return data


def _checked(data: bytes, where: str) -> Image:
    if not data:
        raise _bad(f"'{where}': the image is empty: send the file's bytes", where)
    try:
        return read_image(data, name=f"the image at '{where}'")
    except LocalspecError as e:
        raise _bad(str(e), where) from None


def _bad(message: str, where: str) -> ApiError:
    return ApiError(400, message, param=where, code="invalid_image")


def _refused(message: str, where: str) -> ApiError:
    return ApiError(400, message, param=where, code="image_url_refused")
