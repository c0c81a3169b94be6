"""How models are loaded, and a pair's defaults, as typed values the engine itself can import.

`LoadParams` goes to `Engine.load`; `PairDefaults` is what a models.toml pair sets (None: not set) and what
loading it must tell the user. Both are built once — from models.toml, the command line or the settings
screen — and passed down. This module also owns the drafter vocabulary and the names of the sampling and
speculation options a user can set. It imports no UI, no pydantic and nothing native: models.toml's
validation uses it without loading llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localspec.errors import InvalidParamsError
from localspec.llama.rpc import check_endpoint

DRAFTERS = ("model", "ngram", "model+ngram", "none")
MODEL_DRAFTERS = ("model", "model+ngram")  # the drafters that need the draft model loaded
SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")  # of SamplingParams
SPECULATIVE_OPTIONS = ("draft_max", "p_min", "verify", "adaptive")  # of SpeculativeParams
OVERRIDE_OPTIONS = SAMPLING_OPTIONS + SPECULATIVE_OPTIONS  # the flags that override a pair's defaults
N_CTX_MIN = 16
# Most tokens in one answer unless told otherwise (every entry point: generate, chat, the Python API). Long
# enough that a chat answer or a code block rarely stops mid-way; a shorter one is a flag or setting away.
DEFAULT_MAX_TOKENS = 1024
VERIFY_MODES = ("auto", "pq", "match")  # "auto": pq when T > 0, else greedy


@dataclass(frozen=True, slots=True)
class SpeculativeParams:
    """How drafting and verification run."""

    draft_max: int = 8  # most tokens drafted per step (k); 0 = plain decoding
    p_min: float = 0.0  # stop drafting when the draft's top probability falls below this
    verify: str = "auto"  # "pq" (Leviathan rejection sampling), "match" (exact match), "auto" = pq when T > 0
    adaptive: bool = True  # pick k ≤ draft_max each step from α̂ and measured costs, off when plain is faster

    def __post_init__(self) -> None:
        if not 0 <= self.draft_max <= 64:
            raise InvalidParamsError("invalid speculation setting: draft-max must be between 0 and 64")
        if not 0 <= self.p_min <= 1:
            raise InvalidParamsError("invalid speculation setting: p-min must be in [0, 1]")
        if self.verify not in VERIFY_MODES:
            raise InvalidParamsError(f"invalid speculation setting: verify must be one of {', '.join(VERIFY_MODES)}")


@dataclass(frozen=True, slots=True)
class LoadParams:
    """How `Engine.load` loads the models and creates their contexts."""

    drafter: str = "model"  # one of DRAFTERS; "model" and "model+ngram" need a draft file
    n_ctx: int | None = None  # None: min(4096, the target's training context)
    n_gpu_layers: int | None = None  # None: all layers when the build can offload; -1 too
    n_threads: int | None = None  # None: the cores other processes leave free, re-checked while generating
    rollback: str = "auto"  # KVSequence rollback mode ("auto" probes; others force a path)
    swa_full: bool | None = None  # full sliding-window caches; None: on when speculating on such a model
    compat_hint: str = ""  # appended to an incompatible-draft error (e.g. the curated drafts that fit)
    rpc: tuple[str, ...] = ()  # llama.cpp RPC workers ("host:port") that take the target's layers

    def __post_init__(self) -> None:
        if self.drafter not in DRAFTERS:
            raise InvalidParamsError(f"unknown drafter {self.drafter!r}: use {', '.join(DRAFTERS)}")
        if self.n_ctx is not None and self.n_ctx < N_CTX_MIN:
            raise InvalidParamsError(f"invalid load setting: n-ctx must be at least {N_CTX_MIN}")
        if self.n_gpu_layers is not None and self.n_gpu_layers < -1:
            raise InvalidParamsError("invalid load setting: n-gpu-layers must be -1 (all) or more")
        if self.n_threads is not None and self.n_threads < 1:
            raise InvalidParamsError("invalid load setting: threads must be at least 1")
        if isinstance(self.rpc, str):
            raise InvalidParamsError("invalid load setting: rpc must be a list of host:port endpoints")
        object.__setattr__(self, "rpc", tuple(self.rpc))  # a list from a caller or models.toml, kept hashable
        for endpoint in self.rpc:
            check_endpoint(endpoint)

    @property
    def uses_draft_model(self) -> bool:
        """Whether the drafter needs the draft model loaded."""
        return self.drafter in MODEL_DRAFTERS


@dataclass(frozen=True, slots=True)
class PairDefaults:
    """A pair's defaults from models.toml (None or empty: not set), and what loading it must say."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    draft_max: int | None = None
    p_min: float | None = None
    verify: str | None = None
    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    chat_template: str | None = None
    rpc: tuple[str, ...] = ()
    compat_hint: str = ""  # the curated drafts of the target's family, for an incompatible-draft error
    notice: str = ""  # what the user must be told (e.g. that the demo pair stands in); "" when nothing

    def options(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The options among `names` that the pair sets."""
        return {name: getattr(self, name) for name in names if getattr(self, name, None) is not None}
