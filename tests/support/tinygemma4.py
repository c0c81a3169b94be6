"""A tiny Gemma 4 pair for tests of the assistant drafter: a `gemma4` target and its `gemma4-assistant` sidecar.

Both are random-weight F32 GGUFs with the shared test vocabulary, loadable by llama.cpp b11312 (src/models/gemma4.cpp
and gemma4-assistant.cpp name the keys and tensors written here). The target alternates sliding-window and full layers
(its last two: SWA then full, the layers the assistant reads) with a window shorter than the tests' prompts. Its layers
add only a part (`trunk_mix`) to the residual stream, so its next token depends mostly on the current one; the
assistant, a quarter wider than the target, keeps the token's embedding whole and a part of the target's hidden row,
and writes its logits through the target's output rows: its drafts agree with the target often, not always.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from .tinymodels import _output_row_scales, _write_gguf, make_vocab

ASSISTANT_ARCH = "gemma4-assistant"


@dataclass(frozen=True)
class Gemma4Shape:
    """Sizes of the tiny target (the assistant takes its head sizes, and a quarter more width)."""

    n_embd: int = 64
    n_layer: int = 4  # SWA, full, SWA, full: the assistant reads layers 2 (SWA) and 3 (full)
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16  # full layers
    head_dim_swa: int = 16
    n_ff: int = 128
    sliding_window: int = 16  # shorter than the tests' prompts: the window slides while they decode
    n_embd_per_layer: int = 0  # Gemma 4 E2B/E4B's per-layer embeddings (0: none)
    context_length: int = 2048

    def is_swa(self, il: int) -> bool:
        return il % 2 == 0


@dataclass(frozen=True)
class TinyGemma4:
    """The files `write_gemma4_pair` writes into one directory."""

    target: Path  # gemma4.gguf
    assistant: Path  # mtp-gemma4.gguf: general.architecture = gemma4-assistant


def _rng_normal(rng: np.random.Generator) -> Callable[..., np.ndarray]:
    def normal(*dims: int, std: float) -> np.ndarray:
        return (rng.standard_normal(dims) * std).astype(np.float32)

    return normal


def _ones(n: int, value: float = 1.0) -> np.ndarray:
    return np.full(n, value, dtype=np.float32)


def gemma4_target_tensors(seed: int, shape: Gemma4Shape, n_vocab: int, output_rows: np.ndarray, trunk_mix: float):
    """The target's tensors (numpy order: GGUFWriter reverses it into ggml's)."""
    normal = _rng_normal(np.random.default_rng(seed))
    d = shape.n_embd
    tensors = {
        "token_embd.weight": normal(n_vocab, d, std=1.0 / np.sqrt(d)),  # scaled by sqrt(d) in the graph: rms 1
        "output_norm.weight": _ones(d),
        "output.weight": output_rows,  # (n_vocab, d): untied, so greedy text does not repeat the current token
        "rope_freqs.weight": _ones(shape.head_dim // 2),  # the full layers' proportional-rope factors
    }
    if shape.n_embd_per_layer:
        p = shape.n_embd_per_layer
        tensors |= {
            "per_layer_token_embd.weight": normal(n_vocab, p * shape.n_layer, std=1.0),
            "per_layer_model_proj.weight": normal(p * shape.n_layer, d, std=1.0 / np.sqrt(d)),
            "per_layer_proj_norm.weight": _ones(p),
        }
    for il in range(shape.n_layer):
        blk, hd = f"blk.{il}", shape.head_dim_swa if shape.is_swa(il) else shape.head_dim
        n_q, n_kv = shape.n_head * hd, shape.n_head_kv * hd
        tensors |= {
            f"{blk}.attn_norm.weight": _ones(d),
            f"{blk}.attn_q.weight": normal(n_q, d, std=1.0 / np.sqrt(d)),
            f"{blk}.attn_k.weight": normal(n_kv, d, std=1.0 / np.sqrt(d)),
            f"{blk}.attn_v.weight": normal(n_kv, d, std=1.0 / np.sqrt(d)),
            f"{blk}.attn_q_norm.weight": _ones(hd),
            f"{blk}.attn_k_norm.weight": _ones(hd),
            f"{blk}.attn_output.weight": normal(d, n_q, std=1.0 / np.sqrt(n_q)),
            f"{blk}.post_attention_norm.weight": _ones(d, trunk_mix),  # the layer's part of the residual stream
            f"{blk}.ffn_norm.weight": _ones(d),
            f"{blk}.ffn_gate.weight": normal(shape.n_ff, d, std=1.0 / np.sqrt(d)),
            f"{blk}.ffn_up.weight": normal(shape.n_ff, d, std=1.0 / np.sqrt(d)),
            f"{blk}.ffn_down.weight": normal(d, shape.n_ff, std=1.0 / np.sqrt(shape.n_ff)),
            f"{blk}.post_ffw_norm.weight": _ones(d, trunk_mix),
            f"{blk}.layer_output_scale.weight": _ones(1),
        }
        if shape.n_embd_per_layer:
            p = shape.n_embd_per_layer
            tensors |= {
                f"{blk}.inp_gate.weight": normal(p, d, std=1.0 / np.sqrt(d)),
                f"{blk}.proj.weight": normal(d, p, std=1.0 / np.sqrt(p)),
                f"{blk}.post_norm.weight": _ones(d, trunk_mix),
            }
    return tensors


def assistant_width(shape: Gemma4Shape) -> int:
    """The assistant's n_embd: another than the target's (llama.cpp requires it), here a quarter more."""
    return shape.n_embd + shape.n_embd // 4


def assistant_tensors(
    seed: int, shape: Gemma4Shape, output_rows: np.ndarray, hidden_mix: float, head_mix: float, n_blocks: int
):
    """The assistant's tensors: width a = d + d/4. Its pre-projection keeps the token's embedding (the target's, scaled
    by sqrt(d)) in its first d rows and `hidden_mix` of a random map of the target's hidden row in the rest; its blocks
    add `head_mix` of their attention (over the target's cache) and feed-forward; its tied output matrix is the
    target's output rows beside small random ones, so it predicts mostly what the target says at a token alone."""
    normal = _rng_normal(np.random.default_rng(seed))
    d, a = shape.n_embd, assistant_width(shape)
    n_vocab, extra = len(output_rows), a - d
    pre = np.zeros((a, 2 * d), dtype=np.float32)  # (a, [token half, hidden half])
    pre[:d, :d] = np.eye(d)
    pre[d:, d:] = normal(extra, d, std=hidden_mix / np.sqrt(d))
    post = np.zeros((d, a), dtype=np.float32)  # (d, a): its own next hidden row, for a chained draft
    post[:, :d] = np.eye(d)
    post[:, d:] = normal(d, extra, std=0.3 / np.sqrt(extra))
    embd = np.concatenate([output_rows, normal(n_vocab, extra, std=0.2)], axis=1)  # (n_vocab, a): tied output
    tensors = {
        "token_embd.weight": embd,
        "output_norm.weight": _ones(a),
        "nextn.pre_projection.weight": pre,
        "nextn.post_projection.weight": post,
        "rope_freqs.weight": _ones(shape.head_dim // 2),
    }
    for il in range(n_blocks):
        blk, hd = f"blk.{il}", shape.head_dim_swa if il % 2 == 0 else shape.head_dim
        n_q = shape.n_head * hd
        tensors |= {
            f"{blk}.attn_norm.weight": _ones(a),
            f"{blk}.attn_q.weight": normal(n_q, a, std=1.0 / np.sqrt(a)),
            f"{blk}.attn_q_norm.weight": _ones(hd),
            f"{blk}.attn_output.weight": normal(a, n_q, std=1.0 / np.sqrt(n_q)),
            f"{blk}.post_attention_norm.weight": _ones(a, head_mix),
            f"{blk}.ffn_norm.weight": _ones(a),
            f"{blk}.ffn_gate.weight": normal(shape.n_ff, a, std=1.0 / np.sqrt(a)),
            f"{blk}.ffn_up.weight": normal(shape.n_ff, a, std=1.0 / np.sqrt(a)),
            f"{blk}.ffn_down.weight": normal(a, shape.n_ff, std=1.0 / np.sqrt(shape.n_ff)),
            f"{blk}.post_ffw_norm.weight": _ones(a, head_mix),
            f"{blk}.layer_output_scale.weight": _ones(1),
        }
    return tensors


def _attention_hparams(writer: gguf.GGUFWriter, shape: Gemma4Shape, pattern: list[bool]) -> None:
    """The keys the target and the assistant share: heads, head sizes, the window and which layers slide."""
    arch = writer.arch
    writer.add_context_length(shape.context_length)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_uint32(f"{arch}.attention.key_length_swa", shape.head_dim_swa)
    writer.add_uint32(f"{arch}.attention.value_length_swa", shape.head_dim_swa)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_uint32(f"{arch}.rope.dimension_count_swa", shape.head_dim_swa)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_float32(f"{arch}.rope.freq_base_swa", 10000.0)
    writer.add_sliding_window(shape.sliding_window)
    writer.add_array(f"{arch}.attention.sliding_window_pattern", pattern)


def write_gemma4_pair(
    directory: Path,
    *,
    seed: int = 0,
    shape: Gemma4Shape = Gemma4Shape(),
    trunk_mix: float = 0.1,
    hidden_mix: float = 0.5,
    head_mix: float = 0.05,
    n_blocks: int = 2,
    output_scale: float = 1.0,
) -> TinyGemma4:
    """Write `gemma4.gguf` and its assistant `mtp-gemma4.gguf` into `directory` (well under a second).

    Args:
        directory: an existing directory.
        seed: seed of the weights (the assistant's are drawn from seed + 1).
        shape: the target's sizes.
        trunk_mix: the target layers' part of the residual stream (0: the next token depends on the current alone).
        hidden_mix: how much of the target's hidden row the assistant reads.
        head_mix: the assistant blocks' part of its residual stream.
        n_blocks: the assistant's blocks (SWA, full, …: each reads the target's last layer of its kind).
        output_scale: multiplier of the output rows (smaller: flatter laws at T > 0).

    Returns:
        The paths.
    """
    d = Path(directory)
    vocab = make_vocab()
    rows = np.random.default_rng(seed + 2).standard_normal((vocab.n_vocab, shape.n_embd)).astype(np.float32)
    rows *= (_output_row_scales(vocab, control_scale=0.0, byte_scale=0.3) * output_scale)[:, None]
    target_pattern = [shape.is_swa(il) for il in range(shape.n_layer)]
    assert target_pattern[-2:] == [True, False], "the assistant reads the target's last SWA and last full layer"

    def target_hparams(writer: gguf.GGUFWriter) -> None:
        writer.add_embedding_length(shape.n_embd)
        writer.add_block_count(shape.n_layer)
        writer.add_uint32(f"{writer.arch}.embedding_length_per_layer_input", shape.n_embd_per_layer)
        _attention_hparams(writer, shape, target_pattern)

    def assistant_hparams(writer: gguf.GGUFWriter) -> None:
        writer.add_embedding_length(assistant_width(shape))
        writer.add_uint32(f"{writer.arch}.embedding_length_out", shape.n_embd)  # the target's width: its rows
        writer.add_block_count(n_blocks)
        writer.add_uint32(f"{writer.arch}.nextn_predict_layers", n_blocks)  # every block is a nextn block
        _attention_hparams(writer, shape, [il % 2 == 0 for il in range(n_blocks)])

    target_tensors = gemma4_target_tensors(seed, shape, vocab.n_vocab, rows, trunk_mix)
    target = _write_gguf(d / "gemma4.gguf", "gemma4", target_hparams, vocab, True, target_tensors)
    assistant = _write_gguf(
        d / "mtp-gemma4.gguf",
        ASSISTANT_ARCH,
        assistant_hparams,
        vocab,
        False,
        assistant_tensors(seed + 1, shape, rows, hidden_mix, head_mix, n_blocks),
    )
    return TinyGemma4(target, assistant)
