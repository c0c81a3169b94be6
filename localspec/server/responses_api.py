"""OpenAI's Responses API (`POST /v1/responses`) as a translation onto the one request model: what a body may hold,
checked strictly as chat requests are (server/api.py), and its input items — messages, `function_call`,
`function_call_output`, `reasoning` — turned into the chat route's conversation, after the stored conversation of
`previous_response_id` where it names one.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from localspec.core.grammar import Grammar, GrammarError
from localspec.core.session import Message
from localspec.core.tools import Function
from localspec.llama.pictures import Image, read_image

from .api import ApiError, CacheRetention, Extensions, ReasoningEffort, Verbosity, _Strict
from .chat_api import FunctionSpec
from .images import DATA_ONLY, ImageReader
from .request import Effort, Request

log = logging.getLogger(__name__)
IGNORED = ("metadata", "user", "service_tier", "safety_identifier", "prompt_cache_key", "client_metadata")
# OpenAI's hosted tools, which run on OpenAI's side: no model here can call them, so they are not offered to it (left
# out, with a log line) rather than the request refused — Codex CLI always sends `web_search`.
HOSTED_TOOLS = ("web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation", "mcp",
                "computer_use_preview", "local_shell")  # fmt: skip
# Fields we do not implement, with the values that change nothing.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "background": (None, False),
    "include": (None, [], ["reasoning.encrypted_content"]),  # Codex asks: our reasoning has no encrypted form
    "conversation": (None,),
    "prompt": (None,),
    "top_logprobs": (None, 0),
}
PART_TYPES = ("input_text", "output_text", "input_image")
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


class InputText(_Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class InputImage(_Strict):
    type: Literal["input_image"]
    image_url: str | None = None  # a data URL; an http(s) URL or a local path only with `serve --allow-image-urls`
    file_id: str | None = None  # OpenAI's Files API, which localspec does not have: refused by name
    detail: Literal["auto", "low", "high"] | None = None  # accepted: the projector reads an image at its own size

    def read(self, images: ImageReader, where: str) -> Image:
        """The checked image (raises `ApiError` for one `images` refuses, a `file_id`, or neither given)."""
        if self.image_url is not None:
            return images.url(self.image_url, where)
        if self.file_id is not None:
            why = f"'{where}.file_id' names a file, and localspec has no Files API: send image_url as a data URL"
            raise ApiError(400, why, param=f"{where}.file_id", code="unsupported_value")
        param = f"{where}.image_url"
        raise ApiError(400, f"'{param}' is required", param=param, code="missing_required_parameter")


Part = Annotated[InputText | InputImage, Field(discriminator="type")]


def _text(parts: str | list) -> str:
    return parts if isinstance(parts, str) else "".join(p.text for p in parts if isinstance(p, InputText))


def _images(parts: str | list, images: ImageReader, where: str) -> tuple[Image, ...]:
    """The images of `parts` in order, read (`where`: the parts' list, "input.0.content")."""
    if isinstance(parts, str):
        return ()
    return tuple(p.read(images, f"{where}.{j}") for j, p in enumerate(parts) if isinstance(p, InputImage))


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]
    id: str | None = None
    status: str | None = None

    @property
    def text(self) -> str:
        return _text(self.content)


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[Part]
    id: str | None = None
    status: str | None = None

    @property
    def text(self) -> str:
        return _text(self.output)


class ReasoningText(_Strict):
    type: Literal["summary_text", "reasoning_text"]
    text: str


class ReasoningItem(_Strict):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: str | None = None


Item = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem, Field(discriminator="type")]


class FunctionTool(FunctionSpec):
    type: Literal["function"]


class FunctionChoice(_Strict):
    type: Literal["function"]
    name: str


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Verbosity | None = None  # how long OpenAI's own models answer: accepted, no lever here


class ReasoningConfig(_Strict):
    effort: ReasoningEffort | None = None  # a thinking model's switch: on, except at "none" (request.Effort)
    summary: Literal["auto", "concise", "detailed"] | None = None  # the thinking is returned whole, not summarised


class ResponsesRequest(Extensions):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    # Accepted, and they change nothing here: "auto" would drop input that overflows the context (a conversation that
    # does not fit is refused either way); a limit on calls to hosted tools (none runs here); OpenAI's cache's life
    truncation: Literal["disabled", "auto"] | None = None
    max_tool_calls: Annotated[int, Field(ge=0)] | None = None
    prompt_cache_retention: CacheRetention | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _functions_only(cls, value):
        """A `namespace` tool's functions are offered as functions; hosted tools are left out (`HOSTED_TOOLS`)."""
        if not isinstance(value, list):
            return value
        found = []
        for tool in value:
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind == "namespace" and isinstance(tool.get("tools"), list):
                found += tool["tools"]
            elif kind in HOSTED_TOOLS:
                log.info("the hosted tool %r is not offered to the model: localspec runs none", kind)
            else:
                found.append(tool)
        return found

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value):
        if value == [] or value == "":
            raise ValueError("the input is empty: give some text or items")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _named_tool_exists(cls, value, info):
        if isinstance(value, FunctionChoice) and value.name not in {t.name for t in info.data.get("tools") or ()}:
            raise ValueError(f"tool_choice names {value.name!r}, which is not one of the tools")
        return value

    def items(self) -> list:
        """The input as typed items (a string is one user message).

        Raises:
            ApiError: an item of a type we do not know, or a malformed one (400, naming `input.N`).
        """
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        from pydantic import TypeAdapter, ValidationError

        from .api import _validation_error

        found = []
        for i, raw in enumerate(self.input):
            kind = raw.get("type", "message" if "role" in raw else None)
            if kind not in ITEM_TYPES:
                raise ApiError(
                    400,
                    f"input item type {kind!r} is not supported: use one of {', '.join(ITEM_TYPES)}",
                    param=f"input.{i}.type",
                    code="unsupported_value",
                )
            parts = raw.get("content", raw.get("output"))
            for j, part in enumerate(parts if isinstance(parts, list) else ()):
                if isinstance(part, dict) and part.get("type") not in PART_TYPES:
                    raise ApiError(
                        400,
                        f"content part type {part.get('type')!r} is not supported: use {', '.join(PART_TYPES)}",
                        param=f"input.{i}.{'content' if 'content' in raw else 'output'}.{j}.type",
                        code="unsupported_value",
                    )
            try:
                found.append(TypeAdapter(Item).validate_python({**raw, "type": kind}, strict=True))
            except ValidationError as e:
                error = _validation_error(e)
                error.param = f"input.{i}." + ".".join((error.param or "").split(".")[1:]).strip(".")
                error.message = f"'{error.param}': " + error.message.split(": ", 1)[-1]
                raise error from None
        return found

    @property
    def tool_mode(self) -> str | None:
        if not self.tools:
            return None
        choice = self.tool_choice or "auto"
        if isinstance(choice, FunctionChoice):
            return choice.name
        return None if choice == "none" else choice

    def grammar(self) -> Grammar | None:
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return Grammar.json_object()
        if fmt.schema_ is None:
            raise ApiError(400, "'schema' is required with type 'json_schema'", param="text.format.schema")
        try:
            return Grammar.output_schema(fmt.schema_)
        except GrammarError as e:
            raise ApiError(400, str(e), param="text.format.schema", code="invalid_schema") from None

    def conversation(self, history: Sequence[Message], images: ImageReader = DATA_ONLY) -> tuple[Message, ...]:
        """The stored conversation (`history`) and then the input, as the engine's messages, `instructions` first;
        each item's `input_image` parts read by `images`.

        Raises:
            ApiError: a `function_call_output` whose call is neither earlier in the input nor in the history, or an
                image `images` refuses.
        """
        out: list[Message] = [Message("system", self.instructions)] if self.instructions else []
        out += history
        called = {c["id"] for m in history for c in m.tool_calls}
        reasoning = ""
        for i, item in enumerate(self.items()):
            if isinstance(item, ReasoningItem):
                reasoning += "".join(p.text for p in item.content or item.summary)
            elif isinstance(item, MessageItem):
                role = "system" if item.role == "developer" else item.role
                seen = _images(item.content, images, f"input.{i}.content")
                out.append(Message(role, item.text, reasoning if role == "assistant" else "", images=seen))
                reasoning = ""
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function"}
                call["function"] = {"name": item.name, "arguments": item.arguments}
                called.add(item.call_id)
                last = out[-1] if out else None
                if last is not None and last.role == "assistant" and not reasoning:  # one turn's text and calls
                    calls = (*last.tool_calls, call)
                    out[-1] = Message("assistant", last.content, last.reasoning, calls, images=last.images)
                else:
                    out.append(Message("assistant", "", reasoning, (call,)))
                reasoning = ""
            elif isinstance(item, FunctionCallOutputItem):
                if item.call_id not in called:
                    raise ApiError(
                        400,
                        f"'input.{i}.call_id': {item.call_id!r} answers no function_call of the input or of the "
                        "previous response",
                        param=f"input.{i}.call_id",
                        code="invalid_value",
                    )
                shown = _images(item.output, images, f"input.{i}.output")
                out.append(Message("tool", item.text, tool_call_id=item.call_id, images=shown))
        return tuple(out)

    def to_request(self, history: Sequence[Message] = (), images: ImageReader = DATA_ONLY) -> Request:
        """The engine's request: the stored conversation (`history`), then the input (its images read by `images`)."""
        asked = self.reasoning.effort if self.reasoning is not None else None
        effort = Effort("reasoning.effort", asked) if asked is not None else None
        return Request(
            messages=self.conversation(history, images),
            prompt=None,
            max_tokens=self.max_output_tokens,
            think=effort.think if effort is not None else None,
            effort=effort,
            grammar=self.grammar(),
            grammar_param="text.format",
            tool_choice=self.tool_mode,
            functions=tuple(
                Function(t.name, t.description, t.parameters or {"type": "object"}) for t in self.tools or ()
            ),
            parallel_tool_calls=self.parallel_tool_calls,
            **self.engine_options(),
        )


def messages_to_json(messages: tuple[Message, ...] | list[Message]) -> str:
    """The stored conversation: each message's fields, its images' bytes base64 last (a follow-up still shows them)."""
    return json.dumps(
        [
            [m.role, m.content, m.reasoning, list(m.tool_calls), m.tool_call_id]
            + ([[base64.b64encode(i.data).decode() for i in m.images]] if m.images else [])
            for m in messages
        ]
    )


def messages_from_json(text: str) -> list[Message]:
    """`messages_to_json`'s conversation read back (a row stored before images has no sixth field)."""
    out = []
    for role, content, reasoning, calls, call_id, *shown in json.loads(text):
        seen = tuple(read_image(base64.b64decode(data)) for data in (shown[0] if shown else ()))
        out.append(Message(role, content, reasoning, tuple(calls), call_id, seen))
    return out
