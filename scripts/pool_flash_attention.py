#!/usr/bin/env python3
"""What flash attention costs or saves on the slots' one KV pool (`serve --parallel`, docs/DESIGN.md §8), and what it
does to "the same answer alone and beside others": shared-batch decodes of 1 and 4 streams × 1, 2 and 4 rows a
stream, on a pool of 4 sequences (`kv_unified`), flash attention on and off interleaved round by round; then the
largest logit difference between a sequence decoded alone and beside another whose cells it lands between.

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


def timed(views: list[SeqContext], fill: int, reps: int) -> dict[tuple[int, int], float]:
    """Median seconds of a shared decode of each shape, every sequence holding `fill` tokens."""
    out = {}
    for streams, rows in SHAPES:
        seconds = []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            decode_shared([(views[s], [11 + j for j in range(rows)], fill) for s in range(streams)])
            seconds.append(time.perf_counter() - t0)
            for view in views[:streams]:
                view.discard()
        out[(streams, rows)] = statistics.median(seconds[1:])
    return out


def alone_beside(model: Model, flash: bool) -> float:
    """Largest |Δ logit| of a sequence's next row decoded alone against beside another, its next cell landing in a
    hole the other left before its own cells (what a pool does after a slot rolls back)."""
    a = [5 + (7 * i) % 190 for i in range(48)]
    b = [9 + (11 * i) % 180 for i in range(44)]
    with pool(model, flash, 256) as alone:
        alone.decode(b[:43], 0, outputs=1, seq=1)
        reference = alone.logits(-1).copy()
    with pool(model, flash, 256) as ctx:
        ctx.decode(a, 0, outputs=0, seq=0)
        ctx.decode(b[:42], 0, outputs=0, seq=1)
        ctx.remove_from(40, 0)
        ctx.decode(b[42:43], 42, outputs=1, seq=1)
        return float(np.abs(ctx.logits(-1) - reference).max())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("--fill", type=int, nargs="+", default=[128, 960])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    with Model(args.target) as model:
        for flash in (False, True):
            print(
                f"flash attention {'on ' if flash else 'off'}: alone vs beside max |Δ logit| "
                f"{alone_beside(model, flash):.4g}"
            )
        results: dict[tuple[bool, int], list[dict]] = {}
        pools = {(flash, fill): filled(model, flash, fill) for fill in args.fill for flash in (False, True)}
        for _ in range(args.rounds):
            for fill in args.fill:
                for flash in (False, True):  # interleaved: each round times both
                    results.setdefault((flash, fill), []).append(timed(pools[(flash, fill)], fill, args.reps))
        for views in pools.values():
            views[0].parent.close()
    print("fill  streams×rows  FA off ms  FA on ms  off/on")
    for fill in args.fill:
        for shape in SHAPES:
            off = statistics.median(r[shape] for r in results[(False, fill)]) * 1e3
            on = statistics.median(r[shape] for r in results[(True, fill)]) * 1e3
            print(f"{fill:4d}  {shape[0]}×{shape[1]}          {off:8.1f}  {on:8.1f}  {off / on:5.2f}")


if __name__ == "__main__":
    main()
