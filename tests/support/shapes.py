"""Real model shapes as GGUF files with a header and no weights: sparse files the size of the real thing.

A 14B Q4_K_M file is 9 GB; its tensor table is a few KB. `write_shape` writes the metadata and the tensor table
of a shape (Qwen2.5 14B, 0.5B, a Qwen3-MoE-like target, ...) quantized by llama-quantize's recipe, then extends
the file to its full size without writing the data: the file system keeps it sparse, so it costs nothing on
disk, `read_footprint` reads it like the real file, and llama.cpp loads it with `no_alloc` (weights never read).
The shapes are the models' published hyperparameters (their config.json); the quant recipe is llama-quantize's
Q4_K_M (Q6_K on attn_v / ffn_down of the "more bits" layers and on the output) or Q8_0 everywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

F32 = Q.F32


@dataclass(frozen=True)
class Shape:
    """A transformer's hyperparameters as GGUF stores them (arch "qwen2", "llama" or "qwen3moe")."""

    arch: str
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_vocab: int
    tied: bool = False
    n_ctx_train: int = 32768
    n_expert: int = 0  # MoE: experts per layer (0: dense)
    n_expert_used: int = 0
    n_ff_exp: int = 0


QWEN25_14B = Shape("qwen2", 5120, 48, 13824, 40, 8, 152064)
QWEN25_32B = Shape("qwen2", 5120, 64, 27648, 40, 8, 152064)
QWEN25_7B = Shape("qwen2", 3584, 28, 18944, 28, 4, 152064)
QWEN25_0_5B = Shape("qwen2", 896, 24, 4864, 14, 2, 151936, tied=True)
LLAMA31_8B = Shape("llama", 4096, 32, 14336, 32, 8, 128256, n_ctx_train=131072)  # make_model.py's llama31-8b
LLAMA32_1B = Shape("llama", 2048, 16, 8192, 32, 8, 128256, tied=True, n_ctx_train=131072)  # ... llama32-1b
QWEN3_30B_A3B = Shape("qwen3moe", 2048, 48, 6144, 32, 4, 151936, n_expert=128, n_expert_used=8, n_ff_exp=768)


def _more_bits(i: int, n: int) -> bool:
    """llama-quantize's `use_more_bits`: the layers whose attn_v / ffn_down get Q6_K in Q4_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_table(shape: Shape, quant: str) -> list[tuple[str, tuple[int, ...], Q]]:
    """(name, GGUF dims (innermost first), type) of every tensor, as llama-quantize writes `quant` (Q4_K_M, Q8_0)."""
    s, e = shape, shape.n_embd
    head_dim = e // s.n_head
    kv = s.n_head_kv * head_dim

    def q(more: bool = False) -> Q:
        return Q.Q8_0 if quant == "Q8_0" else (Q.Q6_K if more else Q.Q4_K)

    table: list[tuple[str, tuple[int, ...], Q]] = [("token_embd.weight", (e, s.n_vocab), q())]
    for i in range(s.n_layer):
        p, more = f"blk.{i}.", _more_bits(i, s.n_layer)
        table += [
            (p + "attn_norm.weight", (e,), F32),
            (p + "attn_q.weight", (e, s.n_head * head_dim), q()),
            (p + "attn_k.weight", (e, kv), q()),
            (p + "attn_v.weight", (e, kv), q(more)),
            (p + "attn_output.weight", (s.n_head * head_dim, e), q()),
            (p + "ffn_norm.weight", (e,), F32),
        ]
        if s.arch == "qwen2":
            table += [(p + "attn_q.bias", (e,), F32), (p + "attn_k.bias", (kv,), F32), (p + "attn_v.bias", (kv,), F32)]
        if s.arch == "qwen3moe":
            table += [(p + "attn_q_norm.weight", (head_dim,), F32), (p + "attn_k_norm.weight", (head_dim,), F32)]
            table += [
                (p + "ffn_gate_inp.weight", (e, s.n_expert), F32),
                (p + "ffn_gate_exps.weight", (e, s.n_ff_exp, s.n_expert), q()),
                (p + "ffn_up_exps.weight", (e, s.n_ff_exp, s.n_expert), q()),
                (p + "ffn_down_exps.weight", (s.n_ff_exp, e, s.n_expert), q(more)),
            ]
        else:
            table += [
                (p + "ffn_gate.weight", (e, s.n_ff), q()),
                (p + "ffn_up.weight", (e, s.n_ff), q()),
                (p + "ffn_down.weight", (s.n_ff, e), q(more)),
            ]
    table.append(("output_norm.weight", (e,), F32))
    if not s.tied:
        table.append(("output.weight", (e, s.n_vocab), Q.Q8_0 if quant == "Q8_0" else Q.Q6_K))
    return table


def tensor_bytes(dims: tuple[int, ...], kind: Q) -> int:
    block, size = gguf.GGML_QUANT_SIZES[kind]
    return int(np.prod(dims)) // block * size


def write_shape(path: Path, shape: Shape, quant: str = "Q4_K_M") -> Path:
    """A sparse GGUF of `shape`: full metadata and tensor table, the data region a hole. Returns `path`."""
    s = shape
    w = gguf.GGUFWriter(str(path), arch=s.arch)
    w.add_name(f"shape-{s.arch}-{s.n_layer}L-{quant}")
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    if s.n_expert:
        w.add_expert_count(s.n_expert)
        w.add_expert_used_count(s.n_expert_used)
        w.add_expert_feed_forward_length(s.n_ff_exp)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quant == "Q8_0" else gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    tokens = [f"t{i}" for i in range(s.n_vocab)]
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * s.n_vocab)
    w.add_token_merges(["t 1"])
    w.add_eos_token_id(s.n_vocab - 1)
    total = 0
    for name, dims, kind in tensor_table(s, quant):
        nbytes = tensor_bytes(dims, kind)
        # numpy shape (outermost first) and a byte dtype, as the writer wants for quantized raw data
        w.add_tensor_info(name, tuple(reversed(dims)), np.dtype(np.float32), nbytes, raw_dtype=kind)
        total += gguf.GGUFWriter.ggml_pad(nbytes, w.data_alignment)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    start = gguf.GGUFWriter.ggml_pad(w.fout[0].tell(), w.data_alignment)
    w.close()
    os.truncate(path, start + total)
    return path
