"""The canary: can this llama.cpp build decode each quantization type on this CPU, without dying?

A build that does not fit its CPU fails in native code, where no error can be raised: an instruction set the CPU
lacks is SIGILL, and a broken kernel is SIGSEGV (llama.cpp's AMX kernels as GCC 12 builds them, docs/install.md
"Every x86 CPU"), both in the first `llama_decode` of a quantized model. So each type is decoded in a child process:
a tiny model of that type, written on the spot with the `gguf` package and shaped so that llama.cpp picks the kernels
a real model gets (repacked CPU kernels, AMX where built): one batch of several rows, then one row. The set-up and
`localspec doctor` run it; `python -m localspec.llama.canary` is the set-up's check (one line, exit 1 on a crash).
"""

from __future__ import annotations

import dataclasses
import faulthandler
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from localspec.errors import LocalspecError

from . import cpu

CANARY_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")
TIMEOUT = 120.0  # seconds for one child: loading and two decodes of a 2 MB model take well under one
NOT_FINITE = "non-finite logits"
DECODING = "decoding"  # the child's second line: the model and context are made, the first decode is next
_BATCH = 8  # rows of the first decode: more than one, so batched kernels run (the AMX crash needed two)

# Shapes every CPU kernel accepts: 256 is one K-quant super-block; 32 divides every row count (AMX needs it).
_N_EMBD, _N_FF, _N_HEAD, _N_VOCAB, _N_CTX = 256, 512, 4, 320, 64
_BOS, _FIRST_BYTE = 1, 3  # the vocabulary: <unk> <s> </s>, then <0x00> … <0xFF>, then padding


@dataclass(frozen=True, slots=True)
class CanaryResult:
    """How one type fared: `ok`, or `failure` says how the child ended ("SIGSEGV", "non-finite logits", …)."""

    qtype: str
    failure: str = ""
    system_info: str = ""  # llama.cpp's system line as the child saw it ("" when it died before)
    log: str = ""  # the tail of the child's stderr: faulthandler's traceback on a crash
    note: str = ""  # what went wrong once but not on a second run ("" when nothing did)
    loaded: bool = True  # the child made the model and its context: a crash came in a decode, not before

    @property
    def ok(self) -> bool:
        return not self.failure


def _vocab() -> tuple[list[str], list[int]]:
    """A SentencePiece-style vocabulary of _N_VOCAB tokens: three specials, the 256 bytes, padding."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    padding = _N_VOCAB - len(tokens)
    return tokens + [f"[PAD{i}]" for i in range(padding)], types + [gguf.TokenType.UNUSED] * padding


def _quantized(rows: int, cols: int, qtype: gguf.GGMLQuantizationType, rng: np.random.Generator) -> np.ndarray:
    """A (rows, cols) weight in `qtype`'s bytes: quantized by gguf where it can, else valid random blocks."""
    try:
        return gguf.quants.quantize(rng.normal(0.0, 0.05, (rows, cols)).astype(np.float32), qtype)
    except NotImplementedError:  # K-quants: gguf reads them but does not write them
        pass
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows, cols // block_size, type_size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)  # small finite scales, whatever the codes
    if qtype == gguf.GGMLQuantizationType.Q6_K:  # ql, qh, scales, then d
        blocks[..., -2:] = scale
    else:  # Q4_K, Q5_K…: d and dmin first
        blocks[..., 0:2] = scale
        blocks[..., 2:4] = scale
    return blocks.reshape(rows, -1)


def write_canary_model(path: Path, qtype: str, *, seed: int = 0) -> Path:
    """Write a one-layer llama model whose matrices are all `qtype` (a name in CANARY_TYPES) to `path`."""
    kind = gguf.GGMLQuantizationType[qtype]
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"localspec canary {qtype}")
    writer.add_context_length(_N_CTX)
    writer.add_embedding_length(_N_EMBD)
    writer.add_block_count(1)
    writer.add_feed_forward_length(_N_FF)
    writer.add_head_count(_N_HEAD)
    writer.add_head_count_kv(_N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(_N_EMBD // _N_HEAD)
    writer.add_tokenizer_model("llama")
    tokens, types = _vocab()
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    ones = np.ones(_N_EMBD, dtype=np.float32)
    writer.add_tensor("token_embd.weight", rng.normal(0.0, 0.5, (_N_VOCAB, _N_EMBD)).astype(np.float32))
    matrices = {  # name: (rows = outputs, cols = inputs)
        "blk.0.attn_q.weight": (_N_EMBD, _N_EMBD),
        "blk.0.attn_k.weight": (_N_EMBD, _N_EMBD),
        "blk.0.attn_v.weight": (_N_EMBD, _N_EMBD),
        "blk.0.attn_output.weight": (_N_EMBD, _N_EMBD),
        "blk.0.ffn_gate.weight": (_N_FF, _N_EMBD),
        "blk.0.ffn_up.weight": (_N_FF, _N_EMBD),
        "blk.0.ffn_down.weight": (_N_EMBD, _N_FF),
        "output.weight": (_N_VOCAB, _N_EMBD),
    }
    for name, (rows, cols) in matrices.items():
        writer.add_tensor(name, _quantized(rows, cols, kind, rng), raw_dtype=kind)
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        writer.add_tensor(name, ones)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def decode(path: Path, on_loaded: Callable[[], None] = lambda: None) -> None:
    """Decode a batch of _BATCH rows (all of them read back), then one more row, on the CPU; `on_loaded` runs
    between making the model and its context and the first decode.

    Raises:
        ValueError: a row of logits is not finite (a kernel computed garbage).
    """
    from .context import Context
    from .model import Model

    with Model(path, n_gpu_layers=0) as model, Context(model, n_ctx=_N_CTX, n_batch=_N_CTX) as ctx:
        on_loaded()
        prompt = [_BOS, *range(_FIRST_BYTE + ord("a"), _FIRST_BYTE + ord("a") + _BATCH - 1)]  # <s> "abcdefg"
        ctx.decode(prompt, 0, outputs=len(prompt))
        rows = [ctx.logits(i).copy() for i in range(len(prompt))]
        ctx.decode([int(np.argmax(rows[-1]))], len(prompt))
        # A copy: the view is llama.cpp's output buffer, freed with the context. Read after it (as before), row 9
        # was whatever the allocator had put there since: the "non-finite logits" of 1 canary run in 20 (issue 44).
        rows.append(ctx.logits(0).copy())
    for i, row in enumerate(rows):
        if not np.isfinite(row).all():
            raise ValueError(f"{NOT_FINITE} in row {i + 1} of {len(rows)}")


def _child(path: str) -> int:
    """The child's side: print the system line, then DECODING once the model is loaded, decode, exit 0 (3, with the
    reason on stderr, when it could not)."""
    faulthandler.enable(all_threads=True)
    from .devices import system_info

    print(system_info(), flush=True)
    try:
        decode(Path(path), on_loaded=lambda: print(DECODING, flush=True))
    except (ValueError, LocalspecError) as e:  # garbage numbers, or a setting llama.cpp was not even asked with
        print(e, file=sys.stderr)
        return 3
    return 0


def child_command(path: Path) -> list[str]:
    """The command that decodes `path` in a child process (`_child`)."""
    return [sys.executable, "-m", "localspec.llama.canary", "--child", str(path)]


def _how_it_ended(code: int | None, stderr: str, timeout: float) -> str:
    if code is None:
        return f"no answer in {timeout:.0f} s"
    if code == 0:
        return ""
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return stderr.strip().splitlines()[-1] if stderr.strip() else f"exit code {code}"


def run_canary(types: tuple[str, ...] = CANARY_TYPES, *, timeout: float = TIMEOUT) -> list[CanaryResult]:
    """Decode a tiny model of each type in a child process of its own (all at once); one result per type.

    A type whose logits were not finite is decoded once more, alone: a broken kernel gives garbage every time,
    while a one-off passes with a note. (The one-offs seen before, about 1 run in 20, were the canary's own: it read
    its last row after the context was freed, `decode`.)
    """
    with tempfile.TemporaryDirectory(prefix="localspec-canary-") as folder:
        paths = {qtype: write_canary_model(Path(folder) / f"canary-{qtype}.gguf", qtype) for qtype in types}
        results = _decode_in_children(paths, timeout)
        for i, result in enumerate(results):
            if result.failure.startswith(NOT_FINITE):
                again = _decode_in_children({result.qtype: paths[result.qtype]}, timeout)[0]
                if again.ok:
                    results[i] = dataclasses.replace(again, note=f"{result.failure} on the first of two runs")
    return results


def _decode_in_children(paths: dict[str, Path], timeout: float) -> list[CanaryResult]:
    children = {
        qtype: subprocess.Popen(
            child_command(path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
        )
        for qtype, path in paths.items()
    }
    deadline = time.monotonic() + timeout
    results = []
    for qtype, child in children.items():
        try:
            out, err = child.communicate(timeout=max(0.1, deadline - time.monotonic()))
            code: int | None = child.returncode
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            code = None
        lines = out.strip().splitlines()
        failure = _how_it_ended(code, err, timeout)
        loaded = not failure or DECODING in lines[1:]
        results.append(CanaryResult(qtype, failure, lines[0] if lines else "", err[-4000:], loaded=loaded))
    return results


def built_features(results: list[CanaryResult]) -> frozenset[str] | None:
    """The instruction sets the build uses, from the first child that printed llama.cpp's system line; None when
    every child died before it could."""
    info = next((r.system_info for r in results if r.system_info), None)
    return None if info is None else cpu.build_features(info)


def verdict(results: list[CanaryResult], host: cpu.HostCpu | None = None) -> str:
    """One line: which types decode, or what crashed, why (the CPU feature) and what to do.

    Args:
        results: `run_canary`'s results.
        host: this CPU (default: read from /proc/cpuinfo).
    """
    host = cpu.host_cpu() if host is None else host
    failed = [r for r in results if not r.ok]
    built = built_features(results)
    if not failed:
        notes = "; ".join(f"{r.qtype}: {r.note}" for r in results if r.note)
        return f"llama.cpp decodes {' '.join(r.qtype for r in results)} on this CPU" + (f" ({notes})" if notes else "")
    what = ", ".join(f"{r.qtype} ({r.failure})" for r in failed)
    cpu_name = host.model if host else "this CPU"
    rebuild = "rebuild llama-cpp-python here: rm -rf ~/.cache/localspec/wheels && packaging/setup.sh"
    built = built or frozenset()
    if missing := cpu.missing_features(built, host):
        return (
            f"llama.cpp was built for {' '.join(missing)}, which {cpu_name} lacks, and died decoding {what}: "
            f"the wheel was built on another CPU; {rebuild}"
        )
    if not any(r.loaded for r in failed):
        # Seen on an AMX host with every build, AMX or not (docs/install.md "Every x86 CPU"): the crash came in
        # llama.cpp's model set-up, and preloading the system's libstdc++ cured it — not a decode kernel.
        return (
            f"llama.cpp died loading {what} on {cpu_name}, before any decode: not a decode kernel; a second copy "
            "of libstdc++ in the process did this once (LD_PRELOAD of the system's libstdc++.so.6 cured it); "
            "report it with the output of `localspec doctor`"
        )
    if "AMX_INT8" in built:
        return (
            f"llama.cpp's AMX kernels (AMX_INT8 on {cpu_name}) died decoding {what}: rebuild without them "
            "(packaging/setup.sh leaves AMX out unless LOCALSPEC_BACKENDS names amx)"
        )
    return (
        f"llama.cpp died decoding {what} on {cpu_name} (built with {' '.join(sorted(built)) or 'no listed sets'}): "
        f"{rebuild}; if it still dies, report it with the output of `localspec doctor`"
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m localspec.llama.canary`: the set-up's check, one line; exit 1 when a type does not decode."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(argv[1])
    results = run_canary()
    line = verdict(results)
    if all(r.ok for r in results):
        print(line)
        return 0
    print(f"error: {line}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
