#!/usr/bin/env python3
"""Write a tiny image-reading pair, offline: `target.gguf` (a random-weight llama, n_embd 64), `draft.gguf` (the
target plus noise, the same vocabulary: a same-tokenizer pair) and `mmproj.gguf` (a LLaVA-style projector that
llama.cpp's mtmd opens beside the target), with the test suite's writer (tests/support/tinyvision.py).

Usage: scripts/make_tiny_vision.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.tinyvision import write_vision_trio  # noqa: E402  (the tests' model writer)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    for path in write_vision_trio(Path(argv[0])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
