#!/usr/bin/env python3
"""Set up a chat on the tiny thinking model, offline: the test suite's echo models that think before they answer
(Qwen3's real chat template; see tests/support/tinymodels.py), and a LOCALSPEC_HOME whose models.toml names them.

Usage: scripts/thinking_demo.py [DIR]        (default: ./thinking-demo)
Then run the command it prints, e.g. in tmux:
    LOCALSPEC_HOME=DIR/home localspec chat --pair thinking
The model always writes "<think> We must give them a kind word first.</think>" then "Hello world!"; its draft agrees
on the thinking and proposes another word after "Hello", so the stats panel's thinking and answer columns differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.tinymodels import write_thinking_models  # noqa: E402  (the tests' model writer)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "thinking-demo").resolve()
    (out / "models").mkdir(parents=True, exist_ok=True)
    models = write_thinking_models(out / "models")
    home = out / "home"
    home.mkdir(exist_ok=True)
    (home / "models.toml").write_text(
        'default = "thinking"\n'
        f'[pairs.thinking]\ndescription = "a tiny model that thinks (offline demo)"\n'
        f'target = {{ path = "{models.target}" }}\ndraft = {{ path = "{models.draft}" }}\n'
        "temperature = 0.0\nn_ctx = 1024\ndraft_max = 4\n",
        encoding="utf-8",
    )
    print(f"LOCALSPEC_HOME={home} localspec chat --pair thinking --no-adaptive")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
