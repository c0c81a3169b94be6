"""The run flags: which models to run and how, as one typed value that is declared here only.

`cli.checks.check_run_args` returns one from the command line of `generate`, `chat`, `bench` and `serve`; the
chat's `ChatOptions` extends it with what the app alone sets; the server keeps the one it was started with. Loading
(`models.loading`) reads it. None or empty means "not given": the pair's default, then the engine's, applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from localspec.core.params import DEFAULT_MAX_TOKENS


@dataclass(frozen=True)
class RunFlags:
    """The checked model and run flags (None or empty: not given)."""

    pair: str | None = None  # a pair from models.toml (None: the default pair, or the demo pair)
    target: str | None = None  # a target GGUF path instead of a pair
    draft: str | None = None  # its draft GGUF path
    mmproj: str | None = None  # a projector GGUF path: the --target's, or in place of the --pair's
    drafter: str | None = None  # one of DRAFTERS (None: model when there is a draft, else none)
    n_ctx: int | None = None
    n_gpu_layers: int | None = None  # the target's (None: the placement plan's)
    n_gpu_layers_draft: int | None = None  # the draft's (None: the plan's)
    gpu_memory: int | None = None  # --gpu-memory in bytes: plan as if the GPU had this much free
    cache_ram: int | None = None  # --cache-ram in bytes (0: no prompt cache; None: the default budget)
    cache_dir: str | None = None  # --cache-dir's directory (created by the checks), the prompt cache on disk
    cache_dir_size: int | None = None  # its size in bytes (None: the default)
    cpu_moe: bool | None = None  # --cpu-moe (None: the pair's, else the plan's)
    threads: int | None = None  # the flag, else $LOCALSPEC_THREADS, else None (the engine picks)
    rpc: tuple[str, ...] = ()  # parsed "host:port" llama.cpp RPC workers for the target (empty: the pair's)
    device_sampling: str | None = None  # greedy tokens from llama.cpp's in-graph sampler (None: auto)
    bridge: str | None = None  # how a draft with another vocabulary drafts (None: auto)
    chat_template: str | None = None
    system: str | None = None  # system prompt (of new conversations, in the chat)
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()  # stop strings
    overrides: Mapping[str, Any] = field(default_factory=dict)  # the sampling and speculation flags given
    think: bool | None = None  # --think on / off (None: the pair's `thinking`, else the model's default)
