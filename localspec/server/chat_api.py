"""OpenAI's chat completions and completions bodies as the routes read them: server/api.py's wire shapes (checked
there) with `to_request()`, their translation onto the engine's `request.Request` — the turns, the prompt, tools,
thinking, structured output, log-probabilities and our extension fields. They live apart from api.py because the
engine side (request.py) imports api.py's `ApiError`: api.py cannot import `request.Request` back.
"""

from __future__ import annotations

from typing import Any

from localspec.core.grammar import Grammar, GrammarError
from localspec.core.session import Message
from localspec.core.tools import Function

from .api import ApiError, ChatRequest, CompletionRequest
from .images import DATA_ONLY, ImageReader
from .request import Effort, Request


class ChatBody(ChatRequest):
    """`POST /v1/chat/completions`."""

    def conversation(self, images: ImageReader = DATA_ONLY) -> tuple[Message, ...]:
        """The turns as the engine's messages (a `developer` turn is a system turn), each one's `image_url` parts read
        by `images` (raises `ApiError` for an image it refuses)."""
        return tuple(
            Message(
                "system" if m.role == "developer" else m.role,
                m.text,
                m.reasoning_content or "",
                tuple(c.model_dump() for c in m.tool_calls or ()),
                m.tool_call_id or "",
                tuple(images.url(url, f"messages.{i}.content.{j}") for j, url in m.image_urls),
            )
            for i, m in enumerate(self.messages)
        )

    def to_request(self, images: ImageReader = DATA_ONLY) -> Request:
        """The engine's request (raises `ApiError` for a schema that is no grammar, or an image `images` refuses)."""
        effort = Effort("reasoning_effort", self.reasoning_effort) if self.reasoning_effort is not None else None
        if self.think is not None:
            effort = None  # chat_template_kwargs.enable_thinking says it more precisely
        return Request(
            messages=self.conversation(images),
            prompt=None,
            max_tokens=self.max_completion_tokens or self.token_limit,
            think=effort.think if effort is not None else self.think,
            effort=effort,
            tool_choice=self.tool_mode,
            functions=tuple(
                Function(t.function.name, t.function.description, t.function.parameters or {"type": "object"})
                for t in self.tools or ()
            ),
            parallel_tool_calls=self.parallel_tool_calls,
            **_shared(self),
        )


class CompletionBody(CompletionRequest):
    """`POST /v1/completions`: one prompt, continued as it is (no template)."""

    def to_request(self, images: ImageReader = DATA_ONLY) -> Request:
        """The engine's request (raises `ApiError` for a schema that is no grammar); a prompt holds no images."""
        return Request(messages=None, prompt=self.text, max_tokens=self.token_limit, **_shared(self))


def _shared(body: ChatRequest | CompletionRequest) -> dict[str, Any]:
    """The fields both routes translate alike: n, stop, the grammar, log-probabilities and the extensions."""
    return {
        "n": body.n,
        "stop": body.stops,
        "grammar": _grammar(body),
        "logprobs": body.logprobs_top,
        **body.engine_options(),
    }


def _grammar(body: ChatRequest | CompletionRequest) -> Grammar | None:
    try:
        return body.grammar
    except GrammarError as e:
        raise ApiError(400, str(e), param="response_format.json_schema.schema", code="invalid_schema") from None
