"""Checks that run before anything heavy: every command-line flag of `generate`, `chat` and `bench`.

`check_run_args` validates the flags of `generate`, `chat` and `bench` (numbers at their bounds, model files,
the chat template name, text encodings) before any model is loaded or derived, so a typo costs no wait, and
returns them as one frozen `RunFlags` (models/flags.py): what the commands and `models.loading` read, never the
argparse namespace.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from localspec.core.params import (
    DEFAULT_MAX_TOKENS,
    N_CTX_MIN,
    OPTIONS,
    SAMPLING_OPTIONS,
    SPECULATIVE_OPTIONS,
    parse_size,
)
from localspec.errors import InvalidParamsError, LocalspecError
from localspec.llama.rpc import parse_rpc
from localspec.llama.threads import check_threads, threads_from_env
from localspec.models.flags import RunFlags

if TYPE_CHECKING:
    from localspec.llama.pictures import Image

from .flags import overrides_from_args
from .textinput import clean

MAX_IMAGE_FILE = 64 * 2**20  # --image: a larger file is refused before it is read (the chat's cap)

N_CTX_MAX = 2**31 - 1
N_MAX = 10_000


def _bounded(args: argparse.Namespace, name: str, low: int | float, high: int | float | None = None) -> None:
    value = getattr(args, name, None)
    if value is None:
        return
    flag = "--" + name.replace("_", "-")
    if value < low or (high is not None and value > high):
        span = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise InvalidParamsError(f"{flag} {value} is out of range: use a value {span}")


def check_run_args(args: argparse.Namespace) -> RunFlags:
    """Validate the flags of `generate`, `chat` or `bench`; the namespace is left as it is.

    Returns:
        The flags as values: text cleaned, --rpc parsed, threads from the environment when not given.

    Raises:
        LocalspecError: the first flag out of range, a missing model file, an unknown template name.
    """
    from localspec.core.params import SpeculativeParams
    from localspec.core.sampling import SamplingParams

    _bounded(args, "n_ctx", N_CTX_MIN, N_CTX_MAX)
    _bounded(args, "n_gpu_layers", -1, 2**31 - 1)
    _bounded(args, "n_gpu_layers_draft", -1, 2**31 - 1)
    gpu_memory = getattr(args, "gpu_memory", None)
    if gpu_memory is not None:
        gpu_memory = parse_size(clean(gpu_memory)[0])
    cache_ram = getattr(args, "cache_ram", None)
    if cache_ram is not None:
        cache_ram = clean(cache_ram)[0]
        cache_ram = 0 if cache_ram.strip() == "0" else parse_size(cache_ram, "--cache-ram")
    _bounded(args, "max_tokens", 1)
    _bounded(args, "n", 1, N_MAX)
    if args.threads is not None:
        check_threads(args.threads)
    threads = args.threads if args.threads is not None else threads_from_env()
    overrides = overrides_from_args(args)
    for opt in OPTIONS:  # the option table's limits, said with the flag as it was typed
        value = overrides.get(opt.name)
        if value is not None and opt.limit is not None and (problem := opt.limit.problem(opt.name, value)):
            raise InvalidParamsError(f"{opt.flag} {value} is out of range: {problem}")
    SamplingParams(**{n: overrides[n] for n in SAMPLING_OPTIONS if n in overrides})
    SpeculativeParams(**{n: overrides[n] for n in SPECULATIVE_OPTIONS if n in overrides})
    rpc = parse_rpc(clean(args.rpc)[0]) if getattr(args, "rpc", None) is not None else ()
    system = _text(getattr(args, "system", None))
    if system is not None and getattr(args, "chat", True) is False:
        raise InvalidParamsError("--system only applies with --chat: add --chat or drop --system")
    pair, chat_template = _text(args.pair), _text(args.chat_template)
    if chat_template is not None and getattr(args, "chat", True) is False:  # generate wraps only with --chat
        raise InvalidParamsError("--chat-template only applies with --chat: add --chat or drop --chat-template")
    think = {"on": True, "off": False, None: None}[getattr(args, "think", None)]
    if think is not None and getattr(args, "chat", True) is False:
        raise InvalidParamsError("--think only applies with --chat (it goes to the chat template): add --chat")
    stop = tuple(clean(s)[0] for s in (getattr(args, "stop", None) or []))
    if "" in stop:
        raise InvalidParamsError('--stop "" is empty and would never stop anything: give the text to stop at')
    _check_files(args)
    if chat_template:
        from localspec.errors import ChatTemplateError
        from localspec.llama.templates import builtin_chat_templates

        names = builtin_chat_templates()
        if chat_template not in names:
            raise ChatTemplateError(f"unknown chat template {chat_template!r}: choose one of {', '.join(names)}")
    cache_dir, cache_dir_size = _cache_dir(getattr(args, "cache_dir", None))  # last: it creates the directory
    return RunFlags(
        pair=pair,
        target=args.target,
        draft=args.draft,
        mmproj=getattr(args, "mmproj", None),
        drafter=args.drafter,
        n_ctx=args.n_ctx,
        n_gpu_layers=args.n_gpu_layers,
        n_gpu_layers_draft=getattr(args, "n_gpu_layers_draft", None),
        gpu_memory=gpu_memory,
        cache_ram=cache_ram,
        cache_dir=cache_dir,
        cache_dir_size=cache_dir_size,
        cpu_moe=getattr(args, "cpu_moe", None),
        threads=threads,
        rpc=tuple(rpc),
        device_sampling=getattr(args, "device_sampling", None),
        bridge=getattr(args, "bridge", None),
        chat_template=chat_template,
        system=system,
        max_tokens=getattr(args, "max_tokens", DEFAULT_MAX_TOKENS),  # bench has no --max-tokens
        stop=stop,
        overrides=MappingProxyType(overrides),
        think=think,
    )


def _cache_dir(value: str | None) -> tuple[str | None, int | None]:
    """--cache-dir DIR[:SIZE] as (DIR, SIZE in bytes or None), DIR created and writable. What follows the last colon
    is the size when it looks like one (a digit, sign or dot first, or a unit alone: "~/cache:8G", "x:-1", "x:G") or
    is nothing ("x:"), and must then be one; any other colon belongs to DIR ("a:b/c", "C:\\cache", "x:old", "C:")."""
    if value is None:
        return None, None
    text, size = clean(value)[0].strip(), None
    if not text:
        raise InvalidParamsError('--cache-dir "" is empty: give a directory, or leave the flag out for RAM only')
    m = re.fullmatch(r"(.+):([-+.\d][^:/\\]*|[kmgtb]i?b?|)", text, re.IGNORECASE)
    if m and not (m.group(2) == "" and re.fullmatch(r"[a-z]", m.group(1), re.IGNORECASE)):  # "C:": a drive
        try:
            text, size = m.group(1), parse_size(m.group(2), "--cache-dir's size")
        except InvalidParamsError:
            raise InvalidParamsError(
                f"--cache-dir '{value}': {m.group(2)!r} after the last colon is not a size: write DIR:SIZE with SIZE "
                "like 8G, 512M, 7.5GiB or 1T (K, M, G or T, ASCII digits, at most 1 PiB), or end DIR with / when "
                "the colon belongs to its name"
            ) from None
    from localspec.core.promptdisk import open_cache_dir

    return str(open_cache_dir(text)), size


def _text(value: str | None) -> str | None:
    return None if value is None else clean(value)[0]


def _check_files(args: argparse.Namespace) -> None:
    from localspec.llama.model import check_gguf_file

    if args.target and args.pair:
        raise InvalidParamsError("give either --pair or --target/--draft, not both")
    for flag in ("target", "draft", "mmproj"):
        value = getattr(args, flag, None)
        if value is not None:
            try:
                check_gguf_file(Path(value))
            except ValueError:
                raise LocalspecError(f"--{flag} is not a usable path (it holds a NUL character)") from None
            except OSError as e:
                raise LocalspecError(f"cannot read --{flag} {value}: {e.strerror or e}") from None


def read_images(paths: list[str]) -> list[tuple[str, Image]]:
    """--image's files as (the path given, the picture), read and checked (format, size, a file cut short) before
    anything loads.

    Raises:
        InvalidParamsError: a file that cannot be read.
        LocalspecError: not a picture localspec reads (one line from `read_image`).
    """
    from localspec.llama.pictures import read_image, read_image_file

    images = []
    for path in paths:
        try:
            data = read_image_file(Path(path).expanduser(), MAX_IMAGE_FILE)
        except LocalspecError as e:
            raise InvalidParamsError(f"--image {path}: {e}") from None
        images.append((path, read_image(data, name=Path(path).name)))
    return images
