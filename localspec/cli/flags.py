"""The command-line flags shared by `generate`, `chat` and `bench`, and what they override.

Both `cli` and the chat app's `register` add their parsers' flags from here, so neither imports the
other. The option names are `params.OVERRIDE_OPTIONS`: one list for the flags, the settings screen and
the pair defaults they override. No engine, no Textual: building the parser stays cheap.
"""

from __future__ import annotations

import argparse
from typing import Any

from localspec.core.params import DEFAULT_MAX_TOKENS, DRAFTERS, OVERRIDE_OPTIONS


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Model selection flags shared by `generate` and `chat`."""
    p.add_argument("--pair", help="a pair from models.toml (see `localspec models`)")
    p.add_argument("--target", help="target model GGUF path")
    p.add_argument("--draft", help="draft model GGUF path (same tokenizer as the target)")
    p.add_argument(
        "--drafter",
        choices=DRAFTERS,
        help="how tokens are drafted: model (the --draft model), ngram (prompt lookup: copy what "
        "followed the last few tokens earlier in the prompt or output; fast for repeating or "
        "editing a given text), model+ngram (lookup when it finds a match, else the model), none "
        "(default: model with --draft/--pair, else none)",
    )
    p.add_argument(
        "--n-ctx", type=int, help="context length (default: the pair's, else 4096 or the model's own if shorter)"
    )
    p.add_argument("--n-gpu-layers", type=int, help="layers to offload (default: all when the build can)")
    p.add_argument(
        "--threads",
        type=int,
        help="CPU threads, 1 to the CPU count (default: $LOCALSPEC_THREADS, else one per physical core)",
    )
    p.add_argument("--chat-template", help="a llama.cpp built-in template name, for models without one")
    p.add_argument(
        "--rpc",
        metavar="HOST:PORT[,HOST:PORT…]",
        help="llama.cpp RPC workers that take the target's layers (default: the pair's `rpc`, else none)",
    )


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """Sampling and speculation flags (None = the pair's or the built-in default)."""
    p.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"most tokens in the answer (default {DEFAULT_MAX_TOKENS})",
    )
    p.add_argument("--temperature", type=float, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--min-p", type=float)
    p.add_argument("--repeat-penalty", type=float)
    p.add_argument("--seed", type=int, help="same seed + same settings = same output")
    p.add_argument("--draft-max", type=int, help="most tokens drafted per step (default 8)")
    p.add_argument("--p-min", type=float, help="stop drafting below this draft confidence")
    p.add_argument("--verify", choices=["pq", "match"], help="pq (default at T>0) or exact match")
    p.add_argument(
        "--no-adaptive",
        dest="adaptive",
        action="store_const",
        const=False,
        help="always draft --draft-max tokens (default: pick k each step from the measured acceptance "
        "and costs, and decode plainly when speculation would be slower)",
    )
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling and speculation options given on the command line (None: not given)."""
    return {name: getattr(args, name) for name in OVERRIDE_OPTIONS if getattr(args, name, None) is not None}
