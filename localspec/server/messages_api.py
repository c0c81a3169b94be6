"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) as a translation onto the one request
model: what a body may hold, checked strictly as chat requests are (server/api.py), then turned into the same
`request.Request` the chat route makes — system, turns, tool calls and results, tools, choice, thinking, stop — and
Anthropic's error object for what it may not.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from localspec.core.grammar import Grammar, GrammarError
from localspec.core.session import Message
from localspec.core.tools import Function
from localspec.llama.pictures import Image

from .api import ApiError, Extensions, _Strict, refuse_unknown_parts
from .images import DATA_ONLY, ImageReader
from .request import Request

# Anthropic's error types by HTTP status (its `{"type": "error", "error": {"type", "message"}}` object).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
BLOCK_TYPES = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")
# Anthropic's bookkeeping, and `context_management` (which earlier thinking the API may clear): accepted, left out.
IGNORED = ("metadata", "service_tier", "container", "mcp_servers", "context_management")


def is_messages_path(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def error_body(error: ApiError) -> dict:
    """`error` in Anthropic's shape; the field it names leads the message ("max_tokens: 'max_tokens' is required")."""
    kind = ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    body = error.body()["error"]  # the message made safe to encode
    message = body["message"]
    if body["param"] and body["param"] not in message:
        message = f"{body['param']}: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


class _Cached(_Strict):
    cache_control: dict[str, Any] | None = None  # prompt caching hints: our cache keeps every shared prefix anyway


class TextBlock(_Cached):
    type: Literal["text"]
    text: str
    citations: list[Any] | None = None


class Base64Source(_Strict):
    type: Literal["base64"]
    media_type: str  # image/png, image/jpeg, image/gif (image/webp is refused by what the bytes are)
    data: str


class UrlSource(_Strict):
    type: Literal["url"]
    url: str  # fetched only with `serve --allow-image-urls` (server/images.py)


class FileSource(_Strict):
    type: Literal["file"]
    file_id: str  # Anthropic's Files API, which localspec does not have: refused by name


class ImageBlock(_Cached):
    type: Literal["image"]
    source: Annotated[Base64Source | UrlSource | FileSource, Field(discriminator="type")]

    def read(self, images: ImageReader, where: str) -> Image:
        """The checked image (raises `ApiError` for one `images` refuses, or a `file_id`)."""
        source = self.source
        if isinstance(source, Base64Source):
            return images.base64(source.data, source.media_type, where)
        if isinstance(source, UrlSource):
            return images.url(source.url, where)
        raise ApiError(
            400,
            f"'{where}.source' is a file_id, and localspec has no Files API: send the image as a base64 source",
            param=f"{where}.source",
            code="unsupported_value",
        )


def _images(blocks: list, images: ImageReader, where: str) -> tuple[Image, ...]:
    """The images of `blocks` in order, read (`where`: the blocks' list, "messages.0.content")."""
    return tuple(b.read(images, f"{where}.{j}") for j, b in enumerate(blocks) if isinstance(b, ImageBlock))


class ToolUseBlock(_Cached):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Cached):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] = ""
    is_error: bool = False

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def blocks(self) -> list:
        return [] if isinstance(self.content, str) else list(self.content)


class ThinkingBlock(_Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Strict):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class AnthropicMessage(_Strict):
    role: Literal["user", "assistant", "system"]  # Claude Code sends system turns among the messages
    content: str | list[Block]

    def blocks(self) -> list:
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else list(self.content)


class AnthropicTool(_Cached):
    type: Literal["custom"] | None = None
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: str = ""
    input_schema: dict[str, Any]

    @field_validator("input_schema")
    @classmethod
    def _an_object(cls, value):
        if value.get("type", "object") != "object":
            raise ValueError("a tool's input_schema is a JSON schema of type 'object'")
        return value


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class OutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    effort: Literal["low", "medium", "high", "max"] | None = None  # accepted: the model decides how long it thinks
    format: OutputFormat | None = None  # structured output: the answer follows the schema (a grammar, as chat's)


class ThinkingConfig(_Strict):
    type: Literal["enabled", "disabled", "adaptive"]  # adaptive: the model's (or the pair's) own choice
    budget_tokens: Annotated[int, Field(ge=1)] | None = None  # accepted; the model ends its thinking itself


class CountRequest(Extensions):
    """`/v1/messages/count_tokens`: the conversation without `max_tokens`."""

    model: str | None = None
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_blocks(cls, data):
        """A content block of a type we do not implement (a document) is refused by its name."""
        return refuse_unknown_parts(data, BLOCK_TYPES, "block")

    @field_validator("messages")
    @classmethod
    def _results_answer_uses(cls, messages):
        """Each `tool_result` answers a `tool_use` of an earlier assistant message; results are a user's; the
        conversation does not end on an assistant turn (a prefill, which we do not continue)."""
        used: set[str] = set()
        for i, m in enumerate(messages):
            for j, block in enumerate(m.blocks()):
                where = f"messages.{i}.content.{j}"
                if isinstance(block, ToolUseBlock):
                    if m.role != "assistant":
                        raise ValueError(f"{where}: only an assistant message has 'tool_use' blocks")
                    used.add(block.id)
                elif isinstance(block, ToolResultBlock):
                    if m.role != "user":
                        raise ValueError(f"{where}: only a user message has 'tool_result' blocks")
                    if block.tool_use_id not in used:
                        raise ValueError(
                            f"{where}.tool_use_id: {block.tool_use_id!r} answers no 'tool_use' of an earlier "
                            "assistant message"
                        )
        if messages[-1].role == "assistant":
            raise ValueError("the last message is the assistant's (a prefill): localspec answers a user turn only")
        return messages

    @model_validator(mode="after")
    def _choice_names_a_tool(self):
        choice = self.tool_choice
        if choice is not None and choice.type == "tool":
            names = {t.name for t in self.tools or ()}
            if choice.name is None:
                raise ApiError(400, "'name' is required with type 'tool'", param="tool_choice.name")
            if choice.name not in names:
                raise ApiError(
                    400, f"tool_choice names {choice.name!r}, which is not one of the tools", param="tool_choice.name"
                )
        return self

    @property
    def tool_mode(self) -> str | None:
        if not self.tools:
            return None
        choice = self.tool_choice or ToolChoice(type="auto")
        return {"auto": "auto", "any": "required", "none": None}.get(choice.type, choice.name)

    def conversation(self, images: ImageReader = DATA_ONLY) -> tuple[Message, ...]:
        """The turns as the engine's messages: the system prompt first, tool results as `tool` messages, an
        assistant's `tool_use` blocks as its calls (OpenAI's shape, which the templates read), thinking apart, each
        turn's `image` blocks read by `images` (raises `ApiError` for an image it refuses)."""
        out: list[Message] = []
        if self.system:
            system = self.system if isinstance(self.system, str) else "".join(b.text for b in self.system)
            out.append(Message("system", system))
        for i, m in enumerate(self.messages):
            blocks = m.blocks()
            text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
            seen = _images(blocks, images, f"messages.{i}.content")
            if m.role == "system":  # one system prompt leads, as every template renders it
                if out and out[0].role == "system":
                    out[0] = Message("system", f"{out[0].content}\n\n{text}")
                else:
                    out.insert(0, Message("system", text))
                continue
            if m.role == "assistant":
                thinking = "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock))
                calls = tuple(
                    {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                    for b in blocks
                    if isinstance(b, ToolUseBlock)
                )
                out.append(Message("assistant", text, thinking, calls, images=seen))
                continue
            for j, b in enumerate(blocks):
                if isinstance(b, ToolResultBlock):
                    result = f"Error: {b.text}" if b.is_error else b.text
                    shown = _images(b.blocks, images, f"messages.{i}.content.{j}.content")
                    out.append(Message("tool", result, tool_call_id=b.tool_use_id, images=shown))
            if text or seen or not any(isinstance(b, ToolResultBlock) for b in blocks):
                out.append(Message("user", text, images=seen))
        return tuple(out)

    def grammar(self) -> Grammar | None:
        fmt = self.output_config.format if self.output_config else None
        if fmt is None:
            return None
        try:
            return Grammar.output_schema(fmt.schema_)
        except GrammarError as e:
            raise ApiError(400, str(e), param="output_config.format.schema", code="invalid_schema") from None

    def to_request(self, images: ImageReader = DATA_ONLY) -> Request:
        """The engine's request: the prompt tokenized and counted, nothing generated."""
        return self._request(images, count_only=True)

    def _request(self, images: ImageReader, **fields) -> Request:
        think = None if self.thinking is None or self.thinking.type == "adaptive" else self.thinking.type == "enabled"
        return Request(
            messages=self.conversation(images),
            prompt=None,
            think=think,
            tool_choice=self.tool_mode,
            functions=tuple(Function(t.name, t.description, t.input_schema) for t in self.tools or ()),
            parallel_tool_calls=not (self.tool_choice and self.tool_choice.disable_parallel_tool_use),
            grammar_param="tools",
            grammar=self.grammar(),
            max_tokens_room=True,  # Anthropic's clients send their model's limit (Claude Code: 32000)
            **self.engine_options(),
            **fields,
        )


class MessagesRequest(CountRequest):
    max_tokens: Annotated[int, Field(ge=1)]  # required, as Anthropic requires it
    stop_sequences: Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=16)] | None = None
    stream: bool = False

    def to_request(self, images: ImageReader = DATA_ONLY) -> Request:
        """The engine's request: the answer, within `max_tokens` (or the room left), ended by `stop_sequences`."""
        return self._request(images, max_tokens=self.max_tokens, stop=tuple(self.stop_sequences or ()))
