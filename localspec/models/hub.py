"""Model files from the Hugging Face Hub: resolve a reference to file names, find them in the cache, download.

Downloads go through `huggingface_hub.hf_hub_download` into the shared HF cache: locking, resuming a cut
connection, `HF_HUB_OFFLINE` and the cache layout are huggingface_hub's, never ours. This module adds what
a GGUF user needs on top: picking the file of a quantization ("owner/repo:Q4_K_M"), split files, the sidecar
drafter a repository ships beside its model (`mtp-*.gguf`, found as llama-server's `-hf` finds it), and one line a
user can act on for every failure (gated repository, missing quant, dead network, full disk).
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import DownloadError

from .catalog import ModelSource

log = logging.getLogger(__name__)

ProgressCallback = Callable[[str, int, "int | None"], None]
"""Called as bytes arrive: (file name, bytes so far, total bytes or None)."""

_SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_QUANT_NAME_RE = re.compile(
    r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|TQ\d_\d|BF16|F16|F32|FP16|FP32|MXFP4)(?![A-Za-z0-9])", re.IGNORECASE
)
_MAX_LISTED = 12
# Files beside a model that are not models, by the words llama.cpp looks for in a file's name, case as written
# (ggml-org/llama.cpp common/download.cpp @0216dab, `gguf_filename_is_model`): speculative sidecars and imatrix data.
_NOT_A_MODEL = ("imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
SIDECAR_WORD = "mtp-"  # the sidecar drafter localspec drafts with (llama.cpp's `find_best_mtp` keyword)
_TAG_RE = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class RemoteFile:
    """One file of a Hub repository."""

    repo: str
    filename: str
    size: int | None


# --- quantization names --------------------------------------------------------------------------------------


def _is_model_file(filename: str, projector: bool = False) -> bool:
    """A .gguf file of the kind asked for: a model (not a sidecar drafter or imatrix file), or (`projector`) an
    mmproj file."""
    name = filename.rsplit("/", 1)[-1]
    if not name.lower().endswith(".gguf") or ("mmproj" in name.lower()) != projector:
        return False
    return projector or not any(word in name for word in _NOT_A_MODEL)


def is_sidecar(filename: str) -> bool:
    """Whether a file of a repository is a sidecar drafter by llama.cpp's rule: a .gguf whose path has `mtp-`."""
    return filename.endswith(".gguf") and SIDECAR_WORD in filename


def _shard_group(filename: str) -> str:
    """The name a file shares with its sibling shards ("x-00001-of-00003.gguf" -> "x.gguf")."""
    return _SHARD_RE.sub(".gguf", filename)


def quant_of(filename: str) -> str | None:
    """The quantization named in a .gguf file name ("Qwen3-8B-Q4_K_M.gguf" -> "Q4_K_M"), or None."""
    stem = _SHARD_RE.sub("", filename.rsplit("/", 1)[-1]).removesuffix(".gguf")
    found = _QUANT_NAME_RE.findall(stem)
    return found[-1].upper() if found else None


def available_quants(filenames: list[str]) -> list[str]:
    """The quantizations a repository offers, from its .gguf file names, sorted."""
    return sorted({q for f in filenames if _is_model_file(f) and (q := quant_of(f))})


def match_quant(filenames: list[str], quant: str, *, projector: bool = False) -> list[str]:
    """The file(s) of one quantization: a single file, or every shard of a split model in order.

    A quant matches when it appears in the file name as a whole word (case-insensitive), so "Q4_K" does not
    pick "Q4_K_M". Projector files (mmproj) match only when `projector` is set, and then only they do. Among several
    matching files the shortest name wins.

    Returns:
        The chosen files (empty when none matches).
    """
    pattern = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(quant)}(?![A-Za-z0-9_])", re.IGNORECASE)
    groups: dict[str, list[str]] = {}
    for f in filenames:
        if _is_model_file(f, projector) and pattern.search(f.rsplit("/", 1)[-1]):
            groups.setdefault(_shard_group(f), []).append(f)
    if not groups:
        return []
    best = min(groups, key=lambda g: (len(g), g))
    if len(groups) > 1:
        log.info("several files match %s (%s); using %s", quant, ", ".join(sorted(groups)), best)
    return sorted(groups[best])


def _quant_bits(tag: str) -> int:
    """The bits a quantization tag names: its first number ("Q4_K_M" -> 4, "BF16" -> 16, "it" -> 0)."""
    digits = re.search(r"\d+", tag)
    return int(digits.group()) if digits else 0


def _file_bits(filename: str) -> int:
    """The bits of a .gguf file's quantization, from the last word of its name (llama.cpp's `extract_quant_bits`)."""
    if not filename.endswith(".gguf"):
        return 0
    tag = _TAG_RE.search(_SHARD_RE.sub("", filename).removesuffix(".gguf"))
    return _quant_bits(tag.group(1)) if tag else 0


def sidecar_name(filenames: list[str], model: str, tag: str = "") -> str | None:
    """The sidecar drafter (`mtp-*.gguf`) a repository ships for its model file `model`, by llama-server's rule
    (ggml-org/llama.cpp common/download.cpp @0216dab, `find_best_sibling` with the keyword "mtp-"; its cases in
    tests/test-model-resolution.cpp): among the .gguf files whose path holds "mtp-" (case as written) in the model's
    folder or a folder above it, the deepest folder wins, then one named with the exact `tag` ("-Q8_0."), then the
    quantization closest in bits to the tag's (to the model file's without a tag); the first listed breaks a tie.

    Returns:
        The file's name in the repository, or None when it ships none.
    """
    tag = tag.upper()
    model_bits = _quant_bits(tag) if tag else _file_bits(model)
    model_dir = model.split("/")[:-1]
    best, best_key = None, (-1, False, 0)
    for name in filenames:
        folder = name.split("/")[:-1]
        if not is_sidecar(name) or folder != model_dir[: len(folder)]:
            continue
        exact = bool(tag) and f"-{tag}." in name.upper()
        key = (len(folder), exact, -abs(_file_bits(name) - model_bits))
        if key > best_key:
            best, best_key = name, key
    return best


def _sidecar_of(ref: ModelSource, filenames: list[str]) -> ModelSource | None:
    """The sidecar drafter among a repository's `filenames` for the target `ref` names there, as a Hub reference."""
    model = _select(ref, filenames, projector=False)
    name = sidecar_name(filenames, model[0], ref.quant or "") if model else None
    return ModelSource(repo=ref.repo, file=name) if name else None


def _select(ref: ModelSource, filenames: list[str], projector: bool) -> list[str]:
    """The files `ref` names among a repository's files (empty when absent)."""
    if ref.file:
        return [ref.file] if ref.file in filenames else []
    return match_quant(filenames, ref.quant or "", projector=projector)


def _listing(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    return shown + (f", … ({len(items)} in all)" if len(items) > _MAX_LISTED else "") if items else "none"


# --- the cache (no network) ------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """The Hugging Face hub cache in use (`HF_HUB_CACHE`, `HF_HOME`, or ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def is_offline() -> bool:
    """True when `HF_HUB_OFFLINE` is set: huggingface_hub then only reads the cache."""
    from huggingface_hub import constants

    check = getattr(constants, "is_offline_mode", None)
    return bool(check() if callable(check) else constants.HF_HUB_OFFLINE)


def _cached_filenames(repo: str) -> list[str]:
    """File names of the cached snapshot of `repo` that `main` points to (or the newest), without network."""
    from huggingface_hub import CacheNotFound, scan_cache_dir

    try:
        info = scan_cache_dir(cache_dir())
    except (CacheNotFound, OSError):
        return []
    for cached in info.repos:
        if cached.repo_id == repo and cached.repo_type == "model" and cached.revisions:
            revision = max(cached.revisions, key=lambda r: ("main" in r.refs, r.last_modified))
            return [str(f.file_path.relative_to(revision.snapshot_path)) for f in revision.files]
    return []


def find_cached(ref: ModelSource, *, projector: bool = False) -> Path | None:
    """The local path of a Hub model (or, with `projector`, of an mmproj file) if every file of it is already in the
    cache; no network.

    Returns:
        The path to load (the first shard of a split model), or None when something is missing.
    """
    from huggingface_hub import try_to_load_from_cache

    assert ref.repo, "only Hub references live in the cache"
    names = [ref.file] if ref.file else match_quant(_cached_filenames(ref.repo), ref.quant or "", projector=projector)
    paths = []
    for name in names:
        found = try_to_load_from_cache(ref.repo, name, cache_dir=cache_dir())
        if not isinstance(found, str):
            return None
        paths.append(Path(found))
    return paths[0] if paths else None


def cached_sidecar(ref: ModelSource) -> ModelSource | None:
    """The sidecar drafter of the Hub target `ref` if `pull` downloaded it (`sidecar_name` over the cached files of
    its repository); no network."""
    assert ref.repo, "only Hub references have a repository"
    found = _sidecar_of(ref, sorted(_cached_filenames(ref.repo)))
    if found is None or found.file is None:
        return None
    from huggingface_hub import try_to_load_from_cache

    return found if isinstance(try_to_load_from_cache(ref.repo, found.file, cache_dir=cache_dir()), str) else None


def cached_size(path: Path) -> int:
    """Bytes on disk of a model file, counting every shard of a split model."""
    match = _SHARD_RE.search(path.name)
    if not match:
        return path.stat().st_size
    siblings = path.parent.glob(_SHARD_RE.sub("", path.name) + f"-*-of-{match.group(2)}.gguf")
    return sum(p.stat().st_size for p in siblings)


# --- the Hub (network) -----------------------------------------------------------------------------------------


def remote_files(ref: ModelSource, *, projector: bool = False) -> list[RemoteFile]:
    """The files `ref` names on the Hub, with sizes (one request, no retries); `projector`: among its mmproj files.

    Raises:
        DownloadError: unreachable Hub, unknown or gated repository, or no file for the quant / file name.
    """
    sizes = _remote_sizes(ref)
    chosen = _select(ref, list(sizes), projector)
    assert ref.repo is not None  # a Hub reference (a path is never looked up)
    if chosen:
        return [RemoteFile(ref.repo, name, sizes[name]) for name in chosen]
    ggufs = sorted(f for f in sizes if _is_model_file(f, projector))
    if ref.file:
        kind = "mmproj" if projector else "GGUF"
        raise DownloadError(f"{ref.repo} has no file {ref.file!r}; its {kind} files: {_listing(ggufs)}")
    if projector:
        raise DownloadError(
            f"{ref.repo} has no {ref.quant} projector; its mmproj files: {_listing(ggufs)} "
            '(name one in models.toml: mmproj = { repo = "...", file = "..." })'
        )
    raise DownloadError(
        f"{ref.repo} has no {ref.quant} file; quants it has: {_listing(available_quants(ggufs))} "
        f'(write "{ref.repo}:QUANT" in models.toml)'
    )


def remote_sidecar(ref: ModelSource) -> ModelSource | None:
    """The sidecar drafter the Hub repository of target `ref` ships beside it (`sidecar_name`), or None; one request.

    Raises:
        DownloadError: unreachable Hub, unknown or gated repository.
    """
    return _sidecar_of(ref, sorted(_remote_sizes(ref)))


def _remote_sizes(ref: ModelSource) -> dict[str, int | None]:
    """Every file of the repository of `ref` on the Hub, with its size (one request, no retries)."""
    from huggingface_hub import HfApi

    assert ref.repo, "only Hub references can be listed"
    with hub_errors(ref):
        info = HfApi().model_info(ref.repo, files_metadata=True)
    return {s.rfilename: s.size for s in info.siblings or []}


def download(
    ref: ModelSource, *, progress: ProgressCallback | None = None, projector: bool = False, force: bool = False
) -> Path:
    """Make sure every file of `ref` is in the HF cache and return the path to load.

    Args:
        ref: a Hub reference.
        progress: called as bytes arrive; None shows huggingface_hub's own progress bar per file.
        projector: `ref` names an mmproj file (a quant then picks among those only).
        force: download it again even though it is cached (the cached copy is damaged).

    Returns:
        The local path (first shard of a split model).

    Raises:
        DownloadError: see `hub_errors`.
    """
    from huggingface_hub import hf_hub_download

    cached = None if force else find_cached(ref, projector=projector)
    if cached is not None:
        log.info("%s is already downloaded: %s", ref.label(), cached)
        return cached
    if is_offline():
        where = "is damaged in" if force else "is not in"
        raise DownloadError(
            f"{ref.label()} {where} the Hugging Face cache ({cache_dir()}) and HF_HUB_OFFLINE "
            "is set: unset HF_HUB_OFFLINE to download it"
        )
    paths = []
    for remote in remote_files(ref, projector=projector):
        log.info("downloading %s from %s (%s bytes)", remote.filename, remote.repo, remote.size)
        with hub_errors(ref, remote.size):
            got = hf_hub_download(
                remote.repo, remote.filename, tqdm_class=_progress_class(progress), force_download=force
            )
            paths.append(Path(got))
    return paths[0]


def _progress_class(callback: ProgressCallback | None):
    """A tqdm class that reports to `callback` instead of drawing a bar (None keeps the default bar)."""
    if callback is None:
        return None
    report: ProgressCallback = callback  # narrowed, for the class below
    from tqdm import tqdm

    class _Reporter(tqdm):
        def __init__(self, *args, **kwargs):
            self._label = str(kwargs.get("desc") or "")
            self._done = int(kwargs.get("initial") or 0)
            super().__init__(*args, **{**kwargs, "disable": True})

        def update(self, n: float | None = 1) -> bool | None:
            self._done += int(n or 0)
            report(self._label, self._done, self.total)
            return None

    return _Reporter


def _network_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "could not talk to the Hub", whichever HTTP library huggingface_hub uses."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, name in (
        ("httpx2", "TransportError"),
        ("httpx", "TransportError"),
        ("requests", "ConnectionError"),
        ("requests", "Timeout"),
    ):
        with contextlib.suppress(ImportError, AttributeError):
            found.append(getattr(importlib.import_module(module), name))
    return tuple(found)


@contextlib.contextmanager
def hub_errors(ref: ModelSource, size: int | None = None) -> Iterator[None]:
    """Turn huggingface_hub's and the OS's exceptions into one-line `DownloadError`s.

    Args:
        ref: what was being fetched (named in the message).
        size: expected bytes, mentioned when the disk is full.
    """
    from huggingface_hub import errors as hf

    repo, label = ref.repo or "", ref.label()
    login = "log in with `hf auth login` or set HF_TOKEN"
    try:
        yield
    except hf.GatedRepoError as e:
        raise DownloadError(
            f"{repo} is gated: accept its license at https://huggingface.co/{repo}, then {login}"
        ) from e
    except hf.RepositoryNotFoundError as e:
        raise DownloadError(f"repository {repo} was not found on the Hub (if it is private, {login})") from e
    except hf.RevisionNotFoundError as e:
        raise DownloadError(f"{repo} has no such revision: check the reference {label}") from e
    except hf.OfflineModeIsEnabled as e:
        raise DownloadError(
            f"{label} is not in the Hugging Face cache and HF_HUB_OFFLINE is set: unset HF_HUB_OFFLINE to download it"
        ) from e
    except hf.LocalEntryNotFoundError as e:
        raise DownloadError(
            f"cannot reach the Hugging Face Hub to download {label}: check your network "
            "connection (or HF_ENDPOINT) and retry"
        ) from e
    except hf.HfHubHTTPError as e:
        raise DownloadError(_http_error_line(e, repo, label, login)) from e
    except _network_errors() as e:
        raise DownloadError(
            f"cannot reach the Hugging Face Hub to download {label} ({type(e).__name__}): "
            "check your network connection (or HF_ENDPOINT) and retry"
        ) from e
    except OSError as e:
        raise DownloadError(_os_error_line(e, label, size)) from e


def _http_error_line(error, repo: str, label: str, login: str) -> str:
    status = getattr(getattr(error, "response", None), "status_code", None)
    if status in (401, 403):
        return f"the Hub refused access to {repo} (HTTP {status}): accept its license on huggingface.co, then {login}"
    if status == 404:
        return f"{label} was not found on the Hub (HTTP 404): check the reference in models.toml"
    return f"the Hub failed while downloading {label} (HTTP {status}): retry later"


def _os_error_line(error: OSError, label: str, size: int | None) -> str:
    if error.errno == errno.ENOSPC:
        need = f" (it needs {size / 2**30:.1f} GiB)" if size else ""
        return (
            f"the disk is full while downloading {label}{need}: free space in {cache_dir()} "
            "or point HF_HUB_CACHE at a bigger disk"
        )
    if error.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
        return f"cannot write {label} into {cache_dir()} ({error.strerror}): fix its permissions or set HF_HUB_CACHE"
    return f"downloading {label} failed: {str(error).splitlines()[0] if str(error) else type(error).__name__}: retry"
