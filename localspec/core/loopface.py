"""What the generation loop (core/generation.py) asks and gives: what it asks of the engine it runs on (`Engine`), the
keywords that start it (`GenerateOptions`) and the events it yields (`TokenEvent`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypedDict

import numpy as np

from localspec.llama.model import Model
from localspec.llama.threads import ThreadTuner

from .drafters import Drafter
from .grammar import CompiledGrammar, Grammar
from .kv import KVSequence
from .params import SpeculativeParams
from .policy import DraftPolicy
from .sampling import SamplingParams
from .stats import Stats


class Engine(Protocol):
    """What a generation asks of the engine it runs on (core/engine.py's `Engine` is the one)."""

    target: KVSequence
    target_model: Model
    drafter: Drafter
    policy: DraftPolicy
    threads: ThreadTuner | None
    eog: frozenset[int]
    n_ctx: int

    def compile_grammar(self, grammar: Grammar | CompiledGrammar) -> CompiledGrammar: ...

    def draft_limit(
        self, spec: SpeculativeParams, remaining: int, n_history: int, drafter: Drafter | None = None
    ) -> int: ...

    def draft_length(
        self,
        spec: SpeculativeParams,
        remaining: int,
        n_history: int,
        stats: Stats,
        drafting: tuple[Drafter, DraftPolicy] | None = None,
        *,
        timed: bool = True,
    ) -> int: ...


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One emitted token (or, with token None, the close of a generation ended between steps)."""

    token: int | None
    text: str  # text released with this token ("" while bytes or a possible stop string are held back)
    from_draft: bool
    finish_reason: str | None = None  # "stop", "length", "cancelled" on the last event


class GenerateOptions(TypedDict, total=False):
    """The keywords that start a generation, said once: `Engine.generate` takes them, and `ChatSession`'s `send`,
    `reply`, `answer` and `regenerate` take them and `think`. Their defaults are `Generation`'s."""

    sampling: SamplingParams  # how tokens are chosen (default: SamplingParams())
    spec: SpeculativeParams  # how drafting and verification run (default: SpeculativeParams())
    max_tokens: int  # most tokens in the answer (default: DEFAULT_MAX_TOKENS)
    stop: Sequence[str]  # stop strings (default: none)
    rng: np.random.Generator | None  # the one source of randomness (default: seeded from `sampling.seed`)
    grammar: Grammar | CompiledGrammar | None  # what the answer must match (core/grammar.py; default: anything)
    logprobs: int | None  # each token's log-probability and this many alternatives (core/step.py; default: none)
    target: KVSequence | None  # the target's cache to generate in (a `serve --parallel` slot's; default: the engine's)
    # The drafter this generation drafts with, and its draft-length policy (a server's request, a slot's own drafter;
    # default: the engine's, or a new policy for a drafter given without one).
    drafter: Drafter | None
    policy: DraftPolicy | None
