"""What a GGUF file needs in memory, read from its header alone: `Footprint`, and llama.cpp's own count of it.

`read_footprint` parses the header (metadata and tensor table; never the weights, so a 9 GB file reads in
milliseconds) and groups the tensor sizes as llama.cpp places them: the input layer (token embeddings, always on
the CPU), each repeating layer `blk.N.*` (with its MoE experts, `*_exps*`, apart), and the output layer (a second
copy of the embeddings when they are tied). `simulate` asks llama.cpp itself through `no_alloc`, for checking.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import struct
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import llama_cpp
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from localspec.errors import ModelFileError

from .log import init, llama_error, llama_log

KV_BYTES = 2  # llama.cpp's default cache type, F16, per K or V element
STATE_BYTES = 4  # a recurrent layer's conv and SSM states: F32
# Hybrids whose attention layers are every `full_attention_interval`-th of the trunk (llama.cpp's default: 4)
_INTERVAL_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"})
# Architectures whose recurrent state llama.cpp keeps rollback snapshots of (`n_rs_seq`; clamped to 0 elsewhere)
RS_ROLLBACK_ARCHS = frozenset(
    {"qwen35", "qwen35moe", "qwen4exp", "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3", "kimi-k3"}
)
_LAYER_RE = re.compile(r"^blk\.(\d+)\.")
# A MoE layer's experts: llama.cpp's own pattern for --cpu-moe (common.h, LLM_FFN_EXPS_REGEX), searched in names
EXPERTS_PATTERN = r"\.ffn_(up|down|gate)_(ch|)exps"
_EXPERTS_RE = re.compile(EXPERTS_PATTERN)
# GGUF value types: fixed sizes by type id; 8 = string, 9 = array
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class Footprint:
    """The bytes one model needs, where llama.cpp may put them (weights from the tensor table, exact)."""

    name: str  # the file's name
    arch: str
    n_layer: int
    n_ctx_train: int
    n_embd: int
    n_vocab: int
    input_bytes: int  # token embeddings and the like: llama.cpp keeps the input layer on the CPU
    output_bytes: int  # output norm and projection (the embeddings again when tied): on the GPU with any layer
    layer_bytes: tuple[int, ...]  # each repeating layer's weights, its experts included
    expert_bytes: tuple[int, ...]  # of which MoE experts (`*_exps*`): what --cpu-moe keeps on the CPU
    kv_bytes_per_cell: tuple[int, ...]  # each layer's K and V for one token (F16); 0 for recurrent layers
    recurrent: bool
    tied_bytes: int  # no output.weight: the token embeddings, loaded again for the output layer (else 0)
    nextn_layers: int = (
        0  # MTP ("nextn") blocks past the trunk: the model's own draft head (`{arch}.nextn_predict_layers`)
    )
    # each layer's recurrent state for one sequence (conv + SSM, F32), whatever the context length; 0 for attention
    # layers. A context that keeps n rollback snapshots holds it 1 + n times (`with_snapshots`).
    state_bytes_per_layer: tuple[int, ...] = ()

    @property
    def tensor_bytes(self) -> int:
        """Every tensor once, as the file holds them (llama.cpp's `llama_model_size`)."""
        return self.weight_bytes - self.tied_bytes

    @property
    def weight_bytes(self) -> int:
        """All weights as llama.cpp allocates them (a tied output counted twice, as it loads it twice)."""
        return self.input_bytes + self.output_bytes + sum(self.layer_bytes)

    @property
    def is_moe(self) -> bool:
        return any(self.expert_bytes)

    def kv_bytes(self, n_ctx: int) -> int:
        """The KV cache of `n_ctx` cells, every layer."""
        return n_ctx * sum(self.kv_bytes_per_cell)

    def cache_bytes(self, layer: int, n_ctx: int) -> int:
        """What layer `layer` keeps besides its weights at `n_ctx` cells: its KV cache, or its recurrent state."""
        state = self.state_bytes_per_layer[layer] if self.state_bytes_per_layer else 0
        return self.kv_bytes_per_cell[layer] * n_ctx + state

    def with_snapshots(self, n: int) -> Footprint:
        """The footprint of a context that keeps `n` rollback snapshots of the recurrent state (llama.cpp's
        `n_rs_seq`; only the architectures in `RS_ROLLBACK_ARCHS` keep any)."""
        if not n or self.arch not in RS_ROLLBACK_ARCHS:
            return self
        return replace(self, state_bytes_per_layer=tuple(b * (1 + n) for b in self.state_bytes_per_layer))


@dataclass(frozen=True, slots=True)
class Header:
    """A GGUF file's header as read: its metadata, its tensors' sizes, and where their data ends."""

    name: str  # the file's name
    meta: dict[str, object]  # scalars, and arrays as their length or, when numeric and short, their values
    tensors: tuple[tuple[str, int], ...]  # (name, bytes)
    data_end: int  # the byte the tensors' data ends at: a shorter file is truncated
    file_size: int

    @property
    def arch(self) -> str:
        return str(self.meta.get("general.architecture", "unknown"))

    def hparam(self, key: str, default: object = None) -> object:
        """`{arch}.{key}` as the header holds it (or `default`)."""
        return self.meta.get(f"{self.arch}.{key}", default)


def read_header(path: str | os.PathLike) -> Header:
    """The header of a GGUF file; every count in it is checked against the file's size before it is used.

    Raises:
        ModelFileError: not a readable GGUF header (truncated, corrupt, an unknown tensor type), in one line.
    """
    path = Path(path)
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            meta, tensors, data_end = _parse(data)
            size = len(data)
    except OSError as e:
        raise ModelFileError(f"could not read {path}: {e.strerror or e}") from None
    except (ValueError, struct.error, KeyError, OverflowError, MemoryError, UnicodeError) as e:
        raise ModelFileError(
            f"could not load {path}: the file is truncated or corrupt (its GGUF header: {e}) — re-download it"
        ) from None
    return Header(path.name, meta, tuple(tensors), data_end, size)


def read_footprint(path: str | os.PathLike) -> Footprint:
    """The footprint of a GGUF file, from its header.

    Raises:
        ModelFileError: not a readable GGUF file (truncated, corrupt, unknown tensor type, a header llama.cpp would
            abort on: `header_problem`).
    """
    header = read_header(path)
    if problem := header_problem(header):
        raise ModelFileError(f"could not load {path}: the file {problem}")
    try:
        return _footprint(header.name, header.meta, list(header.tensors))
    except (ValueError, TypeError, ZeroDivisionError) as e:  # a size of the wrong type: llama.cpp refuses it too
        raise ModelFileError(
            f"could not load {path}: the file is truncated or corrupt (its GGUF header: {e}) — re-download it"
        ) from None


LLAMA_MAX_LAYERS = 512  # llama-hparams.h
LLAMA_MAX_EXPERTS = 1024
_ROPE_SCALING = ("none", "linear", "yarn", "longrope")  # llama-model.cpp: LLAMA_ROPE_SCALING_TYPES


def header_problem(header: Header) -> str:
    """What in a readable header makes the file unusable, as a phrase after "the file" ("" when nothing does): a file
    cut short, or a value llama.cpp's loader asserts on (llama-model.cpp `load_hparams`: GGML_ASSERT ends the
    process, where a refused file would be one line), checked before llama.cpp reads it."""
    if header.data_end > header.file_size:
        return (
            f"is truncated or corrupt (its tensors end at byte {header.data_end:,}, the file has "
            f"{header.file_size:,}) — re-download it"
        )
    try:
        problem = _hparams_problem(header)
    except ValueError as e:  # a value of the wrong type where a count belongs
        return f"has a damaged header ({e}) — re-download it"
    return f"has a damaged header ({problem}: llama.cpp would abort on it) — re-download it" if problem else ""


def _hparams_problem(header: Header) -> str:
    def count(key: str, default: int | None = 0) -> int | None:
        value = header.hparam(key)
        if value is None:
            return default
        if isinstance(value, tuple):  # per layer: the largest counts
            value = max(value, default=0)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{header.arch}.{key} is {value!r}, not a count")
        return value

    n_layer = count("block_count", None)
    if n_layer is None:
        return f"no {header.arch}.block_count"
    if count("context_length", None) == 0:  # refused, not aborted on: raised as a problem without the abort
        raise ValueError(f"{header.arch}.context_length 0: a model trained on no context")
    if not 0 < n_layer <= LLAMA_MAX_LAYERS:
        return f"block_count {n_layer}, not 1–{LLAMA_MAX_LAYERS}"
    nextn = count("nextn_predict_layers")
    if nextn > n_layer:
        return f"{nextn} MTP layers (nextn_predict_layers) in {n_layer} blocks"
    n_expert, used = count("expert_count"), count("expert_used_count")
    groups, groups_used = count("expert_group_count"), count("expert_group_used_count")
    if n_expert > LLAMA_MAX_EXPERTS or used > n_expert:
        return f"{used} of {n_expert} experts used per token"
    if n_expert and (not used or groups >= n_expert):
        return f"{used} of {n_expert} experts used per token in {groups} groups"
    if n_expert and groups > 1 and (n_expert % groups or not 0 < groups_used < groups):
        return f"{n_expert} experts in {groups} groups, {groups_used} used"
    if not n_expert and groups:
        return f"{groups} expert groups and no experts"
    scaling = header.hparam("rope.scaling.type")
    if scaling is not None and scaling not in _ROPE_SCALING:
        return f"rope.scaling.type {scaling!r}, not one of {', '.join(_ROPE_SCALING)}"
    if count("full_attention_interval", None) == 0:
        return "full_attention_interval 0"  # llama.cpp divides by it
    return _rope_problem(header, count)


def _rope_problem(header: Header, count) -> str:
    """ggml's rope asserts its rotary dimensions are even and within a head (ops.cpp), at the first decode."""
    n_rot, n_head = count("rope.dimension_count", None), count("attention.head_count")
    if n_rot is None or not n_head:
        return ""
    head_dim = count("attention.key_length", None) or count("embedding_length") // n_head
    if n_rot % 2 or not 0 < n_rot <= head_dim:
        return f"rope.dimension_count {n_rot} for heads of {head_dim}"
    return ""


_MIN_KV = 8 + 4 + 1  # bytes of the smallest metadata entry: a key's length, its type, one byte of value
_MIN_TENSOR = 8 + 4 + 8 + 4 + 8  # a tensor's name length, n_dims, one dimension, its type and its offset
_MAX_DIMS = 4  # GGML_MAX_DIMS


def _parse(data: mmap.mmap) -> tuple[dict[str, object], list[tuple[str, int]], int]:
    """(metadata, [(tensor name, bytes)], the byte the tensor data ends at); every count bounded by the file."""
    if data[:4] != b"GGUF":
        raise ValueError("no GGUF magic")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    if n_kv > len(data) // _MIN_KV or n_tensors > len(data) // _MIN_TENSOR:
        raise ValueError(f"{n_kv:,} metadata entries and {n_tensors:,} tensors in {len(data):,} bytes")
    pos = 24
    meta: dict[str, object] = {}
    for _ in range(n_kv):
        key, pos = _string(data, pos)
        (kind,), pos = struct.unpack_from("<I", data, pos), pos + 4
        meta[key], pos = _value(data, pos, kind)
    tensors, data_end = [], 0
    for _ in range(n_tensors):
        name, pos = _string(data, pos)
        (n_dims,) = struct.unpack_from("<I", data, pos)
        if n_dims > _MAX_DIMS:
            raise ValueError(f"tensor {name!r} has {n_dims} dimensions")
        dims = struct.unpack_from(f"<{n_dims}Q", data, pos + 4)
        ggml_type, offset = struct.unpack_from("<IQ", data, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 4 + 8
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        n = 1
        for d in dims:
            n *= d
        tensors.append((name, n // block * size))
        data_end = max(data_end, offset + n // block * size)
    alignment = meta.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0:
        raise ValueError(f"general.alignment {alignment!r}")
    return meta, tensors, -(-pos // alignment) * alignment + data_end


def _string(data: mmap.mmap, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", data, pos)
    if n > len(data) - pos - 8:
        raise ValueError(f"a string of {n:,} bytes at byte {pos:,}, past the end of the file")
    return data[pos + 8 : pos + 8 + n].decode("utf-8", errors="replace"), pos + 8 + n


def _value(data: mmap.mmap, pos: int, kind: int, depth: int = 0) -> tuple[object, int]:
    if kind in _SCALAR:
        fmt = "<" + _SCALAR[kind]
        return struct.unpack_from(fmt, data, pos)[0], pos + struct.calcsize(fmt)
    if kind == _STRING:
        return _string(data, pos)
    if kind != _ARRAY or depth > 2:
        raise ValueError(f"unknown metadata type {kind}")
    item, count = struct.unpack_from("<IQ", data, pos)
    pos += 12
    left = len(data) - pos
    if item in _SCALAR:  # numeric arrays are kept (per-layer head counts); long ones only counted
        width = struct.calcsize("<" + _SCALAR[item])
        if count > left // width:
            raise ValueError(f"an array of {count:,} values at byte {pos:,}, past the end of the file")
        values = struct.unpack_from(f"<{count}{_SCALAR[item]}", data, pos) if count <= 4096 else count
        return values, pos + count * width
    if count > left // 8:  # each string or nested array takes 8 bytes or more
        raise ValueError(f"an array of {count:,} entries at byte {pos:,}, past the end of the file")
    if item == _STRING:  # the vocabulary: each string's length read and skipped, none decoded
        length = _U64.unpack_from
        for _ in range(count):
            pos += 8 + length(data, pos)[0]
            if pos > len(data):
                raise ValueError("a vocabulary string past the end of the file")
        return count, pos
    for _ in range(count):  # nested arrays: walked, not kept
        _, pos = _value(data, pos, item, depth + 1)
    return count, pos


def _per_layer(value: object, n_layer: int, default: int) -> tuple[int, ...]:
    """A hyperparameter that GGUF may store once or per layer."""
    if isinstance(value, tuple):
        return tuple(int(v) for v in value[:n_layer])
    return (int(value) if isinstance(value, int) else default,) * n_layer


def _footprint(name: str, meta: dict[str, object], tensors: list[tuple[str, int]]) -> Footprint:
    arch = str(meta.get("general.architecture", "unknown"))

    def hp(key: str, default: int = 0) -> object:
        return meta.get(f"{arch}.{key}", default)

    n_layer = int(hp("block_count"))  # type: ignore[arg-type]
    n_embd = int(hp("embedding_length"))  # type: ignore[arg-type]
    n_head = _per_layer(hp("attention.head_count"), n_layer, 0)
    kv_heads = hp("attention.head_count_kv", None)
    n_head_kv = n_head if kv_heads is None else _per_layer(kv_heads, n_layer, 0)
    layer_bytes, expert_bytes = [0] * n_layer, [0] * n_layer
    input_bytes = output_bytes = tied_bytes = 0
    names = {t for t, _ in tensors}
    for tensor, size in tensors:
        if m := _LAYER_RE.match(tensor):
            i = int(m.group(1))
            if i >= n_layer:  # MTP / next-n layers past the trunk: llama.cpp places them with the output
                output_bytes += size
                continue
            layer_bytes[i] += size
            if _EXPERTS_RE.search(tensor):
                expert_bytes[i] += size
        elif tensor.startswith("output"):
            output_bytes += size
        else:
            input_bytes += size
            if tensor == "token_embd.weight" and "output.weight" not in names:
                output_bytes += size  # tied: llama.cpp loads a second copy for the output layer
                tied_bytes = size
    has_ssm = f"{arch}.ssm.state_size" in meta
    recurrent = has_ssm and not any(n_head)
    nextn = _count(hp("nextn_predict_layers"))
    trunk = n_layer - nextn  # MTP blocks keep their cache in the head's own context, not the trunk's
    recurrent_layers = _recurrent_layers(arch, hp, n_layer, trunk, n_head_kv, has_ssm)
    state = _state_bytes(hp) if has_ssm else 0
    kv = []
    for i in range(n_layer):
        head_dim = n_embd // n_head[i] if n_head[i] else 0
        k_len = int(hp("attention.key_length", head_dim))  # type: ignore[arg-type]
        v_len = int(hp("attention.value_length", head_dim))  # type: ignore[arg-type]
        attention = i < trunk and not recurrent_layers[i]
        kv.append(KV_BYTES * n_head_kv[i] * (k_len + v_len) if attention else 0)
    n_vocab = meta.get("tokenizer.ggml.tokens", hp("vocab_size"))
    return Footprint(
        name=name,
        arch=arch,
        n_layer=n_layer,
        n_ctx_train=int(hp("context_length")),  # type: ignore[arg-type]
        n_embd=n_embd,
        n_vocab=int(n_vocab) if isinstance(n_vocab, int) else 0,
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        layer_bytes=tuple(layer_bytes),
        expert_bytes=tuple(expert_bytes),
        kv_bytes_per_cell=tuple(kv),
        recurrent=recurrent,
        tied_bytes=tied_bytes,
        nextn_layers=nextn,
        state_bytes_per_layer=tuple(state if r else 0 for r in recurrent_layers),
    )


def _recurrent_layers(arch: str, hp, n_layer: int, trunk: int, n_head_kv: tuple[int, ...], has_ssm: bool) -> tuple:
    """Which layers are recurrent, as llama.cpp's loaders decide: an explicit `attention.recurrent_layers` list,
    else every layer but each `full_attention_interval`-th of the trunk (Qwen3-Next/3.5), else (models with SSM
    hyperparameters) the layers without KV heads (Mamba, Jamba, Granite/Nemotron hybrids)."""
    listed = hp("attention.recurrent_layers", None)
    if isinstance(listed, tuple):
        return tuple(bool(v) for v in listed[:n_layer]) + (False,) * (n_layer - len(listed))
    interval = hp("full_attention_interval", None)
    if interval is not None or arch in _INTERVAL_ARCHS:
        every = int(interval) if isinstance(interval, int) and interval > 0 else 4  # type: ignore[arg-type]
        return tuple(i < trunk and (i + 1) % every != 0 for i in range(n_layer))
    return tuple(has_ssm and n_head_kv[i] == 0 for i in range(n_layer))


def _state_bytes(hp) -> int:
    """One recurrent layer's state for one sequence (llama.cpp's n_embd_r + n_embd_s, F32): the convolution's last
    d_conv − 1 inputs (the inner channels and the B/C groups) and the SSM state, d_state × d_inner."""
    d_conv, d_inner, d_state = (int(hp(f"ssm.{key}")) for key in ("conv_kernel", "inner_size", "state_size"))  # type: ignore[arg-type]
    n_group = int(hp("ssm.group_count"))  # type: ignore[arg-type]
    conv = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    return STATE_BYTES * (conv + d_state * d_inner)


def _count(value: object) -> int:
    """A header count as an int (0 when absent or not a number)."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def compute_bytes_estimate(footprint: Footprint, n_ubatch: int) -> int:
    """llama.cpp's compute buffer for one graph of `n_ubatch` tokens: the logits and two hidden-state rows per token.

    It matched llama.cpp's own CPU accounting to the MiB on every shape tried (Qwen2.5 0.5B-14B, Llama 3.2 1B, a
    Qwen3 MoE; `simulate`), independent of n_ctx (attention is fused). A GPU backend's is of the same order; no GPU
    measured it in this change.
    """
    return 4 * n_ubatch * (footprint.n_vocab + 2 * footprint.n_embd)


@dataclass(frozen=True, slots=True)
class Simulated:
    """llama.cpp's own count for a model and one context on the CPU (`no_alloc`: nothing allocated)."""

    model_bytes: int  # llama_model_size
    kv_bytes: int  # "llama_kv_cache: size = … MiB", to 0.01 MiB
    compute_bytes: int  # "CPU compute buffer size = … MiB", to 0.01 MiB
    state_bytes: int = 0  # "llama_memory_recurrent: size = … MiB" (recurrent and hybrid models), to 0.01 MiB


_MIB = re.compile(r"([\d.]+) MiB")


def simulate(
    path: str | os.PathLike, *, n_ctx: int, n_ubatch: int = 512, swa_full: bool = True, n_rs_seq: int = 0
) -> Simulated:
    """Load `path` with `no_alloc` (metadata only, allocations simulated) and create a context: llama.cpp's count.

    `no_alloc` needs the weights read without mmap (`load_mode` NONE: llama.cpp asserts otherwise) and without the
    CPU repack buffers; no weight is read either way. The sizes come from llama.cpp's log lines (the breakdown API
    is C++ only). `swa_full`: sliding-window layers keep every cell, as localspec's contexts do when speculating;
    `n_rs_seq`: recurrent-state rollback snapshots, as a speculating hybrid target keeps them.

    Raises:
        ModelFileError: llama.cpp could not load the file or create the context.
    """
    init()
    params = llama_cpp.llama_model_default_params()
    params.no_alloc, params.load_mode, params.use_extra_bufts, params.n_gpu_layers = True, 0, False, 0
    with _captured() as lines:
        model = llama_cpp.llama_model_load_from_file(os.fsencode(path), params)
        if not model:
            raise ModelFileError(f"llama.cpp could not read {path}{llama_error()}")
        try:
            cparams = llama_cpp.llama_context_default_params()
            cparams.n_ctx, cparams.n_batch, cparams.n_ubatch, cparams.n_seq_max = n_ctx, n_ubatch, n_ubatch, 1
            cparams.swa_full, cparams.n_rs_seq = swa_full, n_rs_seq
            ctx = llama_cpp.llama_init_from_model(model, cparams)
            if not ctx:
                raise ModelFileError(f"llama.cpp could not size a context for {path}{llama_error()}")
            llama_cpp.llama_free(ctx)
            size = int(llama_cpp.llama_model_size(model))
        finally:
            llama_cpp.llama_model_free(model)

    def mib(marker: str) -> int:  # summed: a sliding-window model has two caches
        return round(
            sum(float(m.group(1)) for line in lines if line.startswith(marker) and (m := _MIB.search(line))) * 2**20
        )

    return Simulated(size, mib("llama_kv_cache: size"), mib("sched_reserve:"), mib("llama_memory_recurrent: size"))


@contextmanager
def _captured():
    """llama.cpp's log lines (INFO and up) while the block runs."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler, level = Keep(logging.INFO), llama_log.level
    llama_log.addHandler(handler)
    llama_log.setLevel(min(level or logging.INFO, logging.INFO))
    try:
        yield lines
    finally:
        llama_log.removeHandler(handler)
        llama_log.setLevel(level)
