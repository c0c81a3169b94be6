"""From the chat's options (or a pair picked in the app) to a loaded `Engine`, plus the pair list and pull.

These functions block (files are read, the demo target may be derived, llama.cpp loads the models), so
the app calls them from thread workers and passes a `progress` callback that posts messages. They use
the pairs API (`localspec.pairs`) and never touch Textual. Folders and models.toml come from the chat's
options (`ChatOptions.paths`, `bundled_config`); models.toml is read again each time, so edits show.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from localspec.core.engine import Engine
from localspec.core.params import PairDefaults
from localspec.models import demo
from localspec.models.catalog import ModelsConfig, load_config
from localspec.models.loading import load_engine, load_params, weights_progress
from localspec.models.pairs import choose_pair, pair_status, pull_pair, resolve_pair

from .settings import ChatOptions

log = logging.getLogger("localspec.tui.loading")

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """Which files to load and with what defaults."""

    target: Path
    draft: Path | None
    label: str  # what the header shows: the pair name, or the file names
    pair: str | None  # the pair's name (None for --target/--draft)
    settings: PairDefaults  # the pair's defaults that were set (models.toml)
    note: str | None = None  # e.g. "using the offline demo pair"


@dataclass(frozen=True, slots=True)
class Loaded:
    """A loaded engine and what the app shows and remembers about it."""

    engine: Engine
    choice: ModelChoice
    drafter: str


@dataclass(frozen=True, slots=True)
class PairRow:
    """One line of the pair switcher."""

    name: str
    description: str
    ready: bool  # both files are here (or it is the demo pair, derived on first load)
    status: str  # "downloaded", "not downloaded", "offline demo" …
    default: bool


def choose_models(options: ChatOptions, pair: str | None, progress: Progress) -> ModelChoice:
    """Resolve `pair` (or the options' --target/--draft when pair is None) to files.

    Raises:
        LocalspecError: unknown pair, invalid models.toml, files not downloaded.
    """
    if pair is None and options.target:
        target = Path(options.target)
        draft = Path(options.draft) if options.draft else None
        label = target.name + (f" + {draft.name}" if draft else "")
        return ModelChoice(target, draft, label, None, PairDefaults())
    paths, config = options.paths, _config(options)
    chosen, note = choose_pair(pair or options.pair, config, paths)
    if chosen.target.kind == "builtin" and not pair_status(chosen, paths).downloaded:
        progress("preparing the demo target (once: dequantizing SmolLM2 to F32)…")
    resolved = resolve_pair(chosen, config, paths)
    defaults = chosen.defaults(compat_hint=resolved.hint, notice=note or "")
    return ModelChoice(resolved.target_path, resolved.draft_path, chosen.name, chosen.name, defaults, note)


def load_models(options: ChatOptions, choice: ModelChoice, drafter: str | None, progress: Progress) -> Loaded:
    """Load the chosen files into an Engine (the same precedence as `localspec generate`).

    Raises:
        LocalspecError: bad files, incompatible draft, n_ctx too large, a drafter that needs a missing draft.
    """
    if drafter:
        options = dataclasses.replace(options, drafter=drafter)
    params = load_params(options, choice.settings, has_draft=choice.draft is not None)
    what = choice.target.name + (f" + {choice.draft.name}" if params.uses_draft_model and choice.draft else "")
    progress(f"loading {what}…")
    engine = load_engine(choice.target, choice.draft, params, weights_progress(params, progress, step=5))
    log.info("loaded %s (drafter %s, n_ctx %d)", what, params.drafter, engine.n_ctx)
    return Loaded(engine, choice, params.drafter)


def list_pairs(options: ChatOptions) -> list[PairRow]:
    """Every pair of the merged models.toml with whether it can load now (no network).

    Raises:
        ConfigError: an invalid models.toml.
    """
    paths, config = options.paths, _config(options)
    rows = []
    for name, pair in sorted(config.pairs.items()):
        downloaded = pair_status(pair, paths).downloaded
        if pair.target.kind == "builtin" and not downloaded:
            ready = demo.packaged_draft() is not None
            status = "offline demo" if ready else "needs localspec[demo]"
        else:
            ready, status = downloaded, "downloaded" if downloaded else "not downloaded"
        rows.append(PairRow(name, pair.description, ready, status, name == config.default))
    return rows


def pull(options: ChatOptions, name: str, progress: Progress, on_bytes: Callable[[str, int, int | None], None]) -> None:
    """Download both files of pair `name` (huggingface_hub does caching and resuming) and check them.

    Raises:
        LocalspecError: unknown pair, network, disk, gated repository, incompatible draft.
    """
    config = _config(options)
    pull_pair(config.get(name), config, options.paths, progress=on_bytes, notify=progress)


def _config(options: ChatOptions) -> ModelsConfig:
    """The merged models.toml of the options' folders, read now."""
    return load_config(options.paths, bundled=options.bundled_config)
