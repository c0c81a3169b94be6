"""OpenAI's response objects from our generations: whole answers, stream chunks, usage and timings.

`usage` has OpenAI's fields; `timings` beside it uses llama-server's names (`prompt_n`, `cache_n`, `predicted_n`,
`predicted_per_second`, `draft_n`, `draft_n_accepted`), so tools that read llama-server read us; our own
speculation stats (DESIGN §5) go under the one extra key `localspec`. A streamed answer carries them in its last
chunk. A reasoning model's thinking goes in `reasoning_content` (the message, or the stream's deltas), as
llama-server and DeepSeek's API put it, and its tokens in `usage.completion_tokens_details.reasoning_tokens`.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Sequence

from localspec.core.engine import Generation
from localspec.core.stats import Stats, TokenLogprob
from localspec.core.thinking import THINKING, PartStats, ThinkingSplit
from localspec.core.tools import ToolSetup

from .api import finite

Splits = Sequence[ThinkingSplit | None]  # each choice's thinking/answer split (None: no split, a raw completion)


@dataclasses.dataclass(slots=True)
class Reply:
    """What every object of one response shares: its id, creation time, model and kind ("chat" or "text")."""

    kind: str
    model: str
    id: str = ""
    created: int = 0
    tools: ToolSetup | None = None  # the tools offered: each answer parsed for calls in their syntax
    token_bytes: Callable[[int], bytes] | None = None  # the target's token → its bytes (log-probabilities)
    _parsed: dict = dataclasses.field(default_factory=dict)  # choice index -> (content, tool calls)

    def __post_init__(self) -> None:
        self.id = self.id or ("chatcmpl-" if self.kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = self.created or int(time.time())

    def _head(self, chunk: bool) -> dict:
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        obj += ".chunk" if chunk and self.kind == "chat" else ""
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "system_fingerprint": None}

    def whole(self, prompt_tokens: int, generations: Sequence[Generation], splits: Splits = ()) -> dict:
        """The non-streaming response (`splits`: each choice's thinking/answer split, for a chat)."""
        splits = list(splits) or [None] * len(generations)
        choices = [self._choice(i, gen, split) for i, (gen, split) in enumerate(zip(generations, splits))]
        return {**self._head(False), "choices": choices, **usage_and_timings(prompt_tokens, generations, splits)}

    def calls(self, index: int, gen: Generation, split: ThinkingSplit | None) -> tuple[str | None, list[dict]]:
        """Choice `index`'s content and tool calls (parsed once: the calls' ids stay the same)."""
        text = split.answer if split is not None else gen.text
        if self.tools is None:
            return text, []
        if index not in self._parsed:
            self._parsed[index] = self.tools.parse(answer_text(self.tools, gen, split, self.token_bytes))
        return self._parsed[index]

    def finish(self, gen: Generation, split: ThinkingSplit | None, index: int = 0) -> str | None:
        """The finish reason: "tool_calls" when the answer called a tool."""
        if self.tools is not None and gen.finish_reason == "stop" and self.calls(index, gen, split)[1]:
            return "tool_calls"
        return _finish(gen)

    def tool_chunks(self, index: int, gen: Generation, split: ThinkingSplit | None) -> list[dict]:
        """The stream's chunks of an answer with tools, once it ended: its content, then each call as OpenAI
        streams one (the id, type and name first, then the arguments)."""
        content, calls = self.calls(index, gen, split)
        out = [self.chunk(index, content)] if content else []
        for i, call in enumerate(calls):
            head = {
                "index": i,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            body = {"index": i, "function": {"arguments": call["function"]["arguments"]}}
            out += [self._delta(index, {"tool_calls": [head]}), self._delta(index, {"tool_calls": [body]})]
        return out

    def _delta(self, index: int, delta: dict) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return {**self._head(True), "choices": [choice]}

    def _choice(self, index: int, gen: Generation, split: ThinkingSplit | None) -> dict:
        finish = self.finish(gen, split, index)
        text, calls = self.calls(index, gen, split)
        scored = list(zip(gen.tokens, gen.logprobs)) if gen.logprobs else None
        if self.kind == "chat":
            message = {"role": "assistant", "content": text, "refusal": None}
            if calls:
                message["tool_calls"] = calls
            if split is not None and split.reasoning:
                message["reasoning_content"] = split.reasoning
            logprobs = {"content": [self._entry(t, lp) for t, lp in scored], "refusal": None} if scored else None
            return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}
        return {"index": index, "text": text, "logprobs": self._legacy(scored), "finish_reason": finish}

    def _piece(self, token: int) -> tuple[str, list[int]]:
        raw = self.token_bytes(token) if self.token_bytes is not None else b""
        return raw.decode("utf-8", errors="replace"), list(raw)

    def _entry(self, token: int, scored: TokenLogprob) -> dict:
        """One token of chat's `logprobs.content`: its text, bytes, log-probability and the top alternatives."""
        text, raw = self._piece(token)
        top = []
        for alt, lp in scored.top:
            alt_text, alt_raw = self._piece(alt)
            top.append({"token": alt_text, "logprob": lp, "bytes": alt_raw})
        return {"token": text, "logprob": scored.logprob, "bytes": raw, "top_logprobs": top}

    def _legacy(self, scored: list | None) -> dict | None:
        """The completions API's `logprobs`: tokens, their log-probabilities, the alternatives, the text offsets."""
        if not scored:
            return None
        tokens, offsets, at = [], [], 0
        for token, _ in scored:
            text = self._piece(token)[0]
            tokens.append(text)
            offsets.append(at)
            at += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for _, lp in scored],
            "top_logprobs": [{self._piece(t)[0]: v for t, v in lp.top} for _, lp in scored],
            "text_offset": offsets,
        }

    def chunk(
        self,
        index: int,
        text: str,
        *,
        first: bool = False,
        finish: str | None = None,
        extra=None,
        reasoning: bool = False,
        logprob: tuple[int, TokenLogprob] | None = None,
    ) -> dict:
        """One stream chunk: the role first (chat), then text deltas (`reasoning`: of the thinking; `logprob`: the
        token's, where asked), then the finish."""
        if self.kind == "chat":
            key = "reasoning_content" if reasoning else "content"
            delta: dict = {"role": "assistant", "content": ""} if first else ({key: text} if text else {})
            scored = {"content": [self._entry(*logprob)], "refusal": None} if logprob else None
            choice = {"index": index, "delta": delta, "logprobs": scored, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text, "logprobs": self._legacy([logprob] if logprob else None)}
            choice["finish_reason"] = finish
        return {**self._head(True), "choices": [choice], **(extra or {})}

    def usage_chunk(self, prompt_tokens: int, generations: Sequence[Generation], splits: Splits = ()) -> dict:
        """The chunk `stream_options.include_usage` asks for: no choices, the usage (and our timings)."""
        return {**self._head(True), "choices": [], **usage_and_timings(prompt_tokens, generations, splits)}


def answer_text(
    tools: ToolSetup, gen: Generation, split: ThinkingSplit | None, token_bytes: Callable[[int], bytes] | None
) -> str:
    """The answer's text as its tool calls are parsed from: a marker that is a control token written out (it renders
    as no text)."""
    text = split.answer if split is not None else gen.text
    if tools.specials and token_bytes is not None and (split is None or not split.reasoning):
        return tools.marked_text(gen.tokens, token_bytes) or text
    return text


def _finish(gen: Generation) -> str | None:
    return gen.finish_reason


def usage_and_timings(prompt_tokens: int, generations: Sequence[Generation], splits: Splits = ()) -> dict:
    """`usage`, `timings` and `localspec` for a response's choices (which share one prompt)."""
    total = Stats()
    for gen in generations:
        total.merge(gen.stats)
    parts = _parts(splits)
    completion = sum(len(gen.tokens) for gen in generations)
    first = generations[0].stats if generations else Stats(prompt_tokens=prompt_tokens)
    # The target reads prompt[:-1] in the prefill (what it decodes there is prefill_decoded); the last prompt
    # token goes with the first step. The rest of the prompt was already in the cache.
    cache_n = max(prompt_tokens - 1 - first.prefill_decoded, 0) if generations else 0
    prompt_ms = first.seconds_prefill * 1000
    predicted_ms = total.seconds_generating * 1000
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cache_n},
    }
    if parts is not None:  # OpenAI's count of the thinking tokens (part of completion_tokens)
        usage["completion_tokens_details"] = {"reasoning_tokens": parts[THINKING].tokens}
    timings = {
        "cache_n": cache_n,
        "prompt_n": prompt_tokens - cache_n,
        "prompt_ms": prompt_ms,
        "prompt_per_second": finite((prompt_tokens - cache_n) / (prompt_ms / 1000)) if prompt_ms > 0 else 0.0,
        "predicted_n": completion,
        "predicted_ms": predicted_ms,
        "predicted_per_second": finite(completion / (predicted_ms / 1000)) if predicted_ms > 0 else 0.0,
        "draft_n": total.drafted,
        "draft_n_accepted": total.accepted,
    }
    ours = speculation(total, prompt_tokens, cache_n)
    if parts is not None:
        ours["parts"] = {name: {k: finite(v) for k, v in part.to_dict().items()} for name, part in parts.items()}
    return {"usage": usage, "timings": timings, "localspec": ours}


def _parts(splits: Splits) -> dict[str, PartStats] | None:
    """The choices' thinking and answer numbers summed (None unless the model thinks)."""
    found = [s for s in splits if s is not None and s.markers is not None]
    if not found:
        return None
    total = {name: PartStats() for name in found[0].parts()}
    for split in found:
        for name, part in split.parts().items():
            total[name].add(part)
    return total


def speculation(stats: Stats, prompt_tokens: int, cache_n: int) -> dict:
    """Our own stats of a response: acceptance, tokens per target pass, the adaptive policy's latest decision."""
    return {
        "drafter": stats.drafter,  # the drafter that drafted ("mtp": the target's own head)
        "acceptance_rate": finite(stats.acceptance_rate),
        "alpha": finite(stats.alpha),
        "tokens_per_target_pass": finite(stats.mean_tokens_per_pass),
        "target_passes": stats.target_passes,
        "acceptance_by_position": [finite(a) for a in stats.acceptance_by_position],
        "draft_length": stats.draft_length,
        "speculation_off": stats.speculation_off,
        "steps_off": stats.steps_off,
        "probes": stats.probes,
        "decision": {k: finite(v) for k, v in dataclasses.asdict(stats.decision).items()},
        "prompt_reused": finite(cache_n / prompt_tokens) if prompt_tokens else 0.0,
        "prompt_restored": stats.prefill_restored,  # of the reused tokens, those from the prompt cache in RAM
        "seconds_draft": stats.seconds_draft,
        "seconds_verify": stats.seconds_verify,
        "seconds_sampling": stats.seconds_sampling,
    }


def sse(obj: dict | str) -> bytes:
    """One server-sent event: `data: <json>` (or `data: [DONE]`)."""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
