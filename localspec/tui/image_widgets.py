"""The chat's image widgets: the chips of the images attached to the prompt box, and a message's images drawn inline.

A message's images show inline where the terminal can draw them (textual-image: sixel, the kitty protocol or half
blocks, picked by `probe_inline_images` asking the terminal before the app starts) and always as a named chip; the
images attached to the prompt box show as chips above it (`AttachmentBar`) until the message is sent. What an image
is, read and checked, is attachments.py's.
"""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Callable, Sequence

from textual.containers import Horizontal
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Button, Static

from .attachments import Attachment
from .safe_text import terminal_safe

log = logging.getLogger(__name__)


class _ToLog(logging.Handler):
    """textual-image's log lines as one line each in ours."""

    def emit(self, record: logging.LogRecord) -> None:
        log.debug("textual-image: %s", record.getMessage())


def probe_inline_images() -> Callable[..., Widget] | None:
    """The widget that draws an image in this terminal (textual-image's choice: sixel, the kitty protocol or half
    blocks), or None when output is not a terminal (tests, a pipe) or the library cannot be used: then a message's
    images are their chips alone. It asks the terminal, so it must run before the app takes the terminal over."""
    stdout = sys.__stdout__
    if stdout is None or not stdout.isatty():
        return None
    quiet = logging.getLogger("textual_image")  # its warnings (a terminal that answers no query) go to our log,
    quiet.propagate = False  # not through logging's last resort onto the terminal, traceback and all
    if not any(isinstance(h, _ToLog) for h in quiet.handlers):
        quiet.addHandler(_ToLog())
    try:
        from textual_image.renderable import Image as chosen
        from textual_image.renderable import UnicodeImage
        from textual_image.widget import Image
    except Exception as e:  # a broken install, or a terminal that answers nonsense: chips only, never a crash
        log.warning("images are shown as their names only: textual-image cannot be used (%s)", e)
        return None
    log.info("images drawn with textual-image's %s", chosen.__module__)
    return None if chosen is UnicodeImage else Image


class ImageChip(Button):
    """An image attached to the prompt box: its name, pixels and bytes; pressed (a click, Enter) it is taken off."""

    def __init__(self, attachment: Attachment) -> None:
        super().__init__(Content(terminal_safe(attachment.chip()) + " ✕"), classes="image-chip", compact=True)
        self.attachment = attachment


class AttachmentBar(Horizontal):
    """The images attached to the message being written, as chips above the prompt box, until it is sent."""

    @property
    def attachments(self) -> list[Attachment]:
        """The images attached, in order."""
        return [chip.attachment for chip in self.query_children(ImageChip)]

    async def add(self, attachments: Sequence[Attachment]) -> None:
        """Attach more images (one already attached is not attached twice)."""
        held = {a.image.id for a in self.attachments}
        new = [a for a in attachments if a.image.id not in held]
        if new:
            await self.mount_all([ImageChip(a) for a in new])
        self.set_class(bool(self.attachments), "-on")

    async def drop_last(self) -> Attachment | None:
        """Take the last image off; returns it (None: there was none)."""
        chips = list(self.query_children(ImageChip))
        if not chips:
            return None
        await chips[-1].remove()
        self.set_class(len(chips) > 1, "-on")
        return chips[-1].attachment

    async def clear(self) -> None:
        """Take every image off (the message was sent)."""
        await self.remove_children()
        self.remove_class("-on")

    async def on_button_pressed(self, event: Button.Pressed) -> None:
        if isinstance(event.button, ImageChip):
            event.stop()
            await event.button.remove()
            self.set_class(bool(self.attachments), "-on")
            self.notify(f"took {terminal_safe(event.button.attachment.name)} off the message")


def image_views(attachments: Sequence[Attachment], inline: Callable[..., Widget] | None) -> list[Widget]:
    """A message's images as widgets: each drawn inline (when the terminal can: `inline`) above its named chip."""
    views: list[Widget] = []
    for attachment in attachments:
        if inline is not None:
            try:
                views.append(inline(io.BytesIO(attachment.image.data), classes="inline-image"))
            except Exception as e:  # Pillow could not decode what llama.cpp may: the chip still names it
                log.warning("%s cannot be drawn inline: %s", attachment.name, e)
        views.append(Static(terminal_safe(attachment.chip()), classes="message-image", markup=False))
    return views
