#!/usr/bin/env python3
"""A request with speculation against the same request without it, side by side (issue 65): the demo pair's engine with
its draft and its target alone (`--drafter none`), each in a process of its own, each request shape run on both back
to back (the order alternating), so a machine whose load changes from minute to minute still compares like with like.
Two engines in ONE process (`--one-process`, how this script ran before) are not like with like: there the engine with
the draft read the same prompt 5-10 % slower in every round, whichever was loaded first, while in processes of their
own the two read it alike (docs/benchmarks.md). Shapes:
`bench --agents`' two agents taking turns with 1,200-word system prompts (cached prompts after the first round) and a
fresh system prompt each round (cold), each with short and long answers (greedy, max_tokens 4 and 128). Prints each
shape's median seconds a request and none ÷ model (≥ 1: speculation no slower; docs/benchmarks.md).

Usage: LOCALSPEC_HOME=... scripts/draft_read_ab.py [--rounds 4] [--tokens 4,128] [--none-first] [--one-process]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

from localspec.bench.agents import cold_conversation, conversation
from localspec.core.engine import Engine
from localspec.core.sampling import SamplingParams
from localspec.llama.model import Model
from localspec.models import demo
from localspec.paths import get_paths


def chat(messages: list[dict]) -> str:
    """SmolLM2's chat template, written out (the demo pair's)."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def timed(engine: Engine, prompt: list[int], tokens: int) -> tuple[float, int]:
    """Seconds of one greedy request (its prompt read included), and the tokens the draft read."""
    t0 = time.perf_counter()
    gen = engine.generate(prompt, sampling=SamplingParams(temperature=0), max_tokens=tokens)
    for _ in gen:
        pass
    return time.perf_counter() - t0, gen.stats.draft_prefill_decoded


def load(name: str) -> Engine:
    """The demo pair's engine with its draft ("model"), or its target alone ("none")."""
    paths = get_paths()
    target, draft = demo.builtin_path(demo.TARGET, paths), demo.builtin_path(demo.DRAFT, paths)
    return Engine.load(target, draft if name == "model" else None, drafter=name, n_ctx=4096)


def serve(name: str, conn) -> None:
    """A process of its own: its engine answers each (prompt, tokens) with `timed` until it is sent None."""
    engine = load(name)
    conn.send("ready")
    while (asked := conn.recv()) is not None:
        conn.send(timed(engine, *asked))
    engine.close()


class Apart:
    """An engine in a process of its own, asked as `timed` asks one here."""

    def __init__(self, name: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(name, child), daemon=True)
        self.process.start()
        self.conn.recv()

    def timed(self, prompt: list[int], tokens: int) -> tuple[float, int]:
        self.conn.send((prompt, tokens))
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(60)


class Here:
    """An engine in this process."""

    def __init__(self, name: str) -> None:
        self.engine = load(name)

    def timed(self, prompt: list[int], tokens: int) -> tuple[float, int]:
        return timed(self.engine, prompt, tokens)

    def close(self) -> None:
        self.engine.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", default="4,128")
    parser.add_argument("--none-first", action="store_true", help="load the engine without a draft first")
    parser.add_argument("--one-process", action="store_true", help="both engines in this process (not like with like)")
    args = parser.parse_args()
    kind = Here if args.one_process else Apart
    engines = {name: kind(name) for name in (("none", "model") if args.none_first else ("model", "none"))}
    paths = get_paths()
    tokenize = Model(demo.builtin_path(demo.TARGET, paths), vocab_only=True).tokenize
    seconds: dict[tuple[str, int, str], list[float]] = {}
    reads: dict[tuple[str, int], list[int]] = {}
    print(f"load before: {os.getloadavg()[0]:.2f}", flush=True)
    try:
        for engine in engines.values():  # warm-up, not measured
            engine.timed(tokenize(chat([{"role": "user", "content": "Hello."}]), parse_special=True), 2)
        sizes, seen = [int(t) for t in args.tokens.split(",")], set()
        for r in range(args.rounds):
            order = list(engines) if r % 2 == 0 else list(reversed(engines))
            for i, tokens in enumerate(sizes):
                turn = r * len(sizes) + i  # a new message each request, a new cold prompt each
                requests = [("turns" if a in seen else "cold", conversation(a, turn, 1200)) for a in range(2)]
                seen.update(range(2))
                requests.append(("cold", cold_conversation(turn, 1200)))
                for shape, messages in requests:
                    prompt = tokenize(chat(messages), add_special=True, parse_special=True)
                    for name in order:
                        s, read = engines[name].timed(prompt, tokens)
                        seconds.setdefault((shape, tokens, name), []).append(s)
                        if name == "model":
                            reads.setdefault((shape, tokens), []).append(read)
            print(f"round {r + 1}/{args.rounds} done, load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    print(f"{'shape':<6} {'tokens':>6} {'model s':>8} {'none s':>8} {'none÷model':>10} {'n':>3}  draft read (tokens)")
    for shape, tokens in sorted({(s, t) for s, t, _ in seconds}, key=lambda k: (k[1], k[0])):
        model, none = (statistics.median(seconds[(shape, tokens, n)]) for n in ("model", "none"))
        n, read = len(seconds[(shape, tokens, "model")]), reads[(shape, tokens)]
        print(f"{shape:<6} {tokens:>6} {model:>8.3f} {none:>8.3f} {none / model:>10.2f} {n:>3}  {read}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
