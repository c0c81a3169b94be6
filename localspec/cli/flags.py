"""The command-line flags shared by `generate`, `chat` and `bench`, and what they override.

`generate`, `chat` and `bench` add their parsers' flags from here. The sampling and speculation flags are
`params.OPTIONS`, the one table the settings screen and the pair defaults read too. No engine, no Textual:
building the parser stays cheap.
"""

from __future__ import annotations

import argparse
from typing import Any

from localspec.core.params import BRIDGES, DEFAULT_MAX_TOKENS, DEVICE_SAMPLING, DRAFTERS, OPTIONS, OVERRIDE_OPTIONS


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Model selection flags shared by `generate` and `chat`."""
    p.add_argument("--pair", help="a pair from models.toml (see `localspec models`)")
    p.add_argument("--target", help="target model GGUF path")
    p.add_argument(
        "--draft",
        help="draft model GGUF path (another tokenizer drafts through text: see --bridge), or a Gemma 4 assistant "
        "sidecar (mtp-*.gguf), which drafts as --drafter assistant",
    )
    p.add_argument(
        "--mmproj",
        metavar="PATH",
        help="the target's projector GGUF (mmproj), so that it sees images: beside --target, or in place of the "
        "--pair's own",
    )
    p.add_argument(
        "--drafter",
        choices=DRAFTERS,
        help="how tokens are drafted: model (the --draft model), ngram (copy what followed the longest earlier "
        "match of the last tokens in the prompt or output; fast for repeating or editing a given text), "
        "model+ngram (that copy where it finds a match, else the model), mtp (the target's own MTP "
        "head), assistant (the --draft Gemma 4 assistant sidecar), none (default: model+ngram with a draft — "
        "assistant with an assistant sidecar — else the target's MTP head where it has one, else none)",
    )
    p.add_argument(
        "--n-ctx", type=int, help="context length (default: the pair's, else 4096 or the model's own if shorter)"
    )
    p.add_argument(
        "--n-gpu-layers",
        type=int,
        help="the target's layers on the GPU, llama.cpp's count (the output layer is one; -1: all; default: the "
        'placement plan\'s, docs/models.md "GPU placement")',
    )
    p.add_argument("--n-gpu-layers-draft", type=int, help="the draft's layers on the GPU (default: the plan's)")
    p.add_argument(
        "--gpu-memory",
        metavar="SIZE",
        help="plan as if the GPU had SIZE free, e.g. 8G or 7.5GiB (a cap when sharing it; a laptop on a big GPU)",
    )
    p.add_argument(
        "--cache-ram",
        metavar="SIZE",
        help="keep earlier prompts' KV states in RAM, up to SIZE (e.g. 2G; 0: none), and restore a prompt that comes "
        "back instead of reading it again (default: an eighth of the free memory, at most 8G)",
    )
    p.add_argument(
        "--cache-dir",
        metavar="DIR[:SIZE]",
        help="keep those states on disk in DIR too (created if missing), up to SIZE (default 4G; the least recently "
        "used files go first), so a prompt comes back restored after a restart too (default: RAM only)",
    )
    p.add_argument(
        "--cpu-moe",
        action="store_const",
        const=True,
        help="keep a mixture-of-experts target's experts in CPU memory (default: the plan's, when they do not fit)",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="CPU threads, 1 to the CPU count (default: $LOCALSPEC_THREADS, else one per physical core)",
    )
    p.add_argument(
        "--device-sampling",
        choices=DEVICE_SAMPLING,
        help="take greedy tokens with llama.cpp's in-graph sampler: auto (default: where the layers run on a GPU "
        "of this machine, so only a token id leaves it), on (also the draft's top-k law at T > 0), off (the argmax "
        "over the logits, in numpy)",
    )
    p.add_argument(
        "--bridge",
        choices=BRIDGES,
        help="a draft whose vocabulary differs from the target's: auto (default: on the shared tokens when the two "
        "share 90%% of the draft's, else through text), text (re-tokenise its text), shared (its shared tokens only)",
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
    for opt in OPTIONS:  # None when not given: the pair's default, else the field's
        if opt.kind is bool:  # on by default: the flag turns it off
            p.add_argument(opt.flag, dest=opt.name, action="store_const", const=False, help=opt.help)
        else:
            shown = "" if opt.default is None else f" (default {opt.default})"
            p.add_argument(opt.flag, type=opt.kind, choices=opt.choices or None, help=opt.help + shown)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument(
        "--think",
        choices=("on", "off"),
        help="a reasoning model thinks before it answers, or not, through its chat template's switch (Qwen3's "
        "enable_thinking; default: the pair's `thinking`, else the model's own)",
    )


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling and speculation options given on the command line (None: not given)."""
    return {name: getattr(args, name) for name in OVERRIDE_OPTIONS if getattr(args, name, None) is not None}
