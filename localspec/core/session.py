"""A multi-turn chat on an `Engine` (DESIGN §4).

Each turn renders the whole conversation with the model's chat template and hands the tokens to the
engine, whose `KVSequence.sync` keeps the common prefix in BOTH caches and decodes only the new suffix.
Message text is tokenized with special-token parsing off, so typing `<|im_end|>` stays text: only
the template's own markup yields control tokens. When the conversation outgrows n_ctx, the oldest
turns are left out of the rendering (the system prompt stays) and the turn says so; the caches are
shifted to the shorter window where the memory allows it (`window`), so the turn still decodes only
its new tokens. Reasoning models (DESIGN §10): an answer's thinking is kept apart (`Message.reasoning`) and handed
back to the template the way it reads it, so its own rule decides what a later turn keeps (Qwen3's drops it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from localspec.errors import ChatTemplateError, ContextError, InvalidParamsError
from localspec.llama.model import Model
from localspec.llama.pictures import Image
from localspec.llama.templates import render_builtin_chat, render_jinja_chat, template_variables

from . import thinking, thinking_support, window
from .engine import Engine, GenerateOptions, Generation
from .params import DEFAULT_MAX_TOKENS

log = logging.getLogger(__name__)

# A cut leaves the window this full (of the room left after the answer's reserve), like llama-server's
# context shift: a turn's cost grows with the context it attends to, so a chat past the fill runs
# between half and full, not always full; and a model that must re-read does so once per many turns.
CUT_TO = 0.5


@dataclass(frozen=True, slots=True)
class Message:
    role: str  # "system", "user", "assistant" (or "tool": a tool's result)
    content: str  # an answer's text without its thinking
    reasoning: str = ""  # an answer's thinking (markers out)
    tool_calls: tuple[dict, ...] = ()  # an assistant's calls: {"id", "type", "function": {"name", "arguments"}}
    tool_call_id: str = ""  # a tool's result: the call it answers
    images: tuple[Image, ...] = ()  # pictures the message shows, before its text (a pair with a projector reads them)


class ChatFormat:
    """Renders messages to token ids with the GGUF's Jinja template or a named llama.cpp template.

    `thinking` says what the model does about thinking; `tokens(messages, think=…)` passes the switch to the
    template, and an answer's thinking goes to it as `reasoning_content` where the template reads that field,
    else inside the content between the markers (a template that splits content at `</think>` drops it itself).
    """

    def __init__(
        self, model: Model, template_name: str | None = None, *, images: Callable[[Image], list[int]] | None = None
    ) -> None:
        self.model = model
        self.images = images  # an image's tokens as the target reads it (`Engine.image_tokens`); None: text only
        self.template_name = template_name
        self.template = None if template_name else model.chat_template()
        if template_name is None and self.template is None:
            raise ChatTemplateError(
                f"{model.path.name} has no chat template: pass --chat-template NAME "
                f"(e.g. chatml, llama3, gemma) or set chat_template for the pair in models.toml"
            )
        if template_name is not None:
            render_builtin_chat(template_name, [])  # fail early on an unknown name
        control = sorted(model.control_tokens(), key=len, reverse=True)
        self._control_re = re.compile("|".join(map(re.escape, control))) if control else None
        self.thinking = thinking_support.detect(model, self.template)

    def tokens(
        self,
        messages: Sequence[Message],
        *,
        think: bool | None = None,
        limit: int | None = None,
        tools: list[dict] | None = None,
    ) -> list[int]:
        """Token ids of the conversation followed by the assistant's generation prompt.

        Args:
            messages: the conversation.
            think: turn thinking on or off through the template's switch (None: the model's default; ignored by a
                template without a switch — `ThinkingSupport.check` is the callers' refusal).
            limit: when given, a conversation whose text alone proves it `limit` tokens or more is refused before it
                is tokenized (a huge body then costs a rendering, not a tokenizer pass).
            tools: the template's `tools` variable (OpenAI's shape), for a template that renders tools.

        Raises:
            ContextError: the conversation is at least `limit` tokens (only with `limit`).
        """
        entries, texts = self._marked(messages)
        rendered = self._render(entries, think, tools)
        pieces: list[tuple[str | Image, bool]] = []  # (text or an image, is_markup)
        pos = 0  # where the rest of the rendering starts (an index: copying the rest per message is quadratic)
        for mark, text, required in texts:
            at = rendered.find(mark, pos)
            if at < 0:
                if required:
                    raise ChatTemplateError("the chat template dropped a message; choose another --chat-template")
                continue  # the template left this thinking out (its rule for past turns)
            pieces += [(rendered[pos:at], True), (text, False)]
            pos = at + len(mark)
        pieces.append((rendered[pos:], True))
        if limit is not None:
            n_bytes = sum(len(text.encode()) for text, _ in pieces if isinstance(text, str))
            at_least = fewest_tokens(self.model, n_bytes)
            if at_least >= limit:
                raise ContextError(f"the conversation is at least {at_least} tokens but the context holds {limit}")
        return self._tokenize(pieces)

    def splitter(self, think: bool | None = None) -> thinking.ThinkingSplit:
        """A fresh split of one answer into thinking and answer (everything is answer for a model that does not
        think), for a prompt rendered with `think`; feed it the answer's events."""
        return thinking.ThinkingSplit(
            self.thinking.markers, opened=self.opens_thinking(think), token_bytes=self.model.token_bytes
        )

    def opens_thinking(self, think: bool | None = None) -> bool:
        """Whether the generation prompt leaves thinking open (the template wrote the start marker)."""
        if not self.thinking.thinks:
            return False
        mark = f"\u27e6{uuid.uuid4().hex}\u27e7"
        tail = self._render([{"role": "user", "content": mark}], think).rpartition(mark)[2]
        return thinking.opened_by(self.thinking.markers, tail)

    def _marked(self, messages: Sequence[Message]) -> tuple[list[dict[str, Any]], list[tuple[str, str | Image, bool]]]:
        """The messages with a mark for each text, and (mark, text, required) in rendering order.

        The template renders marks, which are then replaced by the texts tokenized as text: its markup alone may
        yield control tokens. An answer's thinking is an optional mark: the template may leave it out.
        """
        entries: list[dict[str, Any]] = []
        texts: list[tuple[str, str | Image, bool]] = []
        markers = self.thinking.markers
        for message in messages:
            mark = f"\u27e6{uuid.uuid4().hex}\u27e7"
            entry = {"role": message.role, "content": mark}
            if message.reasoning and markers is not None:
                thought = f"\u27e6{uuid.uuid4().hex}\u27e7"
                if self.thinking.reasoning_field:
                    entry["reasoning_content"] = thought
                else:  # the model's own form; a template that splits content at the end marker drops the thought
                    entry["content"] = f"{markers.start}\n{thought}\n{markers.end}\n\n{mark}"
                texts.append((thought, message.reasoning, False))
            if message.tool_calls:  # a template writes the calls itself; the arguments as the mapping it reads
                entry["tool_calls"] = [_readable_call(c) for c in message.tool_calls]
            if message.tool_call_id:
                entry["tool_call_id"] = message.tool_call_id
            if message.images:  # each image a mark of its own, before the text (the tokens of `images`)
                if self.images is None:
                    raise InvalidParamsError(
                        f"{self.model.path.name} reads no images: load it with its projector (--mmproj PATH, or a "
                        "pair with mmproj in models.toml)"
                    )
                seen = [(f"\u27e6{uuid.uuid4().hex}\u27e7", image) for image in message.images]
                entry["content"] = "".join(m for m, _ in seen) + entry["content"]
                texts += [(m, image, True) for m, image in seen]
            entries.append(entry)
            texts.append((mark, message.content, not message.tool_calls))  # beside calls, content may be left out
        return entries, texts

    def _render(self, messages: list[dict], think: bool | None = None, tools: list[dict] | None = None) -> str:
        if self.template_name:
            return render_builtin_chat(self.template_name, messages)
        m = self.model
        variables = {**self.thinking.variables(think), **({"tools": tools} if tools else {})}
        return render_jinja_chat(
            self.template,
            messages,
            bos=m.token_piece_text(m.info.bos),
            eos=m.token_piece_text(m.info.eos),
            variables=variables,
        )

    @property
    def reads(self) -> frozenset[str]:
        """The variables the template reads (`tools`, `enable_thinking`, …); none for a built-in template."""
        return template_variables(self.template) if self.template else frozenset()

    def _tokenize(self, pieces: list[tuple[str | Image, bool]]) -> list[int]:
        # Split markup at control tokens; tokenize each run of plain text (markup and message text
        # joined, as one tokenizer call would see it) with special parsing off.
        out: list[int] = []
        run: list[str] = []  # the plain text since the last control token, in pieces (joined once: linear)
        controls = self.model.control_tokens()

        def flush() -> None:
            text = "".join(run)
            out.extend(self.model.tokenize(text) if text else [])
            run.clear()

        for text, is_markup in pieces:
            if not isinstance(text, str):  # an image: its own tokens, between the text around it
                assert self.images is not None
                flush()
                out.extend(self.images(text))
                continue
            if not is_markup or self._control_re is None:
                run.append(text)
                continue
            pos = 0
            for hit in self._control_re.finditer(text):
                run.append(text[pos : hit.start()])
                flush()
                out.append(controls[hit.group()])
                pos = hit.end()
            run.append(text[pos:])
        flush()
        info = self.model.info
        if info.add_bos and info.bos >= 0 and (not out or out[0] != info.bos):
            out.insert(0, info.bos)
        return out


def _readable_call(call: dict) -> dict:
    """An OpenAI tool call with its arguments as a mapping (templates write them with `tojson`)."""
    function = dict(call.get("function", {}))
    with contextlib.suppress(ValueError):  # not JSON: the template gets the text as it came
        function["arguments"] = json.loads(function.get("arguments") or "{}")
    return {**call, "function": function, **function}  # Hermes templates read call.name; OpenAI's, call.function


def fewest_tokens(model: Model, n_bytes: int) -> int:
    """A lower bound on the tokens of a text of `n_bytes` bytes: n_bytes / the longest token's bytes (0 for a text
    of 256 bytes or less, so that the vocabulary is read only for a text long enough to tell)."""
    return 0 if n_bytes <= 256 else -(-n_bytes // model.longest_token_bytes())


class AnswerOptions(GenerateOptions, total=False):
    """`ChatSession`'s keywords: `Engine.generate`'s (`GenerateOptions`) and `think`."""

    think: bool | None  # the template's thinking switch (default None: the model's default)


class ChatSession:
    """A conversation kept warm in the engine's caches.

    Args:
        engine: the loaded models.
        system: an optional system prompt (always kept when old turns are dropped).
        template_name: a llama.cpp built-in template name instead of the GGUF's own.
        messages: a conversation to continue instead of `system` (copied: the session owns its list).

    `send`, `reply` and `regenerate` keep the conversation in `messages`: the answer joins it when its
    iteration ends. An owner that keeps the conversation itself (the chat app's `Conversation`, on its UI
    thread) calls `answer(messages)` instead, which reads the messages it is given and writes none.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        system: str | None = None,
        template_name: str | None = None,
        messages: list[Message] | None = None,
    ) -> None:
        self.engine = engine
        self.format = ChatFormat(engine.target_model, template_name, images=engine.image_tokens)
        if messages is None:
            messages = [Message("system", system)] if system else []
        self.messages: list[Message] = list(messages)
        self.dropped = 0  # oldest messages left out of the last rendering to fit n_ctx
        self._cut: Message | None = None  # the first message of that rendering (to notice replaced messages)
        self.shifts = 0  # cuts handled by shifting the caches (only the new turn decoded)
        self.block_drops = 0  # cuts handled by dropping a block of turns and re-reading the rest
        self.render_mismatches = 0  # shifts whose kept tokens differed from the fresh rendering
        self.shift_fallback: str | None = None  # why this chat no longer tries to shift

    def send(self, text: str, **options: Unpack[AnswerOptions]) -> Generation:
        """Add a user message and start the assistant's answer with `options` (`AnswerOptions`); iterate the result
        to stream it. The answer (partial if stopped early) joins the conversation when the iteration ends, its
        thinking apart."""
        self.messages.append(Message("user", text))
        return self.reply(**options)

    def regenerate(self, **options: Unpack[AnswerOptions]) -> Generation:
        """Drop the last answer and generate it again."""
        if self.messages and self.messages[-1].role == "assistant":
            self.messages.pop()
        if not self.messages or self.messages[-1].role != "user":
            raise ContextError("nothing to regenerate: send a message first")
        return self.reply(**options)

    def reply(self, **options: Unpack[AnswerOptions]) -> Generation:
        """Start the answer to `messages` as they stand (ending with a user message); it joins them at the end.

        Raises:
            ContextError: the conversation does not end with a user message, or it does not fit n_ctx.
        """
        generation = self.answer(self.messages, **options)
        opened = self.format.opens_thinking(options.get("think"))

        def join(g: Generation) -> None:
            reasoning, content = thinking.split_text(self.format.thinking.markers, g.text, opened=opened)
            self.messages.append(Message("assistant", content, reasoning))

        generation.on_finish = join
        return generation

    def answer(
        self,
        messages: Sequence[Message],
        *,
        think: bool | None = None,
        tools: list[dict] | None = None,
        **options: Unpack[GenerateOptions],
    ) -> Generation:
        """Start the assistant's answer to `messages`, a conversation its caller keeps (and adds the answer to).

        The caches stay warm from one call to the next as long as each conversation continues the last one.
        `think` is passed to the template's thinking switch (None: the model's default); `splitter(think)`
        separates the answer's thinking as it streams; `tools` is the template's `tools` variable (core/tools.py).
        `options`: as `Engine.generate` takes them.

        Raises:
            ContextError: `messages` does not end with a user message or a tool's result, or it does not fit n_ctx.
        """
        if not messages or messages[-1].role not in ("user", "tool"):
            raise ContextError("nothing to answer: send a message first")
        prompt = self._fit(messages, options.get("max_tokens", DEFAULT_MAX_TOKENS), think, tools)
        generation = self.engine.generate(prompt, **options)
        if self.dropped:
            generation.notices.append(
                f"the conversation is longer than the context: the {self.dropped} oldest messages were left out"
            )
        return generation

    def splitter(self, think: bool | None = None) -> thinking.ThinkingSplit:
        """A fresh split of one answer into thinking and answer (see `ChatFormat.splitter`)."""
        return self.format.splitter(think)

    def _fit(
        self, messages: Sequence[Message], max_tokens: int, think: bool | None = None, tools: list[dict] | None = None
    ) -> list[int]:
        """Tokens of the longest recent window of the conversation that leaves room for an answer.

        The window starts where the last one did (one rendering per turn while it fits). When it no
        longer fits, a binary search over later user messages finds the start that leaves it about half
        full (`CUT_TO`), and the caches are shifted to it (`window.shift_caches`), so only the new turn
        is decoded. Where they cannot be shifted they re-read the window: once per many turns.
        """
        n_ctx = self.engine.n_ctx
        room = n_ctx - min(max_tokens, n_ctx // 2)
        system = [m for m in messages[:1] if m.role == "system"]
        turns = list(messages[len(system) :])
        start = self.dropped
        if not (start < len(turns) and turns[start] is self._cut):
            start = 0  # the messages were replaced (a resumed or edited chat): search from the beginning
        tokens = self.format.tokens(system + turns[start:], think=think, tools=tools)
        if len(tokens) > room:
            start, tokens = self._cut_window(system, turns, start, tokens, room, (think, tools))
        self.dropped, self._cut = start, turns[start] if turns else None
        return tokens

    def _cut_window(self, system, turns, start, tokens, room, render) -> tuple[int, list[int]]:
        starts = [i for i in range(start + 1, len(turns)) if turns[i].role == "user"]
        seqs = list(self.engine.caches)
        if window.can_shift(seqs) and self.shift_fallback is None:
            found = self._first_fit(system, turns, starts, int(room * CUT_TO), render) or self._first_fit(
                system, turns, starts, room, render
            )
            if found is not None:
                new_start, new_tokens = found
                plan = window.plan_shift(self.engine.target.tokens, tokens, new_tokens)
                if plan is not None and not plan.exact:
                    self.render_mismatches += 1
                    if not window.worth_it(plan, self.engine.target.tokens, new_tokens):
                        self.shift_fallback = "the chat template renders a shortened conversation differently"
                        log.warning("no context shifting for this chat: %s", self.shift_fallback)
                if self.shift_fallback is None and window.shift_caches(seqs, tokens, new_tokens) is not None:
                    self.shifts += 1
                    return new_start, new_tokens
        # A block drop (the caches will re-read the window): the next re-read is many turns away.
        found = self._first_fit(system, turns, starts, int(room * CUT_TO), render) or self._first_fit(
            system, turns, starts, room, render
        )
        if found is None:
            raise ContextError(
                f"the last message does not fit in the context ({self.engine.n_ctx} tokens): "
                "shorten it or raise --n-ctx"
            )
        self.block_drops += 1
        return found

    def _first_fit(self, system, turns, starts, budget, render) -> tuple[int, list[int]] | None:
        """The earliest start in `starts` whose window fits `budget` (binary search: O(log n) renderings; `render`:
        the thinking switch and the tools the template renders)."""
        lo, hi, best = 0, len(starts), None
        while lo < hi:
            mid = (lo + hi) // 2
            tokens = self.format.tokens(system + turns[starts[mid] :], think=render[0], tools=render[1])
            if len(tokens) <= budget:
                best, hi = (starts[mid], tokens), mid
            else:
                lo = mid + 1
        return best

    def clear(self) -> None:
        """Start a new conversation (the system prompt stays)."""
        del self.messages[1 if self.messages[:1] and self.messages[0].role == "system" else 0 :]
        self.dropped, self._cut = 0, None
