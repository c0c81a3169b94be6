"""What memory a context may take: the size of a KV cache of n cells, read from the model's facts (for a friendly
error before llama.cpp aborts), the memory this process may use, and what a user is told when a context's cells run
out."""

from __future__ import annotations

import contextlib
import os

from localspec.errors import ModelFileError

from .footprint import read_footprint
from .model import ModelInfo


def kv_bytes_estimate(info: ModelInfo, n_ctx: int) -> int:
    """Rough size of an F16 KV cache of `n_ctx` cells (for a friendly error before llama.cpp aborts)."""
    if info.is_recurrent or info.n_head == 0:
        return 0
    if info.is_hybrid:  # a KV cache on its attention layers only: the header says which
        with contextlib.suppress(ModelFileError):
            return read_footprint(info.path).kv_bytes(n_ctx)
    head_dim = info.n_embd // info.n_head
    return 2 * 2 * info.n_layer * n_ctx * info.n_head_kv * head_dim


def memory_bytes() -> int:
    """Memory the process may use: available RAM on Linux (MemAvailable, reclaimable page cache included), physical
    RAM elsewhere."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    for name in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            return os.sysconf(name) * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            continue
    return 1 << 62


def full_message(n_ctx: int, n_seq: int) -> str:
    """What a user is told when a context of `n_ctx` cells over `n_seq` sequences has no free cell left: one line,
    with what to change."""
    if n_seq > 1:
        return f"the slots' shared KV pool is full ({n_ctx} cells for {n_seq} slots): raise --n-ctx or lower --parallel"
    return f"no room in the KV cache ({n_ctx} tokens): start a new chat or raise --n-ctx"
