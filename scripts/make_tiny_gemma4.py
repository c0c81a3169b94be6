#!/usr/bin/env python3
"""Write a tiny Gemma 4 pair, offline: `gemma4.gguf` (a random-weight `gemma4` target, sliding-window and full layers)
and `mtp-gemma4.gguf` (its `gemma4-assistant` sidecar, which drafts from the target's hidden rows and KV cache), with
the test suite's writer (tests/support/tinygemma4.py). `localspec generate --target OUT_DIR/gemma4.gguf --draft
OUT_DIR/mtp-gemma4.gguf` then speculates with the assistant.

Usage: scripts/make_tiny_gemma4.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.tinygemma4 import write_gemma4_pair  # noqa: E402  (the tests' model writer)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    pair = write_gemma4_pair(out)
    print(pair.target)
    print(pair.assistant)
    return 0


if __name__ == "__main__":
    sys.exit(main())
