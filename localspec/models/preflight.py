"""What a pair's model files can do, before the pair loads: what a target alone drafts with, read from its GGUF header
(its own MTP head and whether this llama.cpp runs it, n-grams, or nothing — and why a file cannot be used at all, so
a damaged one is never called usable: `head_report`, for `pull`, `models`, `doctor` and the chat's pair list), and
the pre-flight loads of a target alone or of a target and its draft (`check_target_file`, `check_files`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import LocalspecError
from localspec.llama.compat import PairVerdict, check_pair, check_target, head_layers
from localspec.llama.footprint import Header, header_problem, read_header
from localspec.llama.model import Model
from localspec.llama.mtp import head_problem

log = logging.getLogger(__name__)


def describe_head(layers: int | None) -> str:
    """What a target-only pair drafts with, for `pull`, `models`, `doctor` and the chat's pair list."""
    if layers is None:
        return "no draft: the target drafts with its own MTP head if it has one (download it to see)"
    if layers:
        return f"no draft: the target drafts with its own MTP head ({layers} MTP layer{'s' if layers > 1 else ''})"
    return "no draft and no MTP head: plain decoding (or --drafter ngram)"


@dataclass(frozen=True, slots=True)
class HeadReport:
    """What a target alone drafts with, as its header tells it (`head_report`)."""

    line: str  # for pull, models and doctor
    short: str  # for the chat's pair list


def head_report(path: Path | None) -> HeadReport:
    """What the target alone at `path` drafts with (None: not downloaded): its own MTP head, n-grams or nothing, or
    why it cannot be used at all — from its header, so that a damaged file is never called usable."""
    if path is None:
        return HeadReport(describe_head(None), "no draft")
    try:
        header = read_header(path)
    except LocalspecError as e:
        return HeadReport(f"unusable: {e}", "unusable")
    if problem := header_problem(header):
        return HeadReport(f"unusable: {path.name} {problem}", "unusable")
    tokenizer, tokens = header.meta.get("tokenizer.ggml.model"), header.meta.get("tokenizer.ggml.tokens")
    if tokenizer in (None, "none") or not tokens:
        return HeadReport(
            f"unusable: {path.name} has no tokenizer to write text with: choose a GGUF that carries its tokenizer",
            "no tokenizer",
        )
    layers = int(header.hparam("nextn_predict_layers", 0))  # type: ignore[call-overload]  # a count: checked above
    if not layers:
        return HeadReport(describe_head(0), "no draft, no head")
    if block := _missing_head_block(header, layers):
        return HeadReport(
            f"no draft: its header claims {layers} MTP layer{'s' if layers > 1 else ''} but {block} has no tensors "
            "(llama.cpp will likely refuse the file: re-download or re-convert it)",
            "MTP head missing",
        )
    if problem := head_problem(header.arch, layers):
        return HeadReport(f"no draft: {problem}: it drafts with n-grams", "n-gram drafts")
    return HeadReport(describe_head(layers), "MTP head")


def _missing_head_block(header: Header, layers: int) -> str:
    """The first MTP block (the last `layers` of the blocks) the file has no tensors for ("" when it has all)."""
    n_layer = header.hparam("block_count", 0)
    present = {name.split(".")[1] for name, _ in header.tensors if name.startswith("blk.")}
    for i in range(int(n_layer) - layers, int(n_layer)):  # type: ignore[call-overload]
        if str(i) not in present:
            return f"blk.{i}"
    return ""


def load_vocab(path: Path) -> Model:
    """Load a model for the compatibility check: vocabulary only when the backend offers it."""
    return Model(path, n_gpu_layers=0, vocab_only=True)


def check_target_file(path: Path | None) -> int:
    """The pre-flight on a target alone: it loads and can write text. Returns the MTP layers it carries.

    Raises:
        ModelFileError: the file cannot be loaded, or it has no tokenizer.
    """
    assert path is not None
    with load_vocab(path) as target:
        check_target(target)
        layers = head_layers(target)
    log.info("%s alone: %d MTP layer(s)", path.name, layers)
    return layers


def check_files(target_path: Path | None, draft_path: Path | None, *, hint: str = "") -> PairVerdict:
    """The pre-flight on two model files: same vocabulary, or bridged (the draft drafts through text).

    Raises:
        IncompatibleDraftError: names the first difference and `hint`.
        ModelFileError: a file cannot be loaded.
    """
    assert target_path is not None and draft_path is not None
    with load_vocab(target_path) as target, load_vocab(draft_path) as draft:
        verdict = check_pair(target, draft, hint=hint)
    log.info("%s drafts for %s: %s", draft_path.name, target_path.name, verdict.describe())
    return verdict
