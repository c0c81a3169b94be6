"""What a request may ask, checked before the engine sees it; and OpenAI's error object for what it may not.

A body is JSON; its fields are read strictly (a string is not a number, 1.5 is not an integer). Fields we do not
support are refused by name unless their value is the one that changes nothing (`logprobs: false`, `tools: []`),
so no request is silently answered as if it had asked something else. What a request leaves out is None: the
server's flags, then the pair's defaults, then the engine's decide (`request.Request`). Our extension fields
(sampling and speculation options, the drafter) are one base, `Extensions`, that every route's body shares.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from localspec.core.grammar import Grammar
from localspec.core.options import Limit
from localspec.core.params import DRAFTERS, OPTIONS, OVERRIDE_OPTIONS
from localspec.errors import ModelFileError

from .units import keep_alive_value

STOP_MAX = 16  # stop strings per request
N_MAX = 16  # choices per request
TOP_LOGPROBS_MAX = 20  # alternatives per token's log-probability, as OpenAI allows

# Fields OpenAI defines that we do not implement, with the values that leave the output unchanged.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "functions": (None, []),
    "function_call": (None, "none"),
    "logit_bias": (None, {}),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "web_search_options": (None,),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
}
# Fields that change nothing here (bookkeeping for OpenAI's own service): accepted and left out.
IGNORED = ("user", "metadata", "store", "service_tier")
# Fields that change nothing here but whose values are checked are typed fields of the bodies below, each commented.
# Fields of a message that OpenAI's schema allows and we do not implement, with the values that change nothing:
# what the openai client echoes back when a reply's `message` is appended to the conversation.
MESSAGE_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "refusal": (None, ""),
    "function_call": (None,),
    "audio": (None,),
    "annotations": (None, []),
}


@dataclass(slots=True)
class ApiError(Exception):
    """An error answered with OpenAI's error object: `{"error": {"message", "type", "param", "code"}}`."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] | None = None

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict:
        message, param = _encodable(self.message), _encodable(self.param)  # a name the client sent may be echoed
        return {"error": {"message": message, "type": self.type, "param": param, "code": self.code}}


def model_error(error: ModelFileError) -> ApiError:
    """A pair's own failure while it answers (weights that compute NaN): the server's, never the client's — 500
    `server_error`, as a pair that fails to load is (503 `model_load_failed`)."""
    return ApiError(500, str(error), "server_error", code="model_error")


def _encodable(text: str | None) -> str | None:
    """`text` with any lone UTF-16 surrogate written as its escape (it has no UTF-8 bytes to send)."""
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageUrl(_Strict):
    url: str  # a data URL; an http(s) URL or a local path only with `serve --allow-image-urls` (server/images.py)
    detail: Literal["auto", "low", "high"] | None = None  # accepted: the projector reads an image at its own size


class ImageUrlPart(_Strict):
    type: Literal["image_url"]
    image_url: ImageUrl


ContentPart = Annotated[TextPart | ImageUrlPart, Field(discriminator="type")]
PART_TYPES = ("text", "image_url")


def refuse_unknown_parts(data: Any, known: Sequence[str], word: str) -> Any:
    """A request body's `data` as it is, unless a message's content holds a part of a type not in `known`: then a 400
    naming it (`word`: what the protocol calls a part). Read before the body's model, whatever shape it has."""
    for i, m in enumerate(ms if isinstance(data, dict) and isinstance(ms := data.get("messages"), list) else ()):
        content = m.get("content") if isinstance(m, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind not in known:
                raise ApiError(
                    400,
                    f"content {word} type {kind!r} is not supported: use one of {', '.join(known)}",
                    param=f"messages.{i}.content.{j}.type",
                    code="unsupported_value",
                )
    return data


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessageBody(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = Field(default=None, validate_default=True)
    reasoning_content: str | None = None  # an earlier answer's thinking, as llama-server and DeepSeek return it
    name: str | None = None  # a participant's name (multi-agent clients): accepted, and not part of the prompt
    tool_calls: list[ToolCall] | None = None  # an assistant's calls (the round trip)
    tool_call_id: str | None = None  # a tool's result: the call it answers

    @field_validator("content")
    @classmethod
    def _content_given(cls, value, info):
        if value is None and info.data.get("role") != "assistant":  # an assistant's may be null beside its calls
            raise ValueError("'content' is required")
        return value

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    @property
    def image_urls(self) -> list[tuple[int, str]]:
        """(the part's index, its URL) of each `image_url` part, in order."""
        if not isinstance(self.content, list):
            return []
        return [(i, p.image_url.url) for i, p in enumerate(self.content) if isinstance(p, ImageUrlPart)]


class FunctionSpec(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: str = ""
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _an_object(cls, value):
        if value is not None and value.get("type", "object") != "object":
            raise ValueError("a function's parameters are a JSON schema of type 'object'")
        return value


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Strict):
    include_usage: bool = False


class JsonSchemaFormat(_Strict):
    """`response_format.json_schema`: the schema the answer must validate against (OpenAI's structured outputs)."""

    name: Annotated[str, Field(min_length=1, max_length=64)] = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None  # true or false: the answer is constrained to the schema either way

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class Prediction(_Strict):
    """`prediction`: OpenAI's predicted output, a latency hint for its service (the answer is the same without it)."""

    type: Literal["content"]
    content: str | list[TextPart]


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]  # OpenAI's reasoning efforts
Verbosity = Literal["low", "medium", "high"]  # how long OpenAI's own models answer: no lever here
CacheRetention = Literal["in_memory", "in-memory", "24h"]  # OpenAI's prompt cache retention (the client once sent "-")


class ResponseFormat(_Strict):
    """`response_format`: free text, any JSON object, or JSON that validates against a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @field_validator("json_schema")
    @classmethod
    def _schema_given(cls, value):
        if value is not None and value.schema_ is None:
            raise ValueError("'schema' is required: the JSON schema the answer must follow")
        return value


def _within(name: str, bound: Limit) -> AfterValidator:
    def check(value):
        if problem := bound.problem(name, value):
            raise ValueError(problem)
        return value

    return AfterValidator(check)


def _option_fields() -> dict[str, Any]:
    """The request fields of the user options — type, choices and limits, each from the option table
    (core/options.py), so a request is bounded as a flag is — and OpenAI's two penalties."""
    found: dict[str, Any] = {}
    for opt in OPTIONS:
        kind: Any = Literal[opt.choices] if opt.choices else opt.kind
        if opt.limit is not None:
            kind = Annotated[kind, _within(opt.name, opt.limit)]
        found[opt.name] = (kind | None, None)
    for name, bound in REQUEST_PENALTIES.items():
        found[name] = (Annotated[float, _within(name, bound)] | None, None)
    return found


# Sampling fields that are no flag but a request may set, in OpenAI's range for them (the engine takes any number).
REQUEST_PENALTIES = {name: Limit(-2, 2, note="0 = off") for name in ("presence_penalty", "frequency_penalty")}


def _keep_alive(value: Any) -> float | None:
    """A request's `keep_alive` read whatever JSON it is (a type refused in `keep_alive`'s words, not pydantic's)."""
    return None if value is None else keep_alive_value(value)


_OptionFields = create_model("_OptionFields", __base__=_Strict, **_option_fields())


class Extensions(_OptionFields):
    """Our extension fields, the same on every route's body (chat, completions, Messages, Responses): the user
    options of the option table (sampling and speculation: `top_k`, `min_p`, `draft_max`, `adaptive`, …), OpenAI's
    two penalties, and the drafter."""

    drafter: Literal[DRAFTERS] | None = None  # type: ignore[valid-type]
    keep_alive: Annotated[Any, AfterValidator(_keep_alive)] = None  # Ollama's: 300, "5m" (seconds; None: the server's)

    def engine_options(self) -> dict[str, Any]:
        """`request.Request`'s `overrides`, `penalties` and `drafter` (what the body leaves out: the server's)."""
        return {
            "overrides": {name: getattr(self, name) for name in OVERRIDE_OPTIONS if getattr(self, name) is not None},
            "penalties": {name: getattr(self, name) for name in REQUEST_PENALTIES if getattr(self, name) is not None},
            "drafter": self.drafter,
            "keep_alive": self.keep_alive,
        }


class _Common(Extensions):
    """The fields both OpenAI routes share: the extensions, then the model, stop, n, max tokens, streaming."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Field(ge=1, le=N_MAX)] = 1
    response_format: ResponseFormat | None = None
    # llama-server's own, as clients written for it send them:
    n_predict: Annotated[int, Field(ge=-1)] | None = None  # max_tokens by its old name; -1: no limit of its own
    cache_prompt: bool | None = None  # ignored: a prompt shared with an earlier request is reused either way
    id_slot: Annotated[int, Field(ge=-1)] | None = None  # ignored: a request's slot is the one holding its prefix

    @field_validator("n_predict")
    @classmethod
    def _predicts(cls, value):
        if value == 0:
            raise ValueError("at least 1 token, or -1 for the server's limit (as with no max_tokens)")
        return value

    @property
    def token_limit(self) -> int | None:
        """`max_tokens`, else a positive `n_predict` (None: the server's --max-tokens)."""
        return self.max_tokens or (self.n_predict if self.n_predict and self.n_predict > 0 else None)

    @field_validator("response_format")
    @classmethod
    def _format_complete(cls, value):
        if value is not None and value.type == "json_schema" and value.json_schema is None:
            raise ValueError("'json_schema' is required with type 'json_schema'")
        return value

    @property
    def grammar(self) -> Grammar | None:
        """The grammar `response_format` asks for (None: free text)."""
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return Grammar.json_object()
        return Grammar.output_schema(fmt.json_schema.schema_)

    @field_validator("stop")
    @classmethod
    def _stops_not_empty(cls, value):
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > STOP_MAX:
            raise ValueError(f"at most {STOP_MAX} stop strings, not {len(stops)}")
        if any(s == "" for s in stops):
            raise ValueError("a stop string must not be empty")
        return value

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class TemplateKwargs(_Strict):
    """llama-server's and vLLM's `chat_template_kwargs`: the template variables a request may set."""

    enable_thinking: bool | None = None  # a reasoning model thinks or not (its template's switch)


class ChatRequest(_Common):
    messages: Annotated[list[ChatMessageBody], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    chat_template_kwargs: TemplateKwargs | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=TOP_LOGPROBS_MAX)] | None = None
    reasoning_effort: ReasoningEffort | None = None  # a thinking model's switch: on, except at "none" (request.Effort)
    # OpenAI's, for its own service: checked, and they change nothing here
    verbosity: Verbosity | None = None
    prompt_cache_key: str | None = None  # our prompt cache finds a shared prefix by itself
    safety_identifier: str | None = None
    prompt_cache_retention: CacheRetention | None = None
    prediction: Prediction | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_parts(cls, data):
        """A content part of a type we do not read (audio, a file) is refused by its name."""
        return refuse_unknown_parts(data, PART_TYPES, "part")

    @field_validator("top_logprobs")
    @classmethod
    def _with_logprobs(cls, value, info):
        if value and not info.data.get("logprobs"):
            raise ValueError("'top_logprobs' needs 'logprobs': true")
        return value

    @property
    def logprobs_top(self) -> int | None:
        """How many alternatives each token's log-probability comes with (None: no log-probabilities)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("messages")
    @classmethod
    def _tool_results_answer_calls(cls, messages):
        """Each `tool` message answers a call an earlier assistant message made (by `tool_call_id`)."""
        called: set[str] = set()
        for i, m in enumerate(messages):
            if m.role == "tool":
                if m.tool_call_id is None:
                    raise ValueError(f"messages.{i}: a tool message needs 'tool_call_id'")
                if m.tool_call_id not in called:
                    raise ValueError(
                        f"messages.{i}.tool_call_id: {m.tool_call_id!r} answers no call of an earlier assistant message"
                    )
            called.update(c.id for c in m.tool_calls or ())
            if m.tool_calls and m.role != "assistant":
                raise ValueError(f"messages.{i}: only an assistant message has 'tool_calls'")
        return messages

    @field_validator("tool_choice")
    @classmethod
    def _named_tool_exists(cls, value, info):
        if isinstance(value, NamedToolChoice):
            names = {t.function.name for t in info.data.get("tools") or ()}
            if value.function.name not in names:
                raise ValueError(f"tool_choice names {value.function.name!r}, which is not one of the tools")
        return value

    @property
    def tool_mode(self) -> str | None:
        """None (no tools offered, or `none`), "auto", "required" or the named function's name."""
        if not self.tools:
            return None
        choice = self.tool_choice or "auto"
        if isinstance(choice, NamedToolChoice):
            return choice.function.name
        return None if choice == "none" else choice

    @property
    def think(self) -> bool | None:
        return self.chat_template_kwargs.enable_thinking if self.chat_template_kwargs else None


class CompletionRequest(_Common):
    prompt: str | list[str]
    logprobs: Annotated[int, Field(ge=0, le=TOP_LOGPROBS_MAX)] | None = None  # the legacy API: the alternatives

    @property
    def logprobs_top(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("one prompt per request: send a string (or a list of one string)")
        return value

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


def parse_body(
    body: bytes,
    model: type[_Strict],
    *,
    unsupported: dict[str, tuple[Any, ...]] = UNSUPPORTED,
    ignored: tuple[str, ...] = IGNORED,
) -> Any:
    """The request read from a JSON body.

    Raises:
        ApiError: not JSON, not an object, an unsupported field, a wrong type or a value out of range (400, naming
            the field).
    """
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise ApiError(400, f"the body is not valid JSON: {_one_line(e)}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    if _SURROGATE_ESCAPE.search(body) and not _is_unicode(data):
        raise ApiError(
            400,
            "the body has a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape without its pair): send valid Unicode",
            code="invalid_json",
        )
    data = _harmless_left_out(data, unsupported, "", ignored)
    if isinstance(data.get("messages"), list):
        data["messages"] = [
            _harmless_left_out(m, MESSAGE_UNSUPPORTED, f"messages.{i}.") if isinstance(m, dict) else m
            for i, m in enumerate(data["messages"])
        ]
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e) from None
    except RecursionError:
        raise ApiError(400, "the body is nested too deeply", code="invalid_json") from None


def _harmless_left_out(
    data: dict, unsupported: dict[str, tuple[Any, ...]], where: str, ignored: tuple[str, ...] = ()
) -> dict:
    """`data` without the fields we do not implement, each at a value that changes nothing, and without `ignored`;
    such a field at any other value is refused by name (`where` + its name: "messages.1.tool_calls").

    Raises:
        ApiError: 400 unsupported_parameter.
    """
    for name, harmless in unsupported.items():
        if name in data and data[name] not in harmless:
            param = where + name
            raise ApiError(400, f"'{param}' is not supported by localspec", param=param, code="unsupported_parameter")
    return {k: v for k, v in data.items() if k not in unsupported and k not in ignored}


_TYPE_TAGS = ("str", "int", "float", "bool", "list", "dict")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # only an escape can make one: UTF-8 has no bytes for it


def _is_unicode(data: Any) -> bool:
    """Whether every string in the parsed body (keys too) is text that UTF-8 can carry."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _validation_error(error: ValidationError) -> ApiError:
    first = error.errors(include_url=False)[0]
    # A union's member shows in the location ("stop.list[str].0"): the client named only the field and the index.
    parts = [str(p) for p in first["loc"] if not (isinstance(p, str) and ("[" in p or p in _TYPE_TAGS))]
    param = ".".join(parts) or None
    if first["type"] == "extra_forbidden":
        return ApiError(400, f"unknown field '{param}'", param=param, code="unsupported_parameter")
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "missing":
        return ApiError(400, f"'{param}' is required", param=param, code="missing_required_parameter")
    return ApiError(400, f"'{param}': {message}", param=param, code="invalid_value")


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())[:200]


def finite(value: float) -> float:
    """A JSON-safe float (the rates of an empty generation are 0, never NaN)."""
    return value if math.isfinite(value) else 0.0
