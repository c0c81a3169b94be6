"""The draft-length policy (core/policy.py) on simulated pairs: its speed against every fixed k, in seconds.

Each scenario is a pair as measured (acceptance α per drafted token, the draft's cost c and the target's verify
cost v(k) in plain steps, with noise and the odd stall); the real `DraftPolicy` chooses each step's k, a seeded
random acceptance decides what it gains, and the clock is simulated. It shows in seconds what the bench shows in
minutes, without a GPU: adaptive against the best fixed k, per scenario, over short and long answers. Not a proof:
real pairs are the bench's (docs/benchmarks.md); the scenarios are taken from there.

    python benchmarks/policy_sim.py [--answers 8] [--tokens 64 400] [--seed 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

from localspec.core.policy import DraftPolicy, PolicyTuning
from localspec.core.stats import Stats, Step, StepTiming

PLAIN = 0.010  # seconds of one plain target step (the unit of the costs)
TUNING = PolicyTuning()  # --tune NAME=VALUE replaces fields


@dataclass(frozen=True)
class Scenario:
    """A pair: acceptance per drafted token (may depend on the token's index in the answer), costs in plain steps."""

    name: str
    alpha: Callable[[int], float]
    draft: float  # c
    verify: Callable[[int], float]  # v(k), k ≥ 1
    noise: float = 0.05  # lognormal sigma of every timing
    stalls: float = 0.02  # chance that a step takes 3× (another process on the cores)
    draft_max: int = 8


SCENARIOS = [
    # c is a draft decode's time / a plain step (a step with k drafts decodes k + 1 tokens after a full acceptance).
    # The demo pair on this project's 2-core CPU, 2026-11-27 (bench --pair demo, a quiet machine): α 0.97, a draft
    # decode 6.5 ms against a 13.5 ms plain step, 9 rows 27.5 ms
    Scenario("demo CPU", lambda i: 0.95, 0.47, lambda k: 1.0 + 0.13 * k),
    # the 14B shape on an H100 (2026-11-27): α 0.8, c 0.2-0.26 per drafted token at k 4-8, v(4) 1.69, v(8) 2.12; one
    # row to two: a jump
    Scenario("14B on a GPU", lambda i: 0.8, 0.2, lambda k: 1.26 + 0.108 * k),
    # the same on an 8 GB laptop plan (30/48 layers on the GPU): c 0.035 per drafted token, v(4) 2.25
    Scenario("14B on 8 GB", lambda i: 0.8, 0.03, lambda k: 1.0 + 0.31 * k, draft_max=4),
    # a useless draft, and one as costly as the target: never worse than plain
    Scenario("useless draft", lambda i: 0.05, 0.3, lambda k: 1.0 + 0.2 * k),
    Scenario("costly draft", lambda i: 0.5, 1.0, lambda k: 1.0 + 0.2 * k),
    # the demo pair at T 0.8 with the default chain (2026-11-27 14:20, in-process): α 0.95 over a run, 0.90-0.98 from
    # one stretch of text to the next; a draft decode 0.3-0.45 of a plain step; v(4) 1.88, v(8) 2.41
    Scenario(
        "demo T 0.8",
        lambda i: 0.98 if (i // 40) % 2 == 0 else 0.9,
        0.35,
        lambda k: 1.35 + 0.13 * k,
        stalls=0.04,
    ),
    # acceptance that changes with the text: code (0.9) then prose (0.4), every 150 tokens
    Scenario("changing text", lambda i: 0.9 if (i // 150) % 2 == 0 else 0.4, 0.13, lambda k: 1.0 + 0.12 * k),
]


class Clock:
    def __init__(self, rng: random.Random, scenario: Scenario) -> None:
        self.rng, self.s = rng, scenario

    def seconds(self, plain_steps: float) -> float:
        stall = 3.0 if self.rng.random() < self.s.stalls else 1.0
        return PLAIN * plain_steps * stall * math.exp(self.rng.gauss(0.0, self.s.noise))


def answer(policy: DraftPolicy | None, k_fixed: int, s: Scenario, tokens: int, rng: random.Random) -> float:
    """Seconds to emit `tokens` tokens with the policy (or a fixed k when `policy` is None)."""
    clock, emitted, seconds, stats = Clock(rng, s), 0, 0.0, Stats()
    fixed = DraftPolicy() if policy is None else policy
    fixed.start()
    while emitted < tokens:
        limit = min(s.draft_max, tokens - emitted - 1)
        k = fixed.choose(policy is not None, k_fixed if policy is None else limit, timed=True).k
        k = min(k, max(limit, 0))
        accepted = 0
        while accepted < k and rng.random() < s.alpha(emitted + accepted):
            accepted += 1
        decoded = (
            k + (accepted == k) if k else 0
        )  # the draft's decodes: the last draft and the bonus after a full accept
        draft = clock.seconds(decoded * s.draft) if k else 0.0
        verify = clock.seconds(s.verify(k) if k else 1.0)
        step = Step(
            tokens=((0, True),) * accepted + ((0, False),),
            drafted=k,
            accepted=accepted,
            draft_decoded=decoded,
            timing=StepTiming(seconds_draft=draft, seconds_verify=verify * 0.95, seconds_sampling=verify * 0.05),
        )
        stats.record_step(step)
        fixed.observe(step)
        emitted += step.emitted
        seconds += draft + verify
    return seconds


def run(s: Scenario, answers: int, tokens: int, seed: int) -> dict[str, float]:
    """tok/s of adaptive and of each fixed k (one engine's session of `answers` answers each), as ×plain."""
    out = {}
    for name, k in [("plain", 0), *((f"k={k}", k) for k in (1, 2, 3, 4, 6, 8) if k <= s.draft_max), ("adaptive", -1)]:
        rng = random.Random(seed)
        policy = DraftPolicy(tuning=TUNING) if k < 0 else None
        total = sum(answer(policy, k, s, tokens, rng) for _ in range(answers))
        out[name] = answers * tokens / total
    plain = out["plain"]
    return {name: rate / plain for name, rate in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=int, default=8, help="answers per session (the policy learns across them)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 400])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--tune", action="append", default=[], help="PolicyTuning NAME=VALUE")
    args = parser.parse_args()
    global TUNING
    pairs = (t.split("=") for t in args.tune)
    values = {k: tuple(map(int, v.split(","))) if "," in v else float(v) for k, v in pairs}
    TUNING = dataclasses.replace(TUNING, **values)
    for tokens in args.tokens:
        print(f"\n{args.answers} answers of {tokens} tokens, ×plain (median of {args.seeds} seeds):")
        print(f"{'scenario':16} {'best fixed':>14} {'adaptive':>9} {'÷ best':>7}")
        for s in SCENARIOS:
            runs = [run(s, args.answers, tokens, seed) for seed in range(args.seeds)]
            names = runs[0].keys()
            med = {n: statistics.median(r[n] for r in runs) for n in names}
            best = max((n for n in names if n != "adaptive"), key=lambda n: med[n])
            print(f"{s.name:16} {best:>8} {med[best]:5.2f} {med['adaptive']:9.2f} {med['adaptive'] / med[best]:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
