"""What the n-gram drafters' index costs per token as the history grows: a history of N tokens is followed token by
token (as a generation appends to it) and, every 8 tokens, asked for a 16-token continuation (as a step asks for a
draft), at N = 1k, 10k and 100k. No model: the tokens are text-like (a few hundred distinct words, repeated phrases),
drawn once from a seeded generator. Prints µs per token appended, µs per lookup, and the index's memory per token.

The index is O(1) per token (one hash and one table write per indexed length) and a lookup costs at most one probe
per length and a bounded compare, so both columns must stay flat from 1k to 100k tokens; a growing column is a
regression (docs/benchmarks.md "The n-gram index"). Not a test: the numbers depend on the machine and its load.

    python benchmarks/ngram_index.py [--sizes 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import os
import time
import tracemalloc

import numpy as np

from localspec.core.ngram import NgramIndex


def text_like(n: int, seed: int = 0) -> list[int]:
    """n tokens of a few hundred words in a Zipf-like mix, with a phrase of 5–40 tokens repeated now and then."""
    rng = np.random.default_rng(seed)
    words = np.minimum(rng.zipf(1.3, size=n), 800).tolist()
    out: list[int] = []
    while len(out) < n:
        if len(out) > 100 and rng.random() < 0.05:  # quote an earlier phrase
            start = int(rng.integers(0, len(out) - 40))
            out += out[start : start + int(rng.integers(5, 40))]
        else:
            out.append(words[len(out)])
    return out[:n]


def measure(n: int) -> tuple[float, float, float]:
    """(µs per token appended, µs per lookup, bytes per token) over a history of n tokens."""
    tokens = text_like(n)
    index, history = NgramIndex(), []
    appending = looking = 0.0
    lookups = 0
    for i, token in enumerate(tokens):
        history.append(token)
        t0 = time.perf_counter()
        index.follow(history, same=True)
        t1 = time.perf_counter()
        appending += t1 - t0
        if i % 8 == 0:
            index.continuation(16)
            looking += time.perf_counter() - t1
            lookups += 1
    del index
    tracemalloc.start()  # the memory, on a second index (tracing slows every allocation: not while timing)
    index = NgramIndex()
    index.follow(tokens)
    memory = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return 1e6 * appending / n, 1e6 * looking / max(lookups, 1), memory / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    args = parser.parse_args()
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load {load}")
    print(f"{'tokens':>8}{'µs/token':>10}{'µs/lookup':>11}{'bytes/token':>13}")
    for n in (int(x) for x in args.sizes.split(",")):
        per_token, per_lookup, memory = measure(n)
        print(f"{n:>8,}{per_token:>10.2f}{per_lookup:>11.2f}{memory:>13.0f}")


if __name__ == "__main__":
    main()
