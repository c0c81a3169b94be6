"""From checked flags (and a models.toml pair) to a loaded `Engine` and its parameters.

Precedence for every setting: an explicit flag, then the pair's default in models.toml (`PairDefaults`),
then the engine's built-in default. Each parameter object is built here once and handed down; the engine
itself never sees argparse or pydantic. `load_with_flags` is the one loader of a pair by name (or files) that
`serve`'s runners and the chat's F2 switch share; the chat passes its own options as the flags.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.core.engine import Engine
from localspec.core.params import (
    AUTO_DRAFTER,
    DEFAULT_MODEL_DRAFTER,
    SAMPLING_OPTIONS,
    SPECULATIVE_OPTIONS,
    LoadParams,
    PairDefaults,
    SpeculativeParams,
    needs_draft_model,
)
from localspec.core.sampling import SamplingParams
from localspec.errors import InvalidParamsError
from localspec.paths import Paths, get_paths
from localspec.progress import StatusLine

from .flags import RunFlags
from .resolved import ResolvedPair

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PairLoad:
    """A pair resolved and its load parameters, about to load (or loaded, with `engine`)."""

    name: str  # the pair's name, or the target's file name
    resolved: ResolvedPair  # its files, defaults and notice (the note to show)
    params: LoadParams
    engine: Engine | None = None


def _merged(overrides: Mapping[str, Any], defaults: PairDefaults, names: tuple[str, ...]) -> dict[str, Any]:
    given = {name: overrides[name] for name in names if overrides.get(name) is not None}
    return {**defaults.options(names), **given}


def sampling_params(overrides: Mapping[str, Any], defaults: PairDefaults) -> SamplingParams:
    """SamplingParams from explicit options (flags, by name; None: not given) over the pair's defaults.

    Raises:
        InvalidParamsError: a value out of range.
    """
    return SamplingParams(**_merged(overrides, defaults, SAMPLING_OPTIONS))


def speculative_params(overrides: Mapping[str, Any], defaults: PairDefaults) -> SpeculativeParams:
    """SpeculativeParams from explicit options over the pair's defaults.

    Raises:
        InvalidParamsError: a value out of range.
    """
    return SpeculativeParams(**_merged(overrides, defaults, SPECULATIVE_OPTIONS))


def load_params(flags: RunFlags, defaults: PairDefaults, *, has_draft: bool) -> LoadParams:
    """LoadParams from explicit options over the pair's defaults.

    Args:
        flags: the explicit options (None or empty: not given).
        defaults: the pair's defaults (`PairDefaults()` for plain paths).
        has_draft: whether a draft file was given; the drafter defaults to "model+ngram" with one
            (`DEFAULT_MODEL_DRAFTER`), else "auto" (the target's MTP head where it has one, else none:
            `core.load.head_drafter`).

    Raises:
        InvalidParamsError: a value out of range.
    """

    def given(name: str):  # the flag, else the pair's
        value = getattr(flags, name)
        return value if value is not None else getattr(defaults, name)

    return LoadParams(
        drafter=flags.drafter or (DEFAULT_MODEL_DRAFTER if has_draft else AUTO_DRAFTER),
        n_ctx=flags.n_ctx or defaults.n_ctx,
        n_gpu_layers=given("n_gpu_layers"),
        n_gpu_layers_draft=given("n_gpu_layers_draft"),
        gpu_memory=given("gpu_memory"),
        cpu_moe=given("cpu_moe"),
        n_threads=flags.threads,
        cache_ram=flags.cache_ram,
        cache_dir=flags.cache_dir,
        cache_dir_size=flags.cache_dir_size,
        compat_hint=defaults.compat_hint,
        rpc=flags.rpc or defaults.rpc,
        device_sampling=flags.device_sampling or "auto",
        bridge=flags.bridge or defaults.bridge or "auto",
        mmproj=given("mmproj"),
    )


def resolve_models(
    flags: RunFlags, paths: Paths, *, bundled: Path | None = None, progress: Callable[[str], None] | None = None
) -> ResolvedPair:
    """What to load: --target/--draft, else --pair, else the default pair (or the offline demo standing in); with
    --mmproj, that projector (the --target's, or in place of the --pair's).

    Args:
        flags: the checked flags (or the chat's options).
        paths: localspec's folders (models.toml is read from them only when a pair is used).
        bundled: another bundled models.toml (tests); None: the package's.
        progress: told when the demo target must first be derived (a minute, once).

    Raises:
        LocalspecError: conflicting flags, an invalid models.toml, or the pair is unknown / not downloaded.
    """
    if flags.target:
        if flags.pair:
            raise InvalidParamsError("give either --pair or --target/--draft, not both")
        return ResolvedPair.files(flags.target, flags.draft, flags.mmproj)
    if flags.draft:
        raise InvalidParamsError("--draft needs a --target to draft for")
    if flags.mmproj and not flags.pair:  # the default pair (or the demo standing in) may not be the model it fits
        raise InvalidParamsError("--mmproj needs the model it was made for: add --target FILE or --pair NAME")
    from .catalog import load_config  # the Hub client and pydantic: only when a pair is used
    from .pairs import choose_pair, pair_status, resolve_pair

    config = load_config(paths, bundled=bundled)
    pair, note = choose_pair(flags.pair, config, paths)  # no --pair: the default pair, or the offline demo
    if note:
        log.warning("%s", note)
    if progress is not None and pair.target.kind == "builtin" and not pair_status(pair, paths).downloaded:
        progress("preparing the demo target (once: dequantizing SmolLM2 to F32)…")
    mmproj = Path(flags.mmproj) if flags.mmproj else None
    return resolve_pair(pair, config, paths, notice=note or "", mmproj=mmproj)


def switched(flags: RunFlags, pair: str | None) -> RunFlags:
    """The flags for loading pair `pair` (None, or the flags' own pair: the flags as they are). Another pair drops
    the files and the projector given for the first: a --mmproj fits the model it was made for only."""
    if pair is None or pair == flags.pair:
        return flags
    return dataclasses.replace(flags, pair=pair, target=None, draft=None, mmproj=None)


def load_with_flags(
    flags: RunFlags,
    paths: Paths,
    *,
    pair: str | None = None,
    choice: ResolvedPair | None = None,
    bundled: Path | None = None,
    n_seq: int | None = None,
    say: Callable[[str], None] | None = None,
    on_fraction: Callable[[float], bool | None] | None = None,
    before: Callable[[PairLoad], None] | None = None,
) -> PairLoad:
    """Load a pair by name (or the flags' files) with these flags: the one loader of `serve` and the chat's switch.

    Args:
        flags: the checked flags (or the chat's options): files or pair, load flags over the pair's own defaults.
        paths: localspec's folders.
        pair: another pair to load with the same flags (`switched`); None: the flags' own.
        choice: the pair already resolved (the chat's drafter change); None: resolved here.
        bundled: another bundled models.toml (tests).
        n_seq: the sequences (slots) the target's context holds (`LoadParams.n_seq`); None: the load's own.
        say: told what happens in words: the demo target derived, "loading T + D…", the weights sent to RPC
            workers (every 5%).
        on_fraction: told the fraction of the target's weights loaded, instead of `say`'s percentages.
        before: called once the pair is resolved and before its weights load (to free another, make room).

    Returns:
        The pair loaded, with its engine.

    Raises:
        LocalspecError: as `resolve_models`, `load_params` and `load_engine`; whatever `before` raises.
    """
    flags = switched(flags, pair)
    resolved = choice or resolve_models(flags, paths, bundled=bundled, progress=say)
    params = load_params(flags, resolved.defaults, has_draft=resolved.draft is not None)
    if n_seq is not None:
        params = dataclasses.replace(params, n_seq=n_seq)
    plan = PairLoad(resolved.name or resolved.target.name, resolved, params)
    if before is not None:
        before(plan)
    if say is not None:
        what = resolved.target.name
        if needs_draft_model(params.drafter) and resolved.draft is not None:
            what += f" + {resolved.draft.name}"
        say(f"loading {what}…")
        on_fraction = on_fraction or weights_progress(params, say, step=5)
    engine = load_engine(resolved.target, resolved.draft, params, on_fraction)
    return dataclasses.replace(plan, engine=engine)


def load_engine(
    target: str | Path,
    draft: str | Path | None,
    params: LoadParams,
    progress: Callable[[float], bool | None] | None = None,
) -> Engine:
    """Load target and draft (the draft only when the drafter uses it); shared by generate, bench and chat.

    `progress` gets the fraction of the target's weights loaded (worth showing when they go to RPC workers).

    Raises:
        LocalspecError: as `Engine.load` (a model drafter without a draft file among them).
    """
    return Engine.load(target, draft, params, progress=progress)  # the draft is opened only if the drafter uses it


def weights_progress(
    params: LoadParams, show: Callable[[str], None], *, step: int = 1
) -> Callable[[float], bool | None] | None:
    """For a load onto RPC workers: `show` gets "loading the target onto W: N%" whenever N reaches a new multiple
    of `step` (llama.cpp reports every tensor). None for a local load, which is quick."""
    if not params.rpc:
        return None
    where, shown = ", ".join(params.rpc), [-1]

    def on_fraction(fraction: float) -> None:
        percent = int(fraction * 100) // step * step
        if percent != shown[0]:
            shown[0] = percent
            show(f"loading the target onto {where}: {percent}%")

    return on_fraction


def load_pair(
    pair: str | None = None,
    *,
    paths: Paths | None = None,
    progress: Callable[[float], bool | None] | None = None,
    **options: Any,
) -> Engine:
    """Load a pair of models.toml as an `Engine`: the Python API's `localspec.load`.

    The pair's load settings apply (context length, drafter, GPU placement, RPC workers, bridge), under `options`;
    its sampling defaults are the caller's to pass to each generation, as the CLI's flags do. The offline demo
    pair's target is derived on its first use (a minute, once).

    Args:
        pair: the pair's name (`localspec models` lists them); None: the default pair, or the offline demo pair
            standing in when that is not downloaded.
        paths: localspec's folders; None: `get_paths()` (LOCALSPEC_HOME, else the platform's own folders).
        progress: told the fraction of the target's weights loaded.
        **options: fields of `LoadParams` that replace the pair's (`n_ctx=4096`, `drafter="ngram"`).

    Returns:
        The loaded engine: close it, or use it in a `with` block, to free the models.

    Raises:
        LocalspecError: an unknown pair, one not downloaded ("run `localspec pull NAME`"), a bad file or option.
    """
    flags = RunFlags(pair=pair)
    resolved = resolve_models(flags, paths or get_paths())
    params = load_params(flags, resolved.defaults, has_draft=resolved.draft is not None)
    return load_engine(resolved.target, resolved.draft, dataclasses.replace(params, **options), progress)


@contextmanager
def open_engine(args: RunFlags, paths: Paths) -> Iterator[tuple[Engine, PairDefaults]]:
    """Load the engine the flags describe; close it on exit."""
    resolved = resolve_models(args, paths)
    params = load_params(args, resolved.defaults, has_draft=resolved.draft is not None)
    line = StatusLine()
    try:
        engine = load_engine(resolved.target, resolved.draft, params, weights_progress(params, line.show))
    finally:
        line.keep()  # "loading the target onto W: 100%" stays above what follows
    try:
        yield engine, resolved.defaults
    finally:
        engine.close()


__all__ = [
    "PairLoad",
    "load_engine",
    "load_pair",
    "load_params",
    "load_with_flags",
    "open_engine",
    "resolve_models",
    "sampling_params",
    "speculative_params",
    "switched",
]
