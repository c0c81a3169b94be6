"""The one result every protocol writes: an `Answer` — each choice's text, reasoning, tool calls and finish, the usage,
and the speculation stats (`timings` in llama-server's names, our own under `localspec`) — and the events of a
streamed one (`Delta`, a finished `Choice`, a `Failure`). Built once from the engine's generations (server/flow.py);
each protocol's encoders (render.py, messages_route.py, responses_route.py) write it, so a new field is computed here
once. As llama.cpp's server renders one result type through small encoders.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from localspec.core.engine import Generation
from localspec.core.stats import Stats, TokenLogprob
from localspec.core.thinking import THINKING, PartStats, Piece, ThinkingSplit
from localspec.core.tools import ToolSetup

from .api import ApiError, finite


@dataclass(frozen=True, slots=True)
class Usage:
    """The tokens an answer cost."""

    prompt_tokens: int
    cached_tokens: int  # of the prompt, already in the cache (not read again)
    completion_tokens: int
    reasoning_tokens: int | None  # of the completion, thinking (None: the model does not think)


@dataclass(frozen=True, slots=True)
class Choice:
    """One finished choice: its answer (tool calls parsed out of it, once: their ids stay the same), its thinking,
    its calls in OpenAI's shape, and its finish — "stop", "length", "tool_calls" or "cancelled"."""

    index: int
    text: str | None
    reasoning: str
    calls: list[dict]
    finish: str | None
    generation: Generation
    split: ThinkingSplit | None

    @property
    def logprobs(self) -> list[tuple[int, TokenLogprob]] | None:
        """Each token with its log-probability, where they were asked for."""
        gen = self.generation
        return list(zip(gen.tokens, gen.logprobs)) if gen.logprobs else None


@dataclass(frozen=True, slots=True)
class Delta:
    """A streamed token of choice `index`: its text as pieces (thinking apart), its log-probability where asked."""

    index: int
    pieces: list[Piece]
    logprob: tuple[int, TokenLogprob] | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """The stream's request failed after it started (the last event)."""

    error: ApiError


Event = Delta | Choice | Failure


@dataclass(slots=True)
class Answer:
    """A request's answer: the pair that gave it, the prompt's length, the tools offered, and its choices (added as
    each ends)."""

    model: str
    prompt_tokens: int
    tools: ToolSetup | None = None  # the tools offered: each answer parsed for calls in their syntax
    token_bytes: Callable[[int], bytes] | None = None  # the target's token → its bytes
    choices: list[Choice] = field(default_factory=list)

    def add(self, gen: Generation, split: ThinkingSplit | None) -> Choice:
        """The next choice, finished."""
        text: str | None = split.answer if split is not None else gen.text
        calls: list[dict] = []
        if self.tools is not None:
            text, calls = self.tools.parse(answer_text(self.tools, gen, split, self.token_bytes))
        finish = "tool_calls" if calls and gen.finish_reason == "stop" else gen.finish_reason
        reasoning = split.reasoning if split is not None else ""
        choice = Choice(len(self.choices), text, reasoning, calls, finish, gen, split)
        self.choices.append(choice)
        return choice

    def piece(self, token: int) -> tuple[str, list[int]]:
        """A token's text and bytes (log-probabilities name their tokens so)."""
        raw = self.token_bytes(token) if self.token_bytes is not None else b""
        return raw.decode("utf-8", errors="replace"), list(raw)

    def said(self, choice: Choice) -> str:
        """Everything the choice generated, as text (a stop string included)."""
        raw = b"".join(self.token_bytes(t) for t in choice.generation.tokens) if self.token_bytes else b""
        return raw.decode("utf-8", errors="replace")

    @property
    def cached_tokens(self) -> int:
        # The target reads prompt[:-1] in the prefill (what it decodes there is prefill_decoded); the last prompt
        # token goes with the first step. The rest of the prompt was already in the cache.
        if not self.choices:
            return 0
        return max(self.prompt_tokens - 1 - self.choices[0].generation.stats.prefill_decoded, 0)

    def usage(self) -> Usage:
        parts = _parts(self.choices)
        completion = sum(len(c.generation.tokens) for c in self.choices)
        reasoning = parts[THINKING].tokens if parts is not None else None
        return Usage(self.prompt_tokens, self.cached_tokens, completion, reasoning)

    def stats(self) -> dict:
        """The extension keys every protocol's answer carries: `timings` (llama-server's) and `localspec` (ours)."""
        total = Stats()
        for choice in self.choices:
            total.merge(choice.generation.stats)
        first = self.choices[0].generation.stats if self.choices else Stats(prompt_tokens=self.prompt_tokens)
        cache_n, completion = self.cached_tokens, sum(len(c.generation.tokens) for c in self.choices)
        prompt_ms, predicted_ms = first.seconds_prefill * 1000, total.seconds_generating * 1000
        timings = {
            "cache_n": cache_n,
            "prompt_n": self.prompt_tokens - cache_n,
            "prompt_ms": prompt_ms,
            "prompt_per_second": finite((self.prompt_tokens - cache_n) / (prompt_ms / 1000)) if prompt_ms > 0 else 0.0,
            "predicted_n": completion,
            "predicted_ms": predicted_ms,
            "predicted_per_second": finite(completion / (predicted_ms / 1000)) if predicted_ms > 0 else 0.0,
            "draft_n": total.drafted,
            "draft_n_accepted": total.accepted,
        }
        ours = speculation(total, self.prompt_tokens, cache_n)
        if (parts := _parts(self.choices)) is not None:
            ours["parts"] = {name: {k: finite(v) for k, v in part.to_dict().items()} for name, part in parts.items()}
        return {"timings": timings, "localspec": ours}


def answer_text(
    tools: ToolSetup, gen: Generation, split: ThinkingSplit | None, token_bytes: Callable[[int], bytes] | None
) -> str:
    """The answer's text as its tool calls are parsed from: a marker that is a control token written out (it renders
    as no text)."""
    text = split.answer if split is not None else gen.text
    if tools.specials and token_bytes is not None and (split is None or not split.reasoning):
        return tools.marked_text(gen.tokens, token_bytes) or text
    return text


def _parts(choices: list[Choice]) -> dict[str, PartStats] | None:
    """The choices' thinking and answer numbers summed (None unless the model thinks)."""
    found = [c.split for c in choices if c.split is not None and c.split.markers is not None]
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
