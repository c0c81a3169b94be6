"""How models are loaded, and a pair's defaults, as typed values the engine itself can import.

`LoadParams` goes to `Engine.load`; `PairDefaults` is what a models.toml pair sets (None: not set) and what
loading it must tell the user. Both are built once — from models.toml, the command line or the settings
screen — and passed down. This module also owns the drafter vocabulary and the names of the sampling and
speculation options a user can set. It imports no UI, no pydantic and nothing native: models.toml's
validation uses it without loading llama.cpp.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from localspec.errors import InvalidParamsError
from localspec.llama.rpc import check_endpoint

from .options import Limit, check_fields, option, options_of
from .sampling import SamplingParams

DRAFTERS = ("model", "ngram", "model+ngram", "mtp", "assistant", "none")
MODEL_DRAFTERS = ("model", "model+ngram")  # the drafters that need the draft model loaded (ask `needs_draft_model`)
PLAIN_DRAFTERS = ("none",)  # the drafters that propose nothing: plain decoding (ask `drafts`)
# No draft file and no --drafter: the target's own MTP head where it has one (and llama-cpp-python can run it),
# else plain decoding. `load_models` settles it; the engine's drafter says what it became (`Drafter.kind`).
AUTO_DRAFTER = "auto"
# The drafter when a draft model is loaded and none is named: the history's n-gram copy where it finds a repeat, the
# draft model for the rest (faster than "model" alone in two quiet runs: docs/benchmarks.md "The n-gram chain").
DEFAULT_MODEL_DRAFTER = "model+ngram"
N_CTX_MIN = 16
# Most tokens in one answer unless told otherwise (every entry point: generate, chat, the Python API). Long
# enough that a chat answer or a code block rarely stops mid-way; a shorter one is a flag or setting away.
DEFAULT_MAX_TOKENS = 1024
VERIFY_RULES = ("pq", "match")  # Leviathan's rejection sampling; exact match
VERIFY_MODES = ("auto", *VERIFY_RULES)  # "auto": pq when T > 0, else greedy
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT])(i?B?)\s*$", re.IGNORECASE | re.ASCII)
_SIZE_MAX = 2**50  # a PiB: past it a GPU's memory size is a typo


@dataclass(frozen=True, slots=True)
class SpeculativeParams:
    """How drafting and verification run."""

    draft_max: int = field(  # k
        default=8,
        metadata=option(
            "most tokens drafted per step; 0 = plain decoding",
            pair=True,
            form="draft max (0 = plain)",
            limit=Limit(0, 64, note="0 = plain decoding"),
        ),
    )
    p_min: float = field(
        default=0.0, metadata=option("stop drafting below this draft confidence", pair=True, limit=Limit(0, 1))
    )
    verify: str = field(  # "pq": Leviathan rejection sampling; "match": exact match; "auto": pq when T > 0
        default="auto",
        metadata=option("pq (rejection sampling) or match (exact); auto: pq at T > 0", choices=VERIFY_RULES, pair=True),
    )
    adaptive: bool = field(
        default=True,
        metadata=option(
            "always draft --draft-max tokens (default: pick k each step from the measured acceptance and costs, "
            "and decode plainly when speculation would be slower)"
        ),
    )

    def __post_init__(self) -> None:
        check_fields(self, "speculation")


def parse_size(text: str, source: str = "--gpu-memory") -> int:
    """Bytes from "8G", "7.5GiB", "8000M", "8gb" (binary units: a laptop's "8 GB" GPU is 8 GiB).

    Raises:
        InvalidParamsError: not a size (one line naming `source`).
    """
    m = _SIZE_RE.match(str(text))
    size = float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper()) if m else 0.0
    if not 0 < size <= _SIZE_MAX:
        raise InvalidParamsError(
            f"{source} {text!r} is not a memory size: write it like 8G, 7.5GiB or 8000M (ASCII digits, at most 1 PiB)"
        )
    return int(size)


def needs_draft_model(drafter: str) -> bool:
    """Whether the drafter named `drafter` (one of DRAFTERS) drafts with the draft model: the one place that asks."""
    return drafter in MODEL_DRAFTERS


def drafts(drafter: str) -> bool:
    """Whether the drafter named `drafter` (one of DRAFTERS, or AUTO_DRAFTER) proposes tokens, before it is built:
    the one place that asks (a built drafter says it itself, `Drafter.drafts`)."""
    return drafter not in PLAIN_DRAFTERS


# The user options (see `options.py`): flags, models.toml pair keys and the settings form all come from these.
OPTIONS = options_of(SamplingParams, SpeculativeParams)
SAMPLING_OPTIONS = tuple(o.name for o in options_of(SamplingParams))
SPECULATIVE_OPTIONS = tuple(o.name for o in options_of(SpeculativeParams))
OVERRIDE_OPTIONS = SAMPLING_OPTIONS + SPECULATIVE_OPTIONS  # the flags that override a pair's defaults


DEVICE_SAMPLING = ("auto", "on", "off")
BRIDGES = ("auto", "text", "shared")  # how a draft with another vocabulary drafts (core/bridge.py)


@dataclass(frozen=True, slots=True)
class LoadParams:
    """How `Engine.load` loads the models and creates their contexts."""

    drafter: str = "model"  # one of DRAFTERS or AUTO_DRAFTER; "model" and "model+ngram" need a draft file
    n_ctx: int | None = None  # None: min(4096, the target's training context)
    n_gpu_layers: int | None = None  # the target's layers on the GPU (llama.cpp's count; -1: all); None: the plan's
    n_gpu_layers_draft: int | None = None  # the draft's; None: the plan's (core/placement.py)
    gpu_memory: int | None = None  # plan as if the GPU had this many bytes free; None: what it reports
    cpu_moe: bool | None = None  # a MoE target's experts in CPU memory (True: all; False: none); None: the plan's
    n_threads: int | None = None  # None: the cores other processes leave free, re-checked while generating
    rollback: str = "auto"  # KVSequence rollback mode ("auto" probes; others force a path)
    swa_full: bool | None = None  # full sliding-window caches; None: on when speculating on such a model
    compat_hint: str = ""  # appended to an incompatible-draft error (e.g. the curated drafts that fit)
    rpc: tuple[str, ...] = ()  # llama.cpp RPC workers ("host:port") that take the target's layers
    # Greedy tokens from llama.cpp's in-graph sampler: "auto" where the layers run on a local GPU (the argmax stays
    # on the device), "on", "off" (the argmax over the logits, here).
    device_sampling: str = "auto"
    # A draft whose vocabulary differs: "auto" picks by the share of tokens the two vocabularies have in common,
    # "text" re-tokenises its text, "shared" drafts on the shared tokens only.
    bridge: str = "auto"
    # Sequences in the target's context, sharing its n_ctx cells (`serve --parallel`); 0: 4 where the target can take
    # several streams, else 1 (core/load.py `slots_for`).
    n_seq: int = 1
    # Bytes of earlier prompts' KV states kept in RAM and restored when a prompt comes back (core/promptcache.py);
    # None: an eighth of the memory free after loading, at most 8 GiB; 0: none.
    cache_ram: int | None = None
    # A directory that keeps those states on disk too, across restarts (None: RAM only), and its size in bytes (None:
    # 4 GiB), the least recently used files removed past it.
    cache_dir: str | None = None
    cache_dir_size: int | None = None
    # The target's projector (an mmproj GGUF, `--mmproj`): prompts may hold images (core/media.py). None: text only.
    mmproj: str | None = None

    def __post_init__(self) -> None:
        if self.drafter not in (*DRAFTERS, AUTO_DRAFTER):
            raise InvalidParamsError(f"unknown drafter {self.drafter!r}: use {', '.join(DRAFTERS)}")
        if self.n_ctx is not None and self.n_ctx < N_CTX_MIN:
            raise InvalidParamsError(f"invalid load setting: n-ctx must be at least {N_CTX_MIN}")
        for name in ("n_gpu_layers", "n_gpu_layers_draft"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < -1):
                raise InvalidParamsError(f"invalid load setting: {name.replace('_', '-')} must be -1 (all) or more")
        if self.gpu_memory is not None and (not isinstance(self.gpu_memory, int) or self.gpu_memory <= 0):
            raise InvalidParamsError("invalid load setting: gpu-memory must be a size such as 8G")
        if self.cache_ram is not None and (isinstance(self.cache_ram, bool) or not isinstance(self.cache_ram, int)
                                           or self.cache_ram < 0):  # fmt: skip
            raise InvalidParamsError("invalid load setting: cache-ram must be a size such as 2G, or 0 for none")
        size = self.cache_dir_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
            raise InvalidParamsError("invalid load setting: cache-dir-size must be a size such as 4G")
        if self.n_threads is not None and self.n_threads < 1:
            raise InvalidParamsError("invalid load setting: threads must be at least 1")
        if self.device_sampling not in DEVICE_SAMPLING:
            raise InvalidParamsError(
                f"invalid load setting: device sampling must be one of {', '.join(DEVICE_SAMPLING)}"
            )
        if self.bridge not in BRIDGES:  # (core/bridge.py drafts in these modes)
            raise InvalidParamsError(f"invalid load setting: bridge must be one of {', '.join(BRIDGES)}")
        if isinstance(self.rpc, str):
            raise InvalidParamsError("invalid load setting: rpc must be a list of host:port endpoints")
        object.__setattr__(self, "rpc", tuple(self.rpc))  # a list from a caller or models.toml, kept hashable
        for endpoint in self.rpc:
            check_endpoint(endpoint)


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
    n_gpu_layers_draft: int | None = None
    gpu_memory: int | None = None  # bytes
    cpu_moe: bool | None = None
    chat_template: str | None = None
    thinking: bool | None = None  # a reasoning model thinks (True) or not (False) through its template's switch
    rpc: tuple[str, ...] = ()
    bridge: str | None = None  # how a draft with another tokenizer drafts (BRIDGES)
    compat_hint: str = ""  # the curated drafts of the target's family, for an incompatible-draft error
    notice: str = ""  # what the user must be told (e.g. that the demo pair stands in); "" when nothing
    mmproj: str | None = None  # the target's projector as resolved (the downloaded file, or --mmproj's): images

    def options(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The options among `names` that the pair sets."""
        return {name: getattr(self, name) for name in names if getattr(self, name, None) is not None}
