"""OpenAI's chat completions and completions bodies: their wire shapes, checked strictly (`ChatRequest`,
`CompletionRequest`, on server/api.py's strict base and extension fields), and as the routes read them (`ChatBody`,
`CompletionBody`) with `to_request()`, their translation onto the engine's `request.Request` — the turns, the prompt,
tools, thinking, structured output, log-probabilities and our extension fields. They live apart from api.py because
the engine side (request.py) imports api.py's `ApiError`: api.py cannot import `request.Request` back.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from localspec.core.grammar import Grammar, GrammarError
from localspec.core.session import Message
from localspec.core.tools import Function

from .api import ApiError, CacheRetention, Extensions, ReasoningEffort, Verbosity, _Strict, refuse_unknown_parts
from .images import DATA_ONLY, ImageReader
from .request import Effort, Request

STOP_MAX = 16  # stop strings per request
N_MAX = 16  # choices per request
TOP_LOGPROBS_MAX = 20  # alternatives per token's log-probability, as OpenAI allows


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
        schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
        assert schema is not None  # the validators require both with type 'json_schema'
        return Grammar.output_schema(schema)

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
