#!/usr/bin/env python3
"""How much of each prompt `localspec serve` reads when two chats take turns, on the tiny hybrid (qwen35: gated delta
net + attention) model and on a tiny attention model: `timings.prompt_n` per request, two chats with their own long
system prompts alternating for three turns (docs/benchmarks.md, "Hybrid models stay warm"). Counts, not timings.

Usage: scripts/hybrid_cache_turns.py [WORK_DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.server import raw, start_server  # noqa: E402  (the tests' server runner)
from support.tinymodels import write_llama_model, write_mtp_model  # noqa: E402  (the tests' model writers)


def prompt_reads(work: Path, model: Path, *flags: str) -> list[int]:
    """`timings.prompt_n` of each request: chats A and B in turns, three turns each."""
    home = work / f"home-{model.stem}"
    home.mkdir(parents=True, exist_ok=True)
    server = start_server(home, "--target", str(model), "--n-ctx", "2048", "--temp", "0", *flags)
    try:
        systems = {"A": "you are a fox " * 60, "B": "you are a cat " * 60}
        turns: dict[str, list[dict]] = {"A": [], "B": []}
        reads = []
        for turn in range(3):
            for chat, system in systems.items():
                turns[chat].append({"role": "user", "content": f"question {turn}"})
                body = {"messages": [{"role": "system", "content": system}, *turns[chat]], "max_tokens": 8}
                _, _, reply = raw(server.port, "POST", "/v1/chat/completions", body)
                answer = json.loads(reply)
                turns[chat].append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
                reads.append(answer["timings"]["prompt_n"])
        return reads
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    work = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="localspec-hybrid-turns-"))
    work.mkdir(parents=True, exist_ok=True)
    hybrid = write_mtp_model(work / "qwen35.gguf")
    attention = write_llama_model(work / "llama.gguf")
    for name, model, flags in (
        ("hybrid (qwen35), its MTP head drafting", hybrid, ()),
        ("hybrid (qwen35), --drafter none", hybrid, ("--drafter", "none")),
        ("attention (llama)", attention, ()),
    ):
        print(f"{name}: prompt_n per request (A, B, A, B, A, B): {prompt_reads(work, model, *flags)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
