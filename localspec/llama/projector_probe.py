"""A projector opened first in a child process (as the canary probes kernels): a projector missing a tensor loads,
then crashes the process at its first encode (DESIGN §11), so an untrusted file is tried where a crash costs one line.
Also the one-line refusals of a file that is no projector, cut short, or made for another model.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from localspec.errors import ModelFileError

from .footprint import read_header
from .model import check_gguf_file
from .mtmd import mtmd_error, native

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 120.0  # seconds for the child that opens a projector first
PROBE_OK = "ok"  # the child's stdout on success: "ok <vision 0|1> <audio 0|1>"
_MISMATCH = re.compile(r"text model \(n_embd = (\d+)\) and mmproj \(n_embd = (\d+)\)")
_MISSING = re.compile(r"unable to find tensor (\S+)")


@dataclass(frozen=True, slots=True)
class Probe:
    """What the child saw opening a projector beside a target: `failure` is "" when it opened."""

    failure: str = ""
    vision: bool = False
    audio: bool = False


def check_projector_file(path: Path) -> None:
    """Refuse, in one line, a file that is no GGUF, no projector, or cut short, before a child or mtmd reads it."""
    check_gguf_file(path)
    header = read_header(path)
    if header.arch != "clip":
        raise ModelFileError(
            f"{path} is not a projector (its architecture is {header.arch}): give the mmproj-*.gguf file "
            "published beside the model"
        )
    if header.data_end > header.file_size:
        raise ModelFileError(f"{path} is truncated (its tensors end past the file's end): re-download it")


def refusal(path: Path, target: Path, detail: str) -> str:
    """The one-line message for a projector mtmd refused to open beside `target`, from mtmd's own error."""
    if found := _MISMATCH.search(detail):
        model_embd, projector_embd = found.groups()
        return (
            f"{path} does not match target {target.name} (its output size {projector_embd} ≠ the model's n_embd "
            f"{model_embd}): use the mmproj file published with {target.name}"
        )
    if found := _MISSING.search(detail):
        return f"{path} lacks the tensor {found.group(1)}: the file is incomplete or damaged — re-download it"
    why = f" (mtmd: {detail})" if detail else ""
    return f"could not open the projector {path} beside {target.name}{why}: use the mmproj file published with it"


def probe_projector(path: Path, target: Path, *, timeout: float = PROBE_TIMEOUT) -> Probe:
    """Open projector `path` beside the model file `target` in a child process, with mtmd's warm-up (which builds
    the encoder's graph: where a projector missing a tensor crashes). Remembered per file, size, mtime and target for
    the life of this process, so a second open is instant."""
    stat = Path(path).stat()
    return _probe(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns, str(Path(target).resolve()), timeout)


@functools.lru_cache(maxsize=64)
def _probe(path: str, _size: int, _mtime_ns: int, target: str, timeout: float) -> Probe:
    try:
        child = subprocess.run(
            [sys.executable, "-m", "localspec.llama.projector_probe", "--probe", path, target],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return Probe(
            f"opening the projector {path} beside {Path(target).name} took over {timeout:.0f} s: re-download it"
        )
    words = child.stdout.split()
    if child.returncode == 0 and words[:1] == [PROBE_OK]:
        return Probe("", vision=words[1:2] == ["1"], audio=words[2:3] == ["1"])
    if child.returncode < 0:
        try:
            how = signal.Signals(-child.returncode).name
        except ValueError:
            how = f"signal {-child.returncode}"
        log.info("the projector probe of %s died (%s): %s", path, how, child.stderr[-2000:])
        return Probe(
            f"the projector {path} crashed llama.cpp ({how}) when opened beside {Path(target).name}: it is damaged "
            "or lacks a tensor — re-download it, or use the mmproj file published with the model"
        )
    lines = child.stderr.strip().splitlines()
    return Probe(lines[-1] if lines else f"the projector probe of {path} ended with code {child.returncode}")


def _probe_child(path: str, target: str) -> int:
    """The child's side: load the target's weights (memory-mapped, on the CPU, not repacked), open the projector
    with warm-up; print "ok <vision> <audio>" and exit 0, or the reason on stderr and exit 3."""
    import faulthandler

    faulthandler.enable(all_threads=True)
    mtmd, _ = native()
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    params.use_extra_bufts = False  # repacking reads every weight; the projector needs the model's sizes only
    model = llama_cpp.llama_model_load_from_file(os.fsencode(target), params)
    if not model:
        print(f"could not load {target} to try its projector beside it", file=sys.stderr)
        return 3
    ctx_params = mtmd.mtmd_context_params_default()
    ctx_params.use_gpu = False
    ctx_params.print_timings = False
    ctx_params.n_threads = 1
    ctx_params.warmup = True
    mtmd_error()
    handle = mtmd.mtmd_init_from_file(os.fsencode(path), model, ctx_params)
    if not handle:
        print(refusal(Path(path), Path(target), mtmd_error()), file=sys.stderr)
        return 3
    print(PROBE_OK, int(mtmd.mtmd_support_vision(handle)), int(mtmd.mtmd_support_audio(handle)), flush=True)
    mtmd.mtmd_free(handle)
    llama_cpp.llama_model_free(model)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m localspec.llama.projector_probe --probe MMPROJ TARGET`: the probe's child (see `probe_projector`)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] != "--probe":
        print("usage: python -m localspec.llama.projector_probe --probe MMPROJ TARGET", file=sys.stderr)
        return 2
    return _probe_child(argv[1], argv[2])


if __name__ == "__main__":
    sys.exit(main())
