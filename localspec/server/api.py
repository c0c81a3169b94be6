"""What every route's request body shares, checked before the engine sees it — the strict read (`parse_body`) and our
extension fields (`Extensions`) — and OpenAI's error object (`ApiError`) for what a request may not ask.

Each protocol's own shapes are its `*_api` module's (OpenAI's chat completions: server/chat_api.py). A body is JSON; its
fields are read strictly (a string is not a number, 1.5 is not an integer). Fields we do not support are refused by name
unless their value is the one that changes nothing (`logprobs: false`, `tools: []`), so no request is silently answered
as if it had asked something else. What a request leaves out is None: the server's flags, then the pair's defaults, then
the engine's decide (`request.Request`). Our extension fields (sampling and speculation options, the drafter) are one
base, `Extensions`, that every route's body shares.
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
    ValidationError,
    create_model,
)

from localspec.core.options import Limit
from localspec.core.params import DRAFTERS, OPTIONS, OVERRIDE_OPTIONS
from localspec.errors import ModelFileError

from .units import keep_alive_value

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
# Fields that change nothing here but whose values are checked are typed fields of the bodies (chat_api.py).
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


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]  # OpenAI's reasoning efforts
Verbosity = Literal["low", "medium", "high"]  # how long OpenAI's own models answer: no lever here
CacheRetention = Literal["in_memory", "in-memory", "24h"]  # OpenAI's prompt cache retention (the client once sent "-")


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
