"""One request's half of the server: what it asks (`Request`), its place in the queue (`Job`), how it runs on the
loaded pair (`steps`: the thinking switch, the prompt, the room, the params, each choice), the typed events it
streams (`Started`, `Token`, `Ended`, then the app's `Done`) and what it leaves (`Outcome`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from localspec.core.engine import Generation, TokenEvent
from localspec.core.generation import SharedBatch
from localspec.core.grammar import CompiledGrammar, Grammar, GrammarError
from localspec.core.kv import KVSequence
from localspec.core.params import DEFAULT_MAX_TOKENS
from localspec.core.session import Message, fewest_tokens
from localspec.core.stats import TokenLogprob
from localspec.core.thinking import ANSWER, Piece, ThinkingSplit
from localspec.core.thinking_support import choose_thinking, thinking_choice
from localspec.core.tools import MARKERS, Function, ToolSetup, detect_syntax, with_tools
from localspec.errors import ChatTemplateError, ContextError, LocalspecError
from localspec.models.loading import sampling_params, speculative_params

from .api import ApiError
from .render import answer_text
from .served import Served

if TYPE_CHECKING:
    from localspec.llama.model import Model

log = logging.getLogger(__name__)


LIGHT_EFFORTS = ("none", "minimal", "low")  # efforts a model that does not think follows as it is: no refusal


@dataclass(frozen=True, slots=True)
class Effort:
    """A reasoning effort as the client sent it (chat's `reasoning_effort`, Responses' `reasoning.effort`): thinking
    on, except at `none` — the model's switch is all there is to set here."""

    field: str  # the field it came in, named by a refusal
    value: str  # one of OpenAI's efforts (api.ReasoningEffort)

    @property
    def think(self) -> bool:
        return self.value != "none"

    @property
    def setting(self) -> str:
        return f'{self.field} = "{self.value}"'


@dataclass(frozen=True, slots=True)
class Request:
    """What one HTTP request asks of the engine, checked: exactly one of `messages` and `prompt`."""

    messages: tuple[Message, ...] | None
    prompt: str | None
    n: int = 1
    max_tokens: int | None = None  # None: the server's --max-tokens (an answer that fills the context ends there)
    stop: tuple[str, ...] = ()
    overrides: Mapping[str, Any] = field(default_factory=dict)  # option name -> value, over the server's flags
    penalties: Mapping[str, float] = field(default_factory=dict)  # presence_penalty / frequency_penalty
    drafter: str | None = None
    think: bool | None = None  # chat_template_kwargs.enable_thinking (None: --think, the pair's, the model's)
    effort: Effort | None = None  # the reasoning effort that set `think`, where one did (not enable_thinking)
    grammar: Grammar | None = None  # what the answer must match (`response_format`); None: free text
    grammar_param: str = "response_format"  # the field that asked for it, named by a refusal
    tool_choice: str | None = None  # "auto", "required" or a function's name; None: no tools
    functions: tuple[Function, ...] = ()
    parallel_tool_calls: bool = True
    logprobs: int | None = None  # each token's log-probability with this many alternatives (None: none)
    max_tokens_room: bool = False  # a max_tokens beyond the room left is the room left (/v1/messages)
    count_only: bool = False  # tokenize the prompt and stop there (Anthropic's count_tokens): no generation
    keep_alive: float | None = None  # seconds its pair stays loaded once idle (Ollama's; None: the server's)


@dataclass(slots=True)
class Outcome:
    """A finished request: the prompt's length and each choice's generation."""

    served: Served
    prompt_tokens: int
    generations: list[Generation]
    splits: list[ThinkingSplit | None] = field(default_factory=list)  # each choice's thinking split (chat)
    tools: ToolSetup | None = None  # the tools offered (their syntax parses each answer)


class Job:
    """One request's place in the queue; `cancel()` stops its generation after the current step."""

    def __init__(self) -> None:
        self._cancelled = threading.Event()
        self.generation: Generation | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()
        if (gen := self.generation) is not None:
            gen.cancel()


@dataclass(frozen=True, slots=True)
class Started:
    """The request is running: its prompt's length and the pair's name (the first event)."""

    prompt_tokens: int
    model: str
    tools: ToolSetup | None = None
    token_bytes: Callable[[int], bytes] | None = None  # the target's token → its bytes (log-probabilities' tokens)


@dataclass(frozen=True, slots=True)
class Token:
    """One token of choice `index`: its text as pieces, a reasoning model's thinking apart (empty texts left out)."""

    index: int
    event: TokenEvent
    pieces: list[Piece]
    logprob: TokenLogprob | None = None  # where asked


@dataclass(frozen=True, slots=True)
class Ended:
    """Choice `index` is finished."""

    index: int
    generation: Generation
    split: ThinkingSplit | None


@dataclass(frozen=True, slots=True)
class Done:
    """The request's future is settled (the app's last event: it carries the result or the error)."""

    future: Future


Event = Started | Token | Ended | Done
Emit = Callable[[Event], None]


PROMPT_CHUNK = 256  # tokens of a prompt read per scheduler tick while others may answer (`Generation.read_prompt`)


def steps(
    served: Served,
    request: Request,
    job: Job,
    emit: Emit,
    *,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    slot: Callable[[list[int]], KVSequence] | None = None,
    shared: SharedBatch | None = None,
) -> Generator[None, None, Outcome]:
    """Run `request` on the loaded pair (engine thread) one step at a time: tokenize, check the room, generate each
    choice; it yields after each step of the engine and returns the `Outcome`
    (`serve --parallel` interleaves several requests' steps, server/scheduler.py).

    Args:
        slot: the target's cache to generate in, given the prompt (a slot of a shared context); None: the engine's.
        shared: the shared batch the slots' streams step in (core/slots.py's `SlotPool`); None: one stream at a time.

    Raises:
        ApiError: a prompt that does not fit the context, a max_tokens beyond it, a value out of range.
    """
    engine = served.engine
    _check_images(served, request.messages or ())  # before the tools' rendering rewrites the messages
    think = _think(served, request) if request.messages is not None else None
    tools = _tools(served, request)
    if tools is not None:
        request = dataclasses.replace(request, messages=with_tools(request.messages or (), tools))
        if (grammar := _tools_grammar(tools)) is not None:
            request = dataclasses.replace(request, grammar=grammar, grammar_param="tools")
    prompt = _prompt_tokens(served, request, think, tools)
    if request.count_only:
        return Outcome(served, len(prompt), [], [], tools)
    max_tokens = _max_tokens(served, request, len(prompt), default_max_tokens)
    sampling, spec = _params(served, request)
    grammar = _grammar(served, request)
    rng = np.random.default_rng(sampling.seed)  # one stream: the n choices are independent draws
    emit(Started(len(prompt), served.name, tools, engine.target_model.token_bytes))
    generations: list[Generation] = []
    splits: list[ThinkingSplit | None] = []
    for index in range(request.n):
        if job.cancelled:
            log.info("choice %d cancelled before it began (client gone or server stopping)", index)
            break
        gen = engine.generate(
            prompt,
            sampling=sampling,
            spec=spec,
            max_tokens=max_tokens,
            stop=request.stop,
            rng=rng,
            grammar=grammar,
            logprobs=request.logprobs,
            target=slot(prompt) if slot is not None else None,
        )
        gen.shared = shared
        split = served.chat_format().splitter(think) if request.messages is not None else None
        job.generation = gen
        if job.cancelled:  # cancelled between the check and the assignment
            gen.cancel()
        yield from gen.read_prompt(PROMPT_CHUNK)  # others may be answering: a long prompt is read a chunk a tick
        repeats = _Repeats(tools, engine.target_model.token_bytes) if tools is not None and tools.parallel else None
        for event in gen:
            pieces = split.feed(event, gen.stats) if split is not None else [(ANSWER, event.text, event.from_draft)]
            scored = gen.logprobs[len(gen.tokens) - 1] if gen.logprobs and event.token is not None else None
            emit(Token(index, event, [p for p in pieces if p[1]], scored))
            if not gen.pending:
                if repeats is not None and repeats.found(gen, split):
                    gen.cancel()  # the list is over: its end, not the client's
                yield  # a step's tokens are out: another request's step may run
        if repeats is not None and repeats.hit and gen.finish_reason == "cancelled" and not job.cancelled:
            gen.finish_reason = "stop"
            log.info("choice %d: a tool call repeated an earlier one, which ends the list", index)
        if gen.finish_reason == "cancelled":  # the caches are consistent: Generation checked the invariant
            log.info("choice %d cancelled after %d tokens (client gone or server stopping)", index, len(gen.tokens))
        for note in gen.notices:  # what the user of a terminal is shown (a full pool, a full context): the log's
            log.warning("choice %d: %s", index, note)
        generations.append(gen)
        splits.append(split)
        emit(Ended(index, gen, split))
    return Outcome(served, len(prompt), generations, splits, tools)


class _Repeats:
    """Whether a list of tool calls has reached a call identical to an earlier one: a model that repeats its call
    (a small one asked for a required call) would go on to max_tokens, and the list ends there instead (issue 55).
    Looked at after each step whose text holds a call's last character."""

    def __init__(self, tools: ToolSetup, token_bytes: Callable[[int], bytes]) -> None:
        self.tools, self.token_bytes = tools, token_bytes
        self.read, self.hit = 0, False

    def found(self, gen: Generation, split: ThinkingSplit | None) -> bool:
        text = answer_text(self.tools, gen, split, self.token_bytes)
        new, self.read = text[self.read :], len(text)
        if not self.hit and ("}" in new or ">" in new):
            self.hit = self.tools.repeats(text)
        return self.hit


def _tools(served: Served, request: Request) -> ToolSetup | None:
    """The request's tools in the model's syntax (None: no tools, or `tool_choice: none`)."""
    if request.tool_choice is None or request.messages is None:
        return None
    try:
        fmt = served.chat_format()
    except ChatTemplateError as e:
        raise ApiError(400, str(e), param="messages", code="chat_template_error") from None
    syntax = detect_syntax(fmt.template, fmt.reads)
    if syntax == "generic":
        return ToolSetup(syntax, request.functions, request.tool_choice, request.parallel_tool_calls)
    special_ids = served.engine.grammar_vocab().special_ids
    specials = special_markers(served.engine.target_model, MARKERS.get(syntax, ()), special_ids)
    free = ()
    if request.tool_choice == "auto" and syntax != "llama3":  # a lazy grammar: free text first
        free = tuple(i for i in special_ids if i not in specials.values())
    return ToolSetup(syntax, request.functions, request.tool_choice, request.parallel_tool_calls, specials, free)


def _tools_grammar(tools: ToolSetup) -> Grammar | None:
    try:
        return tools.grammar()
    except GrammarError as e:
        raise ApiError(400, str(e), param="tools", code="invalid_schema") from None


def special_markers(model: Model, texts: Sequence[str], special_ids: Sequence[int]) -> dict[str, int]:
    """The markers the vocabulary holds as one special token (Qwen's user-defined `<tool_call>`, Gemma 4's control
    `<|tool_call>`: what a grammar names by id, no text matching it), by id."""
    special = set(special_ids)
    out = {}
    for text in texts:
        ids = model.tokenize(text, parse_special=True)
        if len(ids) == 1 and ids[0] in special:
            out[text] = ids[0]
    return out


def _grammar(served: Served, request: Request) -> CompiledGrammar | None:
    """The request's grammar compiled for the target's vocabulary.

    Raises:
        ApiError: a schema or grammar the library cannot compile (400, naming what it refused).
    """
    if request.grammar is None:
        return None
    try:
        return served.engine.compile_grammar(request.grammar)
    except GrammarError as e:
        raise ApiError(400, str(e), param=request.grammar_param, code="invalid_schema") from None


def _think(served: Served, request: Request) -> bool | None:
    """The thinking switch of a chat request: its own (`chat_template_kwargs.enable_thinking`, else a reasoning
    effort: none, minimal and low ask nothing of a model that does not think), else the server's --think, else the
    pair's `thinking`.

    Raises:
        ApiError: the model cannot follow it (400).
    """
    own = thinking_choice(request.think, "request")
    effort = request.effort
    if own is not None and effort is not None:
        own = dataclasses.replace(own, setting=effort.setting)
    choices = (
        own,
        thinking_choice(served.think_flag, "serve"),
        thinking_choice(served.defaults.thinking, "pair", served.name),
    )
    if not any(choices):
        return None  # the model decides: its template need not even render here
    try:
        support = served.chat_format().thinking
    except ChatTemplateError as e:
        raise ApiError(400, str(e), param="messages", code="chat_template_error") from None
    if effort is not None and effort.value in LIGHT_EFFORTS and not support.thinks:
        choices = (None, *choices[1:])  # little or no thinking asked of a model that has none: it answers as it is
    try:
        return choose_thinking(support, served.name, *choices)
    except LocalspecError as e:
        param = None  # the server's or the pair's setting: not the request's to fix
        if choices[0] is not None:
            param = effort.field if effort is not None else "chat_template_kwargs.enable_thinking"
        raise ApiError(400, str(e), param=param, code="unsupported_value") from None


def _prompt_tokens(
    served: Served, request: Request, think: bool | None = None, tools: ToolSetup | None = None
) -> list[int]:
    engine = served.engine
    if request.messages is not None:
        what, subject, them = "messages", "the messages are", "them"
        n = len(request.messages)
        if n >= engine.n_ctx:  # every template spends a token or more on each message's role
            raise _too_long(f"{subject} {n} messages but the context holds {engine.n_ctx} tokens: send fewer", what)
        try:
            native = tools.openai_tools() if tools is not None and tools.syntax != "generic" else None
            tokens = served.chat_format().tokens(request.messages, think=think, limit=engine.n_ctx, tools=native)
        except ChatTemplateError as e:
            raise ApiError(400, str(e), param="messages", code="chat_template_error") from None
        except ContextError as e:  # told from the text's length alone, before a tokenizer pass over all of it
            raise _too_long(f"{e}: shorten {them}", what) from None
        except LocalspecError as e:  # an image libmtmd could not decode: its header was sound, its data is not
            raise ApiError(400, str(e), param=what, code="invalid_image") from None
    else:
        what, subject, them = "prompt", "the prompt is", "it"
        prompt = request.prompt or ""
        at_least = fewest_tokens(engine.target_model, len(prompt.encode()))
        if at_least >= engine.n_ctx:
            holds = f"the context holds {engine.n_ctx}"
            raise _too_long(f"{subject} at least {at_least} tokens but {holds}: shorten it", what)
        tokens = engine.tokenize(prompt)
    if not tokens:
        raise ApiError(400, f"{subject} empty: give some text to continue", param=what)
    if len(tokens) >= engine.n_ctx:
        n_image = sum(t < 0 for t in tokens)  # an image's positions are negative ids (core/media.py)
        of = f" ({n_image} of them images' positions)" if n_image else ""
        fix = f"send fewer images or shorten {them}" if n_image else f"shorten {them}"
        raise _too_long(f"{subject} {len(tokens)} tokens{of} but the context holds {engine.n_ctx}: {fix}", what)
    return tokens


def _check_images(served: Served, messages: Sequence[Message]) -> None:
    """Refuse images to a pair that reads none, naming the fix (raises `ApiError`, 400)."""
    if not any(m.images for m in messages):
        return
    media = served.engine.media
    if media is not None and media.sees_images:
        return
    why = "its projector reads audio only" if media is not None else "it was loaded without a projector"
    raise ApiError(
        400,
        f"the model {served.name} reads no images ({why}): send text only, or restart the server with a projector "
        "for it (--mmproj PATH, or a pair with mmproj in models.toml)",
        param="messages",
        code="unsupported_value",
    )


def _too_long(why: str, what: str) -> ApiError:
    return ApiError(
        400, f"{why}, or restart the server with a larger --n-ctx", param=what, code="context_length_exceeded"
    )


def _max_tokens(served: Served, request: Request, n_prompt: int, default: int) -> int:
    n_ctx = served.engine.n_ctx
    if request.max_tokens is None:
        return default  # a generation that fills the context ends there ("length")
    if n_prompt + request.max_tokens > n_ctx and request.max_tokens_room:
        return n_ctx - n_prompt
    if n_prompt + request.max_tokens > n_ctx:
        raise ApiError(
            400,
            f"max_tokens {request.max_tokens} does not fit the context: the prompt is {n_prompt} tokens and the "
            f"context holds {n_ctx}, so at most {n_ctx - n_prompt} can be generated",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return request.max_tokens


def _params(served: Served, request: Request):
    overrides = dict(request.overrides)
    served.use_drafter(request.drafter or served.loaded_drafter)  # what the request leaves out: the server's
    try:
        sampling = sampling_params(overrides, served.defaults)
        sampling = dataclasses.replace(sampling, **request.penalties)
        spec = speculative_params(overrides, served.defaults)
    except LocalspecError as e:
        raise ApiError(400, str(e)) from None
    return sampling, spec
