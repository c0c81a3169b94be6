"""Checks that run before anything heavy: every command-line flag of `generate`, `chat` and `bench`.

`check_run_args` validates the flags of `generate`, `chat` and `bench` (numbers at their bounds, model files,
the chat template name, text encodings) before any model is loaded or derived, so a typo costs no wait.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from localspec.core.params import N_CTX_MIN, SAMPLING_OPTIONS, SPECULATIVE_OPTIONS
from localspec.errors import InvalidParamsError, LocalspecError
from localspec.llama.rpc import parse_rpc
from localspec.llama.threads import check_threads, threads_from_env

from .textinput import clean

N_CTX_MAX = 2**31 - 1
SEED_MAX = 2**64 - 1
TOP_K_MAX = 2**31 - 1
N_MAX = 10_000


def _bounded(args: argparse.Namespace, name: str, low: int | float, high: int | float | None = None) -> None:
    value = getattr(args, name, None)
    if value is None:
        return
    flag = "--" + name.replace("_", "-")
    if value < low or (high is not None and value > high):
        span = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise InvalidParamsError(f"{flag} {value} is out of range: use a value {span}")


def check_run_args(args: argparse.Namespace) -> None:
    """Validate the flags of `generate` / `chat` in place (text cleaned, env threads resolved).

    Raises:
        LocalspecError: the first flag out of range, a missing model file, an unknown template name.
    """
    from localspec.core.params import SpeculativeParams
    from localspec.core.sampling import SamplingParams

    _bounded(args, "n_ctx", N_CTX_MIN, N_CTX_MAX)
    _bounded(args, "n_gpu_layers", -1, 2**31 - 1)
    _bounded(args, "seed", 0, SEED_MAX)
    _bounded(args, "max_tokens", 1)
    _bounded(args, "n", 1, N_MAX)
    if args.threads is not None:
        check_threads(args.threads)
    else:
        args.threads = threads_from_env()
    SamplingParams(**{n: getattr(args, n) for n in SAMPLING_OPTIONS if getattr(args, n, None) is not None})
    if (getattr(args, "top_k", None) or 0) > TOP_K_MAX:
        raise InvalidParamsError(f"invalid sampling setting: top-k must be at most {TOP_K_MAX} (0 = off)")
    SpeculativeParams(**{n: getattr(args, n) for n in SPECULATIVE_OPTIONS if getattr(args, n, None) is not None})
    if isinstance(getattr(args, "rpc", None), str):
        args.rpc = parse_rpc(clean(args.rpc)[0])
    if getattr(args, "system", None) is not None and getattr(args, "chat", True) is False:
        raise InvalidParamsError("--system only applies with --chat: add --chat or drop --system")
    for name in ("system", "chat_template", "pair"):
        if getattr(args, name, None) is not None:
            setattr(args, name, clean(getattr(args, name))[0])
    args.stop = [clean(s)[0] for s in (getattr(args, "stop", None) or [])]
    _check_files(args)
    if args.chat_template:
        from localspec.errors import ChatTemplateError
        from localspec.llama.templates import builtin_chat_templates

        names = builtin_chat_templates()
        if args.chat_template not in names:
            raise ChatTemplateError(f"unknown chat template {args.chat_template!r}: choose one of {', '.join(names)}")


def _check_files(args: argparse.Namespace) -> None:
    from localspec.llama.model import check_gguf_file

    if args.target and args.pair:
        raise InvalidParamsError("give either --pair or --target/--draft, not both")
    for flag in ("target", "draft"):
        value = getattr(args, flag, None)
        if value is not None:
            try:
                check_gguf_file(Path(value))
            except ValueError:
                raise LocalspecError(f"--{flag} is not a usable path (it holds a NUL character)") from None
            except OSError as e:
                raise LocalspecError(f"cannot read --{flag} {value}: {e.strerror or e}") from None
