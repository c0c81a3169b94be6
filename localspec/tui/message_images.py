"""The images of the conversation's messages, without Textual: the name each was attached as, and the pair's check.

A message the session reads holds its images as they are (bytes and a content id); the file names they were attached
as live beside them here, by image id, for the chips, a copy saved anew and the export — an image attached twice, or
read back from the chat database, is one id and one name. A pair loaded without a projector refuses images before
anything of the message is saved (`check_images`), where the session would only refuse them when it answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from localspec.core.session import Message
from localspec.errors import InvalidParamsError

from .attachments import Attachment
from .loading import Loaded


class ImageNames:
    """The file name each image on screen was attached as, by its id."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}

    def user_message(self, text: str, images: Sequence[Attachment]) -> Message:
        """A user message as the session reads it (its images' names remembered for the chips and a resave)."""
        self._names.update((a.image.id, a.name) for a in images)
        return Message("user", text, images=tuple(a.image for a in images))

    def restored(self, message: Message, images: Sequence[Attachment]) -> Message:
        """`message` read back from the chat database with its images, `images` (their names remembered)."""
        self._names.update((a.image.id, a.name) for a in images)
        return replace(message, images=tuple(a.image for a in images))

    def attachments(self, message: Message) -> list[Attachment]:
        """A message's images with the names they were attached as."""
        return [Attachment(self._names.get(image.id, "image"), image) for image in message.images]


def check_images(loaded: Loaded | None) -> None:
    """Refuse images before a message is saved when the loaded pair reads none (core says so only later).

    Raises:
        InvalidParamsError: the pair was loaded without a projector.
    """
    engine = loaded.engine if loaded is not None else None
    if engine is not None and engine.media is None:
        raise InvalidParamsError(
            f"{engine.target_model.path.name} reads no images: load it with its projector (--mmproj PATH, or a "
            "pair with mmproj in models.toml); the message and its images stay in the prompt"
        )
