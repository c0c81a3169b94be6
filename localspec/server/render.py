"""OpenAI's chat completions and completions written from the neutral `Answer` (server/answer.py): `chat_body`, the
whole response object, and `chat_stream`, its chunks.

`usage` has OpenAI's fields; `timings` beside it uses llama-server's names (`prompt_n`, `cache_n`, `predicted_n`,
`predicted_per_second`, `draft_n`, `draft_n_accepted`), so tools that read llama-server read us; our own
speculation stats (DESIGN §5) go under the one extra key `localspec`. A streamed answer carries them in its last
choice's finish chunk. A reasoning model's thinking goes in `reasoning_content` (the message, or the stream's
deltas), as llama-server and DeepSeek's API put it, and its tokens in
`usage.completion_tokens_details.reasoning_tokens`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from localspec.core.stats import TokenLogprob
from localspec.core.thinking import THINKING

from .answer import Answer, Choice, Delta, Event, Failure
from .answer import answer_text as answer_text  # request.py reads it here

Scored = tuple[int, TokenLogprob]  # a token and its log-probability


def chat_body(answer: Answer, kind: str) -> dict:
    """The non-streaming response: a chat completion (`kind` "chat") or a text completion ("text")."""
    writer = _Writer(answer, kind)
    return {**writer.head(False), "choices": [writer.choice(c) for c in answer.choices], **usage_and_stats(answer)}


async def chat_stream(
    answer: Answer, events: AsyncIterator[Event], kind: str, n: int, include_usage: bool
) -> AsyncIterator[bytes]:
    """The chunks of a streamed answer: per choice the role (chat), the text deltas, the finish (the last choice's
    with `timings` and `localspec`); then the usage where `stream_options.include_usage` asks; `[DONE]`."""
    writer = _Writer(answer, kind)
    async for event in events:
        if isinstance(event, Delta):
            chunks = writer.delta_chunks(event)
        elif isinstance(event, Choice):
            chunks = writer.end_chunks(event, last=event.index == n - 1)
        else:
            assert isinstance(event, Failure)
            chunks = [event.error.body()]
        for chunk in chunks:
            yield sse(chunk)
    if include_usage and answer.choices:
        yield sse({**writer.head(True), "choices": [], **usage_and_stats(answer)})
    yield sse("[DONE]")


def usage_and_stats(answer: Answer) -> dict:
    """OpenAI's `usage`, then the `timings` and `localspec` extension keys."""
    u = answer.usage()
    usage = {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }
    if u.reasoning_tokens is not None:  # OpenAI's count of the thinking tokens (part of completion_tokens)
        usage["completion_tokens_details"] = {"reasoning_tokens": u.reasoning_tokens}
    return {"usage": usage, **answer.stats()}


def sse(obj: dict | str) -> bytes:
    """One server-sent event: `data: <json>` (or `data: [DONE]`)."""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


@dataclass(slots=True)
class _Writer:
    """One response's objects: what they share (id, creation time, model, kind) and each choice, chunk, log-prob."""

    answer: Answer
    kind: str  # "chat" or "text"
    id: str = ""
    created: int = 0
    started: set[int] = field(default_factory=set)  # the choices whose role chunk is out (a chat stream)

    def __post_init__(self) -> None:
        self.id = ("chatcmpl-" if self.kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def head(self, chunk: bool) -> dict:
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        obj += ".chunk" if chunk and self.kind == "chat" else ""
        return {"id": self.id, "object": obj, "created": self.created, "model": self.answer.model,
                "system_fingerprint": None}  # fmt: skip

    def choice(self, choice: Choice) -> dict:
        """A choice of the whole response."""
        scored = choice.logprobs
        if self.kind == "text":
            return {"index": choice.index, "text": choice.text, "logprobs": self._legacy(scored),
                    "finish_reason": choice.finish}  # fmt: skip
        message = {"role": "assistant", "content": choice.text, "refusal": None}
        if choice.calls:
            message["tool_calls"] = choice.calls
        if choice.reasoning:
            message["reasoning_content"] = choice.reasoning
        logprobs = {"content": [self._entry(*s) for s in scored], "refusal": None} if scored else None
        return {"index": choice.index, "message": message, "logprobs": logprobs, "finish_reason": choice.finish}

    def delta_chunks(self, delta: Delta) -> list[dict]:
        """A token's chunks: the role first (chat), then its text — the thinking in `reasoning_content` deltas; with
        tools the answer waits to be parsed at its end — its log-probability with its first piece (or alone)."""
        out = self._role(delta.index)
        if delta.logprob is not None and not delta.pieces:  # a token whose text is held back still has its logprob
            out.append(self._chunk(delta.index, "", logprob=delta.logprob))
        for k, (part, text, _) in enumerate(delta.pieces):
            if self.answer.tools is None or part == THINKING:
                lp = delta.logprob if k == 0 else None
                out.append(self._chunk(delta.index, text, reasoning=part == THINKING, logprob=lp))
        return out

    def end_chunks(self, choice: Choice, last: bool) -> list[dict]:
        """A choice's last chunks: its content and tool calls where tools were offered, then its finish."""
        out = []
        if self.answer.tools is not None:
            out = self._role(choice.index) + self._tool_chunks(choice)
        extra = self.answer.stats() if last else None  # the answer's last chunk carries the timings and our stats
        return [*out, self._chunk(choice.index, "", finish=choice.finish, extra=extra)]

    def _role(self, index: int) -> list[dict]:
        if self.kind != "chat" or index in self.started:
            return []
        self.started.add(index)
        return [self._chunk(index, "", first=True)]

    def _tool_chunks(self, choice: Choice) -> list[dict]:
        """The content, then each call as OpenAI streams one (the id, type and name first, then the arguments)."""
        out = [self._chunk(choice.index, choice.text)] if choice.text else []
        for i, call in enumerate(choice.calls):
            name = call["function"]["name"]
            head = {"index": i, "id": call["id"], "type": "function", "function": {"name": name, "arguments": ""}}
            body = {"index": i, "function": {"arguments": call["function"]["arguments"]}}
            out += [self._delta(choice.index, {"tool_calls": [part]}) for part in (head, body)]
        return out

    def _delta(self, index: int, delta: dict) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return {**self.head(True), "choices": [choice]}

    def _chunk(
        self,
        index: int,
        text: str,
        *,
        first: bool = False,
        finish: str | None = None,
        extra: dict | None = None,
        reasoning: bool = False,
        logprob: Scored | None = None,
    ) -> dict:
        if self.kind == "chat":
            key = "reasoning_content" if reasoning else "content"
            delta: dict = {"role": "assistant", "content": ""} if first else ({key: text} if text else {})
            scored = {"content": [self._entry(*logprob)], "refusal": None} if logprob else None
            choice = {"index": index, "delta": delta, "logprobs": scored, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text, "logprobs": self._legacy([logprob] if logprob else None)}
            choice["finish_reason"] = finish
        return {**self.head(True), "choices": [choice], **(extra or {})}

    def _entry(self, token: int, scored: TokenLogprob) -> dict:
        """One token of chat's `logprobs.content`: its text, bytes, log-probability and the top alternatives."""
        text, raw = self.answer.piece(token)
        top = []
        for alt, lp in scored.top:
            alt_text, alt_raw = self.answer.piece(alt)
            top.append({"token": alt_text, "logprob": lp, "bytes": alt_raw})
        return {"token": text, "logprob": scored.logprob, "bytes": raw, "top_logprobs": top}

    def _legacy(self, scored: list[Scored] | None) -> dict | None:
        """The completions API's `logprobs`: tokens, their log-probabilities, the alternatives, the text offsets."""
        if not scored:
            return None
        tokens, offsets, at = [], [], 0
        for token, _ in scored:
            text = self.answer.piece(token)[0]
            tokens.append(text)
            offsets.append(at)
            at += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for _, lp in scored],
            "top_logprobs": [{self.answer.piece(t)[0]: v for t, v in lp.top} for _, lp in scored],
            "text_offset": offsets,
        }
