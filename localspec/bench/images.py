"""`localspec bench --image`'s turns: the bench's prompts again, with the picture(s) before the text of the user
message.

For localspec they are token ids: the chat template's rendering with each image's run, as the chat reads it. For
llama-server (`peer_prompts`) they are the same rendering as text with a media marker where each image goes, the form
its multimodal `/completion` reads (it puts the model's own tokens around each image itself). suite.py runs them beside
the text turns; their rows are run.py's, as the text turns' are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from localspec.core.engine import Engine
from localspec.core.session import ChatFormat, Message
from localspec.errors import LocalspecError
from localspec.llama.model import Model
from localspec.llama.pictures import Image
from localspec.llama.vision import media_marker

MARK = -1  # where an image goes among a peer prompt's tokens (no token id is negative), before they become text


def image_prompts(engine: Engine, chat_template: str | None, texts: Sequence[str], images: Sequence[Image]) -> list:
    """Each of `texts` as a user message showing `images` before its text, as localspec's chat reads it (a model with
    no chat template: the pictures, then the plain text).

    Raises:
        InvalidParamsError: the pair reads no images (loaded without a projector).
    """
    return _turns(engine.target_model, chat_template, texts, images, engine.image_tokens)


def peer_prompts(model: Model, chat_template: str | None, texts: Sequence[str], images: Sequence[Image]) -> list[str]:
    """The same turns as llama-server reads them: the rendering as text, a media marker where each image goes, control
    tokens as their text (it parses them), and no BOS (it adds its own)."""
    marker, controls = media_marker(), set(model.control_tokens().values())
    out = []
    for tokens in _turns(model, chat_template, texts, images, lambda _: [MARK]):
        if tokens and model.info.add_bos and tokens[0] == model.info.bos:
            tokens = tokens[1:]
        parts, run = [], []
        for t in [*tokens, None]:  # runs of plain tokens, between control tokens and images
            if t is not None and t != MARK and t not in controls:
                run.append(t)
                continue
            parts.append(_as_text(model, run))
            run = []
            if t is not None:
                parts.append(marker if t == MARK else model.token_piece_text(t))
        out.append("".join(parts))
    return out


def _as_text(model: Model, run: list[int]) -> str:
    """A run of plain tokens as the text llama.cpp tokenizes back into them: without the space a SentencePiece
    tokenizer puts before a run's first word itself (llama-server tokenizes each run between control tokens anew)."""
    text = b"".join(model.token_bytes(t) for t in run).decode("utf-8", errors="replace")
    if text.startswith(" ") and model.tokenize(text[1:]) == run:
        return text[1:]
    return text


def _turns(
    model: Model,
    chat_template: str | None,
    texts: Sequence[str],
    images: Sequence[Image],
    image_tokens: Callable[[Image], list[int]],
) -> list[list[int]]:
    """Each text as one user message showing `images` first, in token ids (`image_tokens`: an image's own)."""
    try:
        fmt = ChatFormat(model, chat_template, images=image_tokens)
    except LocalspecError:  # a base model: the pictures, then the text, as the text turns read it (plain)
        info, out = model.info, []
        for text in texts:
            tokens = model.tokenize(text, add_special=True)
            head = 1 if tokens and info.add_bos and tokens[0] == info.bos else 0
            out.append([*tokens[:head], *(t for image in images for t in image_tokens(image)), *tokens[head:]])
        return out
    return [fmt.tokens([Message("user", text, images=tuple(images))]) for text in texts]
