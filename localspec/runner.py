"""From command-line flags (and a models.toml pair) to a loaded `Engine` and its parameters.

Precedence for every setting: an explicit flag, then the pair's default in models.toml, then the
engine's built-in default. The engine itself never sees argparse or pydantic.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from .engine import Engine, SpeculativeParams
from .errors import InvalidParamsError, LocalspecError
from .sampling import SamplingParams

_SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")
_SPEC_FLAGS = ("draft_max", "p_min", "verify", "adaptive")


def _pick(args: argparse.Namespace, settings: dict, names: tuple[str, ...]) -> dict:
    chosen = {name: settings[name] for name in names if settings.get(name) is not None}
    chosen.update({name: getattr(args, name) for name in names if getattr(args, name, None) is not None})
    return chosen


def sampling_from_args(args: argparse.Namespace, settings: dict) -> SamplingParams:
    """SamplingParams from flags over pair defaults."""
    return SamplingParams(**_pick(args, settings, _SAMPLING_FLAGS))


def spec_from_args(args: argparse.Namespace, settings: dict) -> SpeculativeParams:
    """SpeculativeParams from flags over pair defaults."""
    return SpeculativeParams(**_pick(args, settings, _SPEC_FLAGS))


def resolve_models(args: argparse.Namespace) -> tuple[str, str | None, dict]:
    """(target path, draft path or None, pair settings) from --target/--draft, --pair, or the default pair.

    Raises:
        LocalspecError: conflicting flags, or the pair is unknown / not downloaded.
    """
    if args.target:
        if args.pair:
            raise InvalidParamsError("give either --pair or --target/--draft, not both")
        return args.target, args.draft, {}
    if args.draft:
        raise InvalidParamsError("--draft needs a --target to draft for")
    from .pairs import resolve_pair_for_run

    return resolve_pair_for_run(args.pair)  # no --pair: the default pair, or the offline demo


@contextmanager
def open_engine(args: argparse.Namespace) -> Iterator[tuple[Engine, dict]]:
    """Load the engine the flags describe; close it on exit."""
    target, draft, settings = resolve_models(args)
    drafter = args.drafter or ("model" if draft else "none")
    if drafter not in ("model", "model+ngram"):
        draft = None
    n_ctx = args.n_ctx or settings.get("n_ctx")
    n_gpu_layers = args.n_gpu_layers if args.n_gpu_layers is not None else settings.get("n_gpu_layers")
    engine = Engine.load(target, draft, drafter=drafter, n_ctx=n_ctx, n_gpu_layers=n_gpu_layers,
                         n_threads=args.threads, compat_hint=settings.get("compat_hint", ""))
    try:
        yield engine, settings
    finally:
        engine.close()


__all__ = ["open_engine", "sampling_from_args", "spec_from_args", "resolve_models", "LocalspecError"]
