#!/usr/bin/env python3
"""How often the draft of the tiny image-reading trio is accepted after a picture, reading a blank (`Filler`), rows of
zeros (`ZeroRows`) or the target's image embeddings (`Embedded`), beside the same turns without a picture: accepted /
drafted over 4 prompts × 3 pictures × 48 tokens at fixed k (docs/benchmarks.md, "A draft that reads the picture").
Counts, not timings.

Usage: scripts/draft_image_acceptance.py [WORK_DIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.tinyvision import png_bytes, random_pixels, write_tiny_vision  # noqa: E402  (the tests' model writer)

from localspec.core.engine import Engine  # noqa: E402
from localspec.core.load import filler_token  # noqa: E402
from localspec.core.media import Embedded, Filler, ZeroRows  # noqa: E402
from localspec.core.params import SpeculativeParams  # noqa: E402
from localspec.core.sampling import SamplingParams  # noqa: E402
from localspec.llama.pictures import read_image  # noqa: E402

PROMPTS = ("the man said", "once upon a time", "in the water the", "she looked at the")


def acceptance(engine: Engine, reader, temperature: float, k: int) -> str:
    """Accepted / drafted over every prompt and picture, the draft reading pictures with `reader` (None: no picture)."""
    draft = next(c for c in engine.caches if c is not engine.target)
    spec = SpeculativeParams(draft_max=k, adaptive=False)
    accepted = drafted = 0
    for i, text in enumerate(PROMPTS):
        for seed in range(3):
            if reader is None:
                tokens = engine.tokenize(text + " and then")
            else:
                draft.media = reader
                image = engine.image_tokens(read_image(png_bytes(random_pixels(10 * i + seed))))
                tokens = [*engine.tokenize(text + " "), *image, *engine.tokenize(" and then", add_special=False)]
            sampling = SamplingParams(temperature=temperature, seed=seed)
            gen = engine.generate(tokens, sampling=sampling, spec=spec, max_tokens=48)
            for _ in gen:
                pass
            accepted, drafted = accepted + gen.stats.accepted, drafted + gen.stats.drafted
    return f"{100 * accepted / max(drafted, 1):.0f}% ({accepted}/{drafted})"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    work = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="localspec-image-acceptance-"))
    vision = write_tiny_vision(work)
    engine = Engine.load(
        vision.target, vision.draft, mmproj=str(vision.mmproj), drafter="model", n_ctx=1024, n_threads=1, cache_ram=0
    )
    try:
        draft = next(c for c in engine.caches if c is not engine.target)
        readers = {
            "text": None,
            "blank": Filler(filler_token(draft.ctx.model)),
            "zeros": ZeroRows(engine.media),
            "embeddings": Embedded(engine.media),
        }
        for temperature in (0.0, 1.0):
            for k in (2, 4):
                row = ", ".join(f"{name} {acceptance(engine, r, temperature, k)}" for name, r in readers.items())
                print(f"T {temperature:g} k={k}: {row}", flush=True)
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
