#!/usr/bin/env python3
"""How often the draft is accepted when it holds only a window of a long prompt (issue 65, core/draftread.py): greedy
answers to long prompts (excerpts of this repository's docs with a question after them, and `bench --agents`' system
prompts), the draft reading the prompt's last W tokens (W = all: the whole prompt), at a fixed draft length (so the
draft always reads its window). Prints accepted / drafted, tokens a step and the tokens the draft read per W, and its
read speed (docs/benchmarks.md "The draft's window"). Counts; the speed as it came (check `uptime` first).

Usage: LOCALSPEC_HOME=... scripts/draft_window.py [--widths 64,128,256,512,all] [--tokens 96] [--k 4]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from localspec.bench.agents import conversation
from localspec.core.engine import Engine
from localspec.core.params import SpeculativeParams
from localspec.core.sampling import SamplingParams
from localspec.models import demo
from localspec.paths import get_paths

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/DESIGN.md", "docs/serve.md")
WORDS = 1000  # words of each excerpt


def chat(system: str, user: str) -> str:
    """SmolLM2's chat template, written out (the demo pair's)."""
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def prompts() -> list[tuple[str, str]]:
    """(name, text): each doc's excerpt with a question, and two agents' system prompts with their message."""
    out = []
    for doc in DOCS:
        words = (ROOT / doc).read_text(encoding="utf-8").split()[:WORDS]
        out.append((doc, chat("You are a helpful assistant.", " ".join(words) + "\n\nSummarise the text above.")))
    for agent in range(2):
        system, user = conversation(agent, 1, 1200)
        out.append((f"agent {agent}", chat(system["content"], user["content"])))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="64,128,256,512,all")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    paths = get_paths()
    target, draft = demo.builtin_path(demo.TARGET, paths), demo.builtin_path(demo.DRAFT, paths)
    engine = Engine.load(target, draft, drafter="model", n_ctx=4096)
    spec = SpeculativeParams(draft_max=args.k, adaptive=False)
    texts = [
        (name, engine.target_model.tokenize(text, add_special=True, parse_special=True)) for name, text in prompts()
    ]
    print(f"prompts: {', '.join(f'{name} ({len(tokens)} tokens)' for name, tokens in texts)}; k {args.k}, greedy")
    print(f"{'W':>5} {'accepted/drafted':>17} {'tokens/step':>11} {'draft read':>10}  per prompt")
    try:
        for width in args.widths.split(","):
            engine.drafter.reads.width = None if width == "all" else int(width)
            accepted = drafted = steps = emitted = read = 0
            each = []
            for _, tokens in texts:
                engine.drafter.reads.seq.rollback_to(0)  # each prompt read afresh
                gen = engine.generate(tokens, sampling=SamplingParams(temperature=0), spec=spec, max_tokens=args.tokens)
                for _ in gen:
                    pass
                s = gen.stats
                accepted, drafted, steps = accepted + s.accepted, drafted + s.drafted, steps + s.target_passes
                emitted, read = emitted + s.emitted, read + s.draft_prefill_decoded
                each.append(f"{100 * s.accepted / max(s.drafted, 1):.0f}%")
            rate = f"{100 * accepted / max(drafted, 1):.1f}% ({accepted}/{drafted})"
            print(f"{width:>5} {rate:>17} {emitted / max(steps, 1):>11.2f} {read:>10}  {' '.join(each)}")
        per_token = engine.drafter.reads.seconds.value
        print(f"the draft's reads: {1000 * per_token:.2f} ms a token (median of its last reads)")
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
