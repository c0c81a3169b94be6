"""The pair subcommands: `localspec models`, `localspec pull`, `localspec doctor`.

`register(subparsers)` adds them to the main parser; each handler returns an exit code and raises
`LocalspecError` for the CLI to print as one line. These handlers are the only place here that prints:
the work itself is in `pairs`, `hub`, `demo` and `doctor`.
"""

from __future__ import annotations

import argparse
import json
import sys

from localspec.errors import ConfigError, LocalspecError
from localspec.models.catalog import ModelsConfig, load_config
from localspec.models.pairs import (
    PairStatus,
    PulledFile,
    file_problems,
    head_layers_of,
    media_of,
    pair_status,
    pull_pair,
    sidecar_line,
    vocabulary_verdict,
)
from localspec.models.preflight import head_report
from localspec.paths import Paths


def register(subparsers) -> None:
    """Add `models`, `pull` and `doctor` to an argparse subparsers object (each sets `func`)."""
    models = subparsers.add_parser(
        "models",
        help="list the model pairs and what is downloaded",
        description="List the pairs of models.toml (the bundled one and yours) and what of them is downloaded. "
        "Docs: docs/models.md.",
    )
    models.add_argument("--json", action="store_true", help="print a JSON list instead of text")
    models.set_defaults(func=cmd_models)

    pull = subparsers.add_parser(
        "pull",
        help="download a pair's target (and draft, and projector) from the Hugging Face Hub",
        description="Download a pair's target (and its draft and projector, where it names them) from the Hugging Face "
        "Hub and check them: the draft against the target, the projector opened beside it. Docs: docs/models.md.",
    )
    pull.add_argument("pair", nargs="?", help="the pair to download (see `localspec models`)")
    pull.add_argument("--all", action="store_true", help="download every pair")
    pull.add_argument("--dry-run", action="store_true", help="only say what would be downloaded, and how much")
    pull.set_defaults(func=cmd_pull)

    doctor = subparsers.add_parser(
        "doctor",
        help="check devices, paths and downloads; say what to fix",
        description="Check this machine's build, devices, folders and downloads, and say what to fix. "
        "Docs: docs/install.md.",
    )
    doctor.add_argument(
        "--gpu-memory",
        metavar="SIZE",
        help="plan each pair as if the GPU had SIZE free, e.g. 8G (on a build without a GPU: as if it had one)",
    )
    doctor.set_defaults(func=cmd_doctor)


def _gib(n: int | None) -> str:
    """A byte count for people: "4.36 GiB", "731 MiB", "12 KiB"."""
    if n is None:
        return "size unknown"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GiB" else f"{n / scale:.0f} {unit}"
    return f"{n} B"


def mtp_layers(n: int) -> str:
    return f"{n} MTP layer{'s' if n > 1 else ''}"


# --- models -------------------------------------------------------------------------------------------------


def _status_json(status: PairStatus, config: ModelsConfig) -> dict:
    pair = status.pair
    verdict = vocabulary_verdict(status)
    media = media_of(status)
    files = {
        s.role: {"ref": s.ref, "downloaded": s.downloaded, "path": str(s.path) if s.path else None, "size": s.size}
        for s in status.every_file
    }
    return {
        "name": pair.name,
        "source": pair.source,
        "default": pair.name == config.default,
        "description": pair.description,
        "target": status.target.ref,
        "draft": status.draft.ref if status.draft else None,  # None: the target alone (its MTP head, if any)
        "sidecar": status.sidecar or None,  # the draft's file when it is the target repo's mtp-* sidecar drafter
        "sidecar_found": status.found_draft,  # … which `pull` found beside a target the pair names alone
        "mmproj": status.mmproj.ref if status.mmproj else None,  # None: the pair reads text only
        "vision": media.vision,  # the projector's header says it sees images (None: not downloaded yet)
        "audio": media.audio,  # … hears audio
        "downloaded": status.downloaded,
        "vocabulary": verdict.kind if verdict else None,  # "same" or "bridged" (None: not downloaded)
        "mtp_layers": verdict.head_layers if verdict else head_layers_of(status),  # the target's own draft head
        "problems": file_problems(status),  # a damaged file, each in one line
        "files": files,
        "settings": {**pair.sampling_overrides(), **pair.speculative_overrides(), **pair.model_overrides()},
        "defined_in": str(pair.file),
    }


def cmd_models(args: argparse.Namespace, paths: Paths) -> int:
    """List every pair with its source, its references and their download state."""
    config = load_config(paths)
    statuses = [pair_status(pair, paths) for pair in config.pairs.values()]
    if args.json:
        print(json.dumps([_status_json(s, config) for s in statuses], indent=2))
        return 0
    for status in statuses:
        pair = status.pair
        tags = ", ".join(t for t in ("default" if pair.name == config.default else "", pair.source) if t)
        print(f"{pair.name} ({tags})" + (f" — {pair.description}" if pair.description else ""))
        for s in status.every_file:
            state = f"downloaded, {_gib(s.size)}" if s.downloaded else "not downloaded"
            print(f"    {s.role:<7} {s.ref}  [{state}]")
        if status.sidecar:
            print(f"    sidecar {sidecar_line(status)}")
        if problems := file_problems(status):
            for problem in problems:
                print(f"    damaged {problem}")
            continue
        if media := media_of(status).line:
            print(f"    media   {media}")
        if status.draft is None:
            print(f"    draft   {head_report(status.target.path if status.target.downloaded else None).line}")
            continue
        verdict = vocabulary_verdict(status)
        if verdict is not None and verdict.kind != "same":
            print(f"    vocab   {verdict.describe()} (the draft drafts through text)")
        if verdict is not None and verdict.head_layers:
            print(
                f"    head    {mtp_layers(verdict.head_layers)} in the target: it can draft for itself (--drafter mtp)"
            )
    missing = [s.pair.name for s in statuses if not s.downloaded]
    if missing:
        print(f"\nDownload a pair with `localspec pull NAME`. Your own pairs go in {paths.config_file}.")
    return 0


# --- pull ---------------------------------------------------------------------------------------------------


def _describe(done: PulledFile) -> str:
    action = {
        "present": f"already downloaded ({_gib(done.size)})",
        "downloaded": f"downloaded ({_gib(done.size)})",
        "derived": f"derived ({_gib(done.size)})",
        "would-download": f"would download {_gib(done.size)}",
        "would-derive": "would derive the F32 target locally (about 0.5 GiB)",
    }[done.action]
    where = f"  {done.path}" if done.path else ""
    return f"  {done.role:<7} {done.ref}: {action}{where}"


def cmd_pull(args: argparse.Namespace, paths: Paths) -> int:
    """Download one pair (or all), then check that each draft fits its target (a target alone: that it loads)."""
    config = load_config(paths)
    if args.all == bool(args.pair):
        raise ConfigError(f"name one pair to pull ({', '.join(config.pairs)}) or use --all, not both")
    names = list(config.pairs) if args.all else [config.get(args.pair).name]
    failed, unchecked = 0, []
    for name in names:
        print(f"{'dry run: ' if args.dry_run else ''}pull {name}")
        try:
            done = pull_pair(
                config.get(name),
                config,
                paths,
                dry_run=args.dry_run,
                notify=lambda line: print(f"  {line}", flush=True),
            )
        except LocalspecError as e:
            if args.dry_run:  # a dry run reports what it could not check, among its other lines
                print(f"  could not check: {e}")
                unchecked.append(name)
                continue
            if not args.all:
                raise
            print(f"localspec: error: {e}", file=sys.stderr)
            failed += 1
            continue
        for item in done:
            print(_describe(item))
        if not args.dry_run:
            drafts = any(item.role == "draft" for item in done)
            print("  ok: the draft can draft for the target" if drafts else "  ok: the target loads")
    if unchecked:
        print(
            f"localspec: note: dry run: {len(unchecked)} of {len(names)} pair(s) could not be checked "
            f"({', '.join(unchecked)}): see the lines above",
            file=sys.stderr,
        )
    return 1 if failed else 0


# --- doctor -------------------------------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace, paths: Paths) -> int:
    """Print the doctor's report; exit 0 even when it found things to fix (it says what to do)."""
    from localspec.core.params import parse_size

    from .doctor import run_doctor

    gpu_memory = parse_size(args.gpu_memory) if getattr(args, "gpu_memory", None) is not None else None
    report = run_doctor(paths, gpu_memory=gpu_memory)
    for line in report.lines():
        print(line)
    problems = report.problems
    print(f"\n{len(problems)} thing(s) to look at." if problems else "\nAll good.")
    return 0
