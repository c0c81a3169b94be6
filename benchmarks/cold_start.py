"""What a 16 ms pause does to the Python between two decodes: the same sampling call on the same row, timed right
after another (warm), after a single-token `llama_decode`, after summing 300 MB (caches emptied, no pause) and after
`time.sleep(0.016)` (no work at all). The four run in turn, so the machine's noise hits them alike.

On this project's 2-core VM the sampling calls take 3-8× as long after a decode or after emptying the caches as
back to back (2-5× after the sleep), while a plain Python loop (the control) barely slows: the Python time per drafted
token that `localspec bench` reports there is mostly this cold start of numpy's code and data, not our code's share
(docs/benchmarks.md "Where the Python time goes"). Not a test: the numbers depend on the machine and its load
(printed with them).

    python benchmarks/cold_start.py MODEL.gguf [--rounds 40]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time

import numpy as np

from localspec.core.sampling import SamplingParams, greedy_token, sampling_law
from localspec.llama.context import Context
from localspec.llama.model import Model

PAUSES = ("back to back", "after a decode", "after summing 300 MB", "after sleeping 16 ms")


def python_loop(_row: np.ndarray) -> int:
    """2,000 additions in the interpreter: no numpy, little memory — the control for the sampling calls."""
    total = 0
    for i in range(2000):
        total += i
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a GGUF file (its vocabulary sets the row's size)")
    parser.add_argument("--rounds", type=int, default=40, help="timings per pause and call (default 40)")
    args = parser.parse_args()
    for name in ("localspec", "llama.cpp"):  # our notes and llama.cpp's loading remarks
        logging.getLogger(name).setLevel(logging.ERROR)
    hot, greedy = SamplingParams(temperature=0.8), SamplingParams(temperature=0)
    calls = {
        "argmax (T 0)": lambda r: greedy_token(r, [], greedy),
        "law (T 0.8)": lambda r: sampling_law(r, [], hot),
        "Python loop": python_loop,
    }
    big = np.ones(300 * 2**20 // 8)
    with Model(args.model) as model, Context(model, n_ctx=args.rounds * len(PAUSES) * len(calls) + 64) as ctx:
        ctx.decode(list(range(100, 132)), 0, outputs=1)
        n_past, row = 32, ctx.logits(-1).copy()  # the same row for every timing: only the pause differs
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for name, call in calls.items():
                for pause in PAUSES:
                    if pause == "after a decode":
                        ctx.decode([7], n_past, outputs=1)
                        n_past += 1
                    elif pause == "after summing 300 MB":
                        big.sum()
                    elif pause == "after sleeping 16 ms":
                        time.sleep(0.016)
                    else:
                        call(row)  # the warm-up this column is about
                    t0 = time.perf_counter()
                    call(row)
                    times.setdefault((name, pause), []).append(time.perf_counter() - t0)
    print(f"{model.path.name}, {row.shape[0]:,}-token rows; load {os.getloadavg()[0]:.1f}; median µs of one call:")
    print(f"{'':<14}" + "".join(f"{p:>22}" for p in PAUSES))
    for name in calls:
        print(f"{name:<14}" + "".join(f"{statistics.median(times[name, p]) * 1e6:>22.0f}" for p in PAUSES))


if __name__ == "__main__":
    main()
