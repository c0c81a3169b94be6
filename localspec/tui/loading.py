"""From the chat's options (or a pair picked in the app) to a loaded `Engine`, plus the pair list and pull.

These functions block (files are read, the demo target may be derived, llama.cpp loads the models), so
the app calls them from thread workers and passes a `progress` callback that posts messages. A pair loads through
`serve`'s loader (`models.loading.load_with_flags`); nothing here touches Textual. Folders and models.toml come
from the chat's options (`ChatOptions.paths`, `bundled_config`); models.toml is read again each time.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

from localspec.core.engine import Engine
from localspec.models import demo
from localspec.models.catalog import ModelsConfig, load_config
from localspec.models.loading import load_with_flags
from localspec.models.pairs import draft_of, file_problems, pair_status, pull_pair
from localspec.models.preflight import head_report
from localspec.models.resolved import ResolvedPair

from .settings import ChatOptions

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Loaded:
    """A loaded engine and what the app shows and remembers about it."""

    engine: Engine
    pair: ResolvedPair  # what was loaded: the pair (or files), its defaults and notice
    drafter: str


@dataclass(frozen=True, slots=True)
class PairRow:
    """One line of the pair switcher."""

    name: str
    description: str
    ready: bool  # its files are here (or it is the demo pair, derived on first load)
    status: str  # "downloaded", "not downloaded", "offline demo" …; a target alone says what drafts for it
    default: bool
    fix: str = ""  # a local file that is missing: what to fix instead of downloading (never offered a pull)


def load_models(
    options: ChatOptions, choice: ResolvedPair | None, drafter: str | None, progress: Progress, pair: str | None = None
) -> Loaded:
    """Load `pair` (None: the options' pair or --target/--draft) into an Engine as `serve` does
    (`models.loading.load_with_flags`): another pair drops the options' files and projector.

    Args:
        choice: the pair already resolved (a drafter change); None: resolved now.
        drafter: the drafter to load with instead of the options' (None: theirs, else the pair's).
        progress: told in words what the load does (the demo derived, "loading T + D…", RPC percentages).

    Raises:
        LocalspecError: unknown pair, invalid models.toml, files not downloaded, bad files, incompatible draft,
            n_ctx too large, a drafter that needs a missing draft.
    """
    if drafter:
        options = dataclasses.replace(options, drafter=drafter)
    loaded = load_with_flags(
        options, options.paths, pair=pair, choice=choice, bundled=options.bundled_config, say=progress
    )
    assert loaded.engine is not None  # a load returns its engine
    engine = loaded.engine
    log.info("loaded %s (drafter %s, n_ctx %d)", loaded.resolved.label, engine.drafter.kind, engine.n_ctx)
    return Loaded(engine, loaded.resolved, engine.drafter.kind)


def list_pairs(options: ChatOptions) -> list[PairRow]:
    """Every pair of the merged models.toml with whether it can load now (no network).

    Raises:
        ConfigError: an invalid models.toml.
    """
    paths, config = options.paths, _config(options)
    rows = []
    for name, pair in sorted(config.pairs.items()):
        files = pair_status(pair, paths)
        downloaded = files.downloaded
        if pair.target.kind == "builtin" and not downloaded:
            ready = demo.packaged_draft() is not None
            status = "offline demo" if ready else "needs localspec[demo]"
        else:
            ready, status = downloaded, "downloaded" if downloaded else "not downloaded"
        fix = ""
        missing = [
            f for f, ref in zip(files.files, _refs(pair), strict=True) if ref.kind == "path" and not f.downloaded
        ]
        if problems := file_problems(files):  # the header read is cheap: no model is loaded for it
            ready, status, fix = False, "damaged file: see `localspec models`", problems[0]
        elif missing:
            status = "file missing: fix its path in models.toml"
            fix = (
                f"the {missing[0].role} of pair {name!r} is not a file: {missing[0].ref} (fix its path in {pair.file})"
            )
        elif files.draft is None:
            status += f", {head_report(files.target.path if downloaded else None).short}"
        rows.append(PairRow(name, pair.description, ready, status, name == config.default, fix))
    return rows


def _refs(pair) -> tuple:
    """The pair's sources in the order of its files: the target's, then the draft's if it has one (the sidecar drafter
    `pull` found for a target alone included)."""
    draft, _ = draft_of(pair)
    return (pair.target,) if draft is None else (pair.target, draft)


def pull(options: ChatOptions, name: str, progress: Progress, on_bytes: Callable[[str, int, int | None], None]) -> None:
    """Download the files of pair `name` (huggingface_hub does caching and resuming) and check them.

    Raises:
        LocalspecError: unknown pair, network, disk, gated repository, incompatible draft.
    """
    config = _config(options)
    pull_pair(config.get(name), config, options.paths, progress=on_bytes, notify=progress)


def _config(options: ChatOptions) -> ModelsConfig:
    """The merged models.toml of the options' folders, read now."""
    return load_config(options.paths, bundled=options.bundled_config)
