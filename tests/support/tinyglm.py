"""A tiny `glm4moe` GGUF with one MTP block: an all-attention target whose cache can drop a tail, so its MTP head
drafts for `serve --parallel` slots (the qwen35 head model of tinymodels.py is hybrid: one slot only).

The trunk is dense attention layers ("mostly echo", as `write_mtp_model`'s); the MTP block is llama.cpp's GLM-4.5
one (src/models/glm4-moe.cpp): eh_proj over (token, hidden row), attention, a mixture of experts and a shared
expert whose outputs are zero here, so the head predicts mostly what the trunk says for its token.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from .tinymodels import Vocab, _output_row_scales, _write_gguf, make_vocab

N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_EXPERT = 64, 4, 2, 16, 128, 2


def write_glm_mtp_model(
    path: Path,
    *,
    seed: int = 0,
    n_layer: int = 2,
    trunk_mix: float = 0.3,
    head_mix: float = 0.3,
    output_scale: float = 1.0,
    vocab: Vocab | None = None,
) -> Path:
    """Write the model (F32, ~1 MB) to `path` and return it: `n_layer` trunk layers, then one MTP block."""
    vocab = vocab or make_vocab()
    rng = np.random.default_rng(seed)
    d, hd = N_EMBD, HEAD_DIM
    n_q, n_kv = N_HEAD * hd, N_HEAD_KV * hd

    def normal(*dims: int, std: float) -> np.ndarray:
        return (rng.standard_normal(dims) * std).astype(np.float32)

    def attention(blk: str, out_scale: float) -> dict[str, np.ndarray]:
        return {
            f"{blk}.attn_norm.weight": np.ones(d, np.float32),
            f"{blk}.attn_q.weight": normal(n_q, d, std=2.0 / np.sqrt(d)),
            f"{blk}.attn_k.weight": normal(n_kv, d, std=2.0 / np.sqrt(d)),
            f"{blk}.attn_v.weight": normal(n_kv, d, std=1.0 / np.sqrt(d)),
            f"{blk}.attn_output.weight": normal(d, n_q, std=out_scale / np.sqrt(n_q)),
            f"{blk}.post_attention_norm.weight": np.ones(d, np.float32),
        }

    scales = _output_row_scales(vocab, control_scale=0.0, byte_scale=0.3) * output_scale
    tensors = {
        "token_embd.weight": normal(vocab.n_vocab, d, std=1.0),
        "output_norm.weight": np.ones(d, np.float32),
        "output.weight": normal(vocab.n_vocab, d, std=1.0) * scales[:, None],
    }
    for il in range(n_layer):  # dense layers (`leading_dense_block_count` = n_layer)
        blk = f"blk.{il}"
        tensors |= attention(blk, trunk_mix) | {
            f"{blk}.ffn_gate.weight": normal(N_FF, d, std=1.0 / np.sqrt(d)),
            f"{blk}.ffn_up.weight": normal(N_FF, d, std=1.0 / np.sqrt(d)),
            f"{blk}.ffn_down.weight": normal(d, N_FF, std=trunk_mix / np.sqrt(N_FF)),
        }
    blk = f"blk.{n_layer}"  # the MTP block: its experts' outputs are zero
    hidden_half = rng.standard_normal((d, d)) * head_mix / np.sqrt(d)
    tensors |= attention(blk, head_mix) | {
        f"{blk}.nextn.eh_proj.weight": np.concatenate([np.eye(d), hidden_half], axis=1).astype(np.float32),
        f"{blk}.nextn.enorm.weight": np.ones(d, np.float32),
        f"{blk}.nextn.hnorm.weight": np.ones(d, np.float32),
        f"{blk}.ffn_gate_inp.weight": normal(N_EXPERT, d, std=1.0 / np.sqrt(d)),
        f"{blk}.exp_probs_b.bias": np.zeros(N_EXPERT, np.float32),
        f"{blk}.ffn_gate_exps.weight": normal(N_EXPERT, N_FF, d, std=1.0 / np.sqrt(d)),
        f"{blk}.ffn_up_exps.weight": normal(N_EXPERT, N_FF, d, std=1.0 / np.sqrt(d)),
        f"{blk}.ffn_down_exps.weight": np.zeros((N_EXPERT, d, N_FF), np.float32),
        f"{blk}.ffn_gate_shexp.weight": normal(N_FF, d, std=1.0 / np.sqrt(d)),
        f"{blk}.ffn_up_shexp.weight": normal(N_FF, d, std=1.0 / np.sqrt(d)),
        f"{blk}.ffn_down_shexp.weight": np.zeros((d, N_FF), np.float32),
    }

    def add_hparams(writer: gguf.GGUFWriter) -> None:
        arch = writer.arch
        writer.add_context_length(2048)
        writer.add_embedding_length(d)
        writer.add_block_count(n_layer + 1)
        writer.add_feed_forward_length(N_FF)
        writer.add_expert_feed_forward_length(N_FF)
        writer.add_head_count(N_HEAD)
        writer.add_head_count_kv(N_HEAD_KV)
        writer.add_key_length(hd)
        writer.add_value_length(hd)
        writer.add_rope_dimension_count(hd)
        writer.add_layer_norm_rms_eps(1e-6)
        writer.add_rope_freq_base(10000.0)
        writer.add_expert_count(N_EXPERT)
        writer.add_expert_used_count(1)
        writer.add_expert_shared_count(1)
        writer.add_leading_dense_block_count(n_layer)
        writer.add_uint32(f"{arch}.nextn_predict_layers", 1)
        writer.add_vocab_size(vocab.n_vocab)

    return _write_gguf(path, "glm4moe", add_hparams, vocab, True, tensors)
