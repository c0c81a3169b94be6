"""From command-line flags (and a models.toml pair) to a loaded `Engine` and its parameters.

Precedence for every setting: an explicit flag, then the pair's default in models.toml, then the
engine's built-in default. The engine itself never sees argparse or pydantic.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from .engine import Engine, SpeculativeParams
from .errors import InvalidParamsError
from .sampling import SamplingParams

_SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")
_SPEC_FLAGS = ("draft_max", "p_min", "verify", "adaptive")
MODEL_DRAFTERS = ("model", "model+ngram")  # the drafters that need the draft model loaded


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


def load_engine(
    target,
    draft,
    settings: dict,
    *,
    drafter: str | None = None,
    n_ctx: int | None = None,
    n_gpu_layers: int | None = None,
    n_threads: int | None = None,
) -> Engine:
    """Load target and draft with explicit options over the pair's settings (shared by generate and chat).

    Args:
        target, draft: model paths (draft may be None).
        settings: the pair's defaults from `resolve_models` ({} for plain paths).
        drafter: "model", "ngram", "model+ngram", "none"; None = model when there is a draft.

    Raises:
        LocalspecError: as `Engine.load` (a model drafter without a draft file among them).
    """
    drafter = drafter or ("model" if draft else "none")
    n_gpu_layers = n_gpu_layers if n_gpu_layers is not None else settings.get("n_gpu_layers")
    return Engine.load(
        target,
        draft if drafter in MODEL_DRAFTERS else None,
        drafter=drafter,
        n_ctx=n_ctx or settings.get("n_ctx"),
        n_gpu_layers=n_gpu_layers,
        n_threads=n_threads,
        compat_hint=settings.get("compat_hint", ""),
    )


@contextmanager
def open_engine(args: argparse.Namespace) -> Iterator[tuple[Engine, dict]]:
    """Load the engine the flags describe; close it on exit."""
    target, draft, settings = resolve_models(args)
    engine = load_engine(
        target,
        draft,
        settings,
        drafter=args.drafter,
        n_ctx=args.n_ctx,
        n_gpu_layers=args.n_gpu_layers,
        n_threads=args.threads,
    )
    try:
        yield engine, settings
    finally:
        engine.close()


__all__ = ["open_engine", "load_engine", "sampling_from_args", "spec_from_args", "resolve_models"]
