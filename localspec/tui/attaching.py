"""The chat screen's part that owns the images attached to the message being written: attaching, and taking off.

Images are attached by a path (Ctrl+O's prompt, or a file dropped or pasted into the prompt box) or from the
clipboard (Ctrl+L), and show as chips above the prompt box (`AttachmentBar`, image_widgets.py) until the message is
sent; Backspace in an empty box takes the last one off. `Attaching` is a base class of `ChatScreen`, which keeps the
bindings: Textual finds these `action_…` methods and `on_…` handlers along the screen's MRO.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from textual.screen import Screen

from localspec.errors import LocalspecError

from .attachments import Attachment, clipboard_attachment, pasted_paths, read_attachment
from .image_widgets import AttachmentBar
from .screens import ImagePathScreen
from .widgets import PromptInput


class Attaching(Screen):
    """The images attached to the message being written, as chips above the prompt box (`ChatScreen` is one)."""

    if TYPE_CHECKING:

        def error(self, message: str) -> None: ...  # the chat screen's one-line error

    async def attach(self, attachments: list[Attachment]) -> None:
        """Show `attachments` as chips above the prompt box; they go with the next message sent."""
        if not attachments:
            return
        await self.query_one(AttachmentBar).add(attachments)
        names = ", ".join(a.name for a in attachments)
        self.notify(f"attached {names}: sent with your next message (Backspace in an empty box takes it off)")

    async def attach_files(self, paths: list) -> None:
        """Read and attach image files; each one that cannot be is one line, the others are attached.

        Each is read in a thread (a slow disk never freezes the chat; what is not a regular file is refused before
        any read, and a file is read to the size cap at most); this screen's later messages wait for it, so an Enter
        pressed after the path sends the picture.
        """
        attachments = []
        for path in paths:
            try:
                attachments.append(await asyncio.to_thread(read_attachment, path))
            except LocalspecError as e:
                self.error(str(e))
        await self.attach(attachments)

    def action_attach_image(self) -> None:
        """Attach an image file: a path prompt with completion (Ctrl+O)."""
        self.app.push_screen(ImagePathScreen(), self._image_path_given)

    async def _image_path_given(self, path: str | None) -> None:
        if path:  # a path pasted into the prompt may be quoted or a file:// URL, as in the prompt box
            await self.attach_files(pasted_paths(path) or [path])
        self.query_one(PromptInput).focus()

    async def action_paste_image(self) -> None:
        """Attach the clipboard's image, read by the system's own tool (Ctrl+L)."""
        try:
            attachment = await clipboard_attachment()
        except LocalspecError as e:
            self.error(str(e))
            return
        await self.attach([attachment])

    async def on_prompt_input_pasted_images(self, event: PromptInput.PastedImages) -> None:
        await self.attach_files(event.paths)

    async def on_prompt_input_drop_image(self, event: PromptInput.DropImage) -> None:
        dropped = await self.query_one(AttachmentBar).drop_last()
        if dropped is not None:
            self.notify(f"took {dropped.name} off the message")
