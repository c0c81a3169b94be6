#!/usr/bin/env python3
"""What flash attention costs or saves on the slots' one KV pool (`serve --parallel`, docs/DESIGN.md §8), and what it
does to "the same answer alone and beside others": shared-batch decodes of 1 and 4 streams × 1, 2 and 4 rows a
stream, on a pool of 4 sequences (`kv_unified`), flash attention on and off interleaved round by round; first the
largest logit difference between a sequence decoded alone and in the pool beside another, two placements.

Usage: scripts/pool_flash_attention.py TARGET.gguf [--fill N ...] [--rounds N] [--reps N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localspec.llama.context import Context  # noqa: E402
from localspec.llama.model import Model  # noqa: E402
from localspec.llama.slots import SeqContext, decode_shared  # noqa: E402

SHAPES = [(1, 1), (1, 2), (1, 4), (4, 1), (4, 2), (4, 4)]  # (streams, rows a stream)


def pool(model: Model, flash: bool, n_ctx: int) -> Context:
    """A context of 4 sequences over one pool of n_ctx cells, flash attention forced on or off."""

    class _Pool(Context):
        def _configure(self, params) -> None:
            params.flash_attn_type = 1 if flash else 0

    return _Pool(model, n_ctx=n_ctx, n_seq=4)


def filled(model: Model, flash: bool, fill: int) -> list[SeqContext]:
    """The 4 sequences of a pool of 4096 cells, each holding `fill` tokens of its own."""
    ctx = pool(model, flash, 4096)
    views = [SeqContext(ctx, s) for s in range(4)]
    for s, view in enumerate(views):
        view.decode([5 + (s * 31 + 7 * i) % 400 for i in range(fill)], 0, outputs=0)
    return views


def timed(views: list[SeqContext], fill: int, reps: int) -> dict[tuple[int, int], tuple[float, float]]:
    """Each shape's shared decode, every sequence holding `fill` tokens: (the least wall seconds of `reps`, the median
    CPU seconds of this process) — on a machine shared with other work the least wall time and the CPU time are what
    the decode itself costs; the median wall time is what the others left of it."""
    out = {}
    for streams, rows in SHAPES:
        wall, cpu = [], []
        for _ in range(reps + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            decode_shared([(views[s], [11 + j for j in range(rows)], fill) for s in range(streams)])
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            for view in views[:streams]:
                view.discard()
        out[(streams, rows)] = (min(wall[1:]), statistics.median(cpu[1:]))
    return out


def placements(model: Model, flash: bool) -> tuple[float, float]:
    """Largest |Δ logit| of a sequence's next row against the same decodes alone: (its next cell in a hole another
    sequence left before its own cells, its cells interleaved with another's) — tests/llama/test_unified_cache.py."""
    a = [5 + (7 * i) % 190 for i in range(48)]
    b = [9 + (11 * i) % 180 for i in range(44)]

    def row(ctx: Context, seq: int = 0) -> np.ndarray:
        ctx.decode(b[42:43], 42, outputs=1, seq=seq)
        return ctx.logits(-1).copy()

    with pool(model, flash, 256) as ctx:
        ctx.decode(b[:42], 0, outputs=0, seq=1)
        alone = row(ctx, 1)
        ctx.clear()
        for start in range(0, 42, 6):
            ctx.decode(b[start : start + 6], start, outputs=0, seq=1)
        alone6 = row(ctx, 1)
        ctx.clear()
        ctx.decode(a, 0, outputs=0, seq=0)
        ctx.decode(b[:42], 0, outputs=0, seq=1)
        ctx.remove_from(40, 0)
        hole = row(ctx, 1)
        ctx.clear()
        for start in range(0, 42, 6):
            ctx.decode(a[start : start + 6], start, outputs=0, seq=0)
            ctx.decode(b[start : start + 6], start, outputs=0, seq=1)
        mixed = row(ctx, 1)
    return float(np.abs(hole - alone).max()), float(np.abs(mixed - alone6).max())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("--fill", type=int, nargs="+", default=[128, 960])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    with Model(args.target) as model:
        for flash in (False, True):
            hole, mixed = placements(model, flash)
            print(
                f"flash attention {'on ' if flash else 'off'}: max |Δ logit| against alone: next cell in a hole "
                f"before its own {hole:.3g}, cells interleaved with another's {mixed:.3g}"
            )
        results: dict[tuple[bool, int], list[dict]] = {}
        pools = {(flash, fill): filled(model, flash, fill) for fill in args.fill for flash in (False, True)}
        for _ in range(args.rounds):
            for fill in args.fill:
                for flash in (False, True):  # interleaved: each round times both
                    results.setdefault((flash, fill), []).append(timed(pools[(flash, fill)], fill, args.reps))
        for views in pools.values():
            views[0].parent.close()
    print("fill  streams×rows  least wall ms: FA off  FA on  off/on   CPU ms: FA off  FA on  off/on")
    for fill in args.fill:
        for shape in SHAPES:
            off = [statistics.median(r[shape][k] for r in results[(False, fill)]) * 1e3 for k in (0, 1)]
            on = [statistics.median(r[shape][k] for r in results[(True, fill)]) * 1e3 for k in (0, 1)]
            print(
                f"{fill:4d}  {shape[0]}×{shape[1]}          {off[0]:8.1f} {on[0]:6.1f}  {off[0] / on[0]:5.2f}"
                f"            {off[1]:8.1f} {on[1]:6.1f}  {off[1] / on[1]:5.2f}"
            )


if __name__ == "__main__":
    main()
