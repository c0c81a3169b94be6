"""Tiny image-reading models for tests of llama.cpp's mtmd: a LLaVA-style projector beside a tiny llama pair.

The projector is a random-weight CLIP encoder (32×32 pixels in patches of 8: 16 image tokens) with LLaVA's `mlp`
projector, whose output rows equal the target's n_embd (DESIGN §11 lists the keys and tensors measured to load).
The target and the draft are tinymodels' llama pair (one vocabulary, the draft is the target plus noise), and two
broken projectors exercise the refusals: one whose output size is not the target's, one missing a tensor. Also small
image files written by hand (PNG, BMP; no Pillow) and a PNG header that claims a huge picture.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from .tinymodels import DRAFT_NOISE, TARGET_SEED, LlamaShape, make_llama_tensors, write_llama_model

PROJECTOR_SEED = 7
IMAGE_SIZE, PATCH_SIZE = 32, 8
N_IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # llava drops the class token: one embedding per patch
_EMBD, _FF, _HEADS, _BLOCKS = 32, 64, 4, 2  # the vision encoder's sizes
MISSING_TENSOR = "mm.0.bias"  # without it mtmd opens the file, then crashes building the encoder's graph


@dataclass(frozen=True)
class TinyVision:
    """Paths of the files `write_tiny_vision` writes into one directory."""

    target: Path  # tinymodels' llama target (n_embd 64, the shared vocabulary)
    draft: Path  # the target plus DRAFT_NOISE: same vocabulary, a same-tokenizer pair
    mmproj: Path  # the projector that matches the target
    mmproj_wrong_size: Path  # its mm.2 writes 48 values, not the target's 64: mtmd refuses it at init
    mmproj_missing_tensor: Path  # MISSING_TENSOR left out: opens, then crashes at warm-up or the first encode


def write_projector(path: Path, *, n_embd_text: int = 64, seed: int = PROJECTOR_SEED, drop: str = "") -> Path:
    """Write a tiny CLIP vision encoder with a LLaVA `mlp` projector (F32, random weights) to `path`.

    Args:
        path: Destination file.
        n_embd_text: Rows of `mm.2`: the text model's n_embd it feeds (another value makes a mismatched file).
        seed: Seed of the weights.
        drop: A tensor name to leave out (a broken file), or "".

    Returns:
        `path`.
    """
    rng = np.random.default_rng(seed)
    e, n_patches = _EMBD, N_IMAGE_TOKENS

    def normal(*dims: int, std: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(dims) * std).astype(np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    tensors = {
        "v.patch_embd.weight": normal(e, 3, PATCH_SIZE, PATCH_SIZE, std=1.0 / np.sqrt(3 * PATCH_SIZE**2)),
        "v.position_embd.weight": normal(n_patches + 1, e, std=0.5),  # (patches + class token, E)
        "v.class_embd": normal(e, std=0.5),
    }
    for il in range(_BLOCKS):
        blk = f"v.blk.{il}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{blk}.{name}.weight"] = normal(e, e, std=1.0 / np.sqrt(e))  # (E, E)
            tensors[f"{blk}.{name}.bias"] = zeros(e)
        for norm in ("ln1", "ln2"):
            tensors[f"{blk}.{norm}.weight"] = np.ones(e, dtype=np.float32)
            tensors[f"{blk}.{norm}.bias"] = zeros(e)
        tensors |= {
            f"{blk}.ffn_up.weight": normal(_FF, e, std=1.0 / np.sqrt(e)),  # (FF, E)
            f"{blk}.ffn_up.bias": zeros(_FF),
            f"{blk}.ffn_down.weight": normal(e, _FF, std=1.0 / np.sqrt(_FF)),  # (E, FF)
            f"{blk}.ffn_down.bias": zeros(e),
        }
    # The projector: mm.0 then GELU then mm.2. Unit-scale outputs, like the token embeddings they sit among.
    tensors |= {
        "mm.0.weight": normal(64, e, std=1.0 / np.sqrt(e)),  # (64, E)
        "mm.0.bias": zeros(64),
        "mm.2.weight": normal(n_embd_text, 64, std=1.0 / np.sqrt(64) * 2.0),  # (n_embd_text, 64)
        "mm.2.bias": zeros(n_embd_text),
    }
    tensors.pop(drop, None)

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_name("tiny-llava-projector")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_clip_projector_type("mlp")
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_use_gelu(True)
    writer.add_vision_image_size(IMAGE_SIZE)
    writer.add_vision_patch_size(PATCH_SIZE)
    writer.add_vision_embedding_length(e)
    writer.add_vision_feed_forward_length(_FF)
    writer.add_vision_projection_dim(n_embd_text)
    writer.add_vision_block_count(_BLOCKS)
    writer.add_vision_head_count(_HEADS)
    writer.add_vision_attention_layernorm_eps(1e-6)
    writer.add_vision_image_mean([0.5, 0.5, 0.5])
    writer.add_vision_image_std([0.5, 0.5, 0.5])
    for name, tensor in tensors.items():
        writer.add_tensor(name, np.ascontiguousarray(tensor))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def write_vision_trio(directory: Path) -> tuple[Path, Path, Path]:
    """Write `target.gguf`, `draft.gguf` and `mmproj.gguf` into `directory` (deterministic); returns their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shape = LlamaShape()
    base = make_llama_tensors(TARGET_SEED, shape=shape)
    target = write_llama_model(directory / "target.gguf", base=base, shape=shape)
    draft = write_llama_model(directory / "draft.gguf", seed=1, base=base, noise=DRAFT_NOISE, shape=shape)
    return target, draft, write_projector(directory / "mmproj.gguf", n_embd_text=shape.n_embd)


def write_tiny_vision(directory: Path) -> TinyVision:
    """Write the trio (`write_vision_trio`) and the broken projectors into `directory` (deterministic)."""
    target, draft, mmproj = write_vision_trio(directory)
    n_embd = LlamaShape().n_embd
    return TinyVision(
        target=target,
        draft=draft,
        mmproj=mmproj,
        mmproj_wrong_size=write_projector(Path(directory) / "mmproj-wrong-size.gguf", n_embd_text=n_embd - 16),
        mmproj_missing_tensor=write_projector(
            Path(directory) / "mmproj-missing-tensor.gguf", n_embd_text=n_embd, drop=MISSING_TENSOR
        ),
    )


# --- images -------------------------------------------------------------------------------------------------


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header(width: int, height: int) -> bytes:
    """The signature and IHDR chunk of an 8-bit RGB PNG of width×height: what a reader sees first."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit depth, RGB, no interlace
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)


def png_bytes(pixels: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of `pixels`, a (height, width, 3) uint8 array."""
    height, width, _ = pixels.shape
    rows = b"".join(b"\x00" + pixels[y].astype(np.uint8).tobytes() for y in range(height))  # filter 0 per row
    return png_header(width, height) + png_chunk(b"IDAT", zlib.compress(rows)) + png_chunk(b"IEND", b"")


def random_pixels(seed: int, size: int = IMAGE_SIZE) -> np.ndarray:
    """A (size, size, 3) uint8 picture of noise; other seeds, other pictures."""
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


def bmp_bytes(pixels: np.ndarray) -> bytes:
    """A 24-bit BMP of `pixels`, a (height, width, 3) uint8 array (bottom-up rows, BGR, padded to 4 bytes)."""
    height, width, _ = pixels.shape
    stride = (width * 3 + 3) & ~3
    rows = b"".join(pixels[y, :, ::-1].tobytes().ljust(stride, b"\x00") for y in range(height - 1, -1, -1))
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(rows), 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + len(info) + len(rows), 0, 0, 14 + len(info)) + info + rows
