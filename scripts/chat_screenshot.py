"""Write docs/chat.svg, the README's picture of the chat: the real app on the offline demo pair, one answer.

Runs the app headless through Textual's Pilot (as the tests do), in a LOCALSPEC_HOME of its own so that no saved
chat or setting of yours shows, asks one question, waits for the whole answer, turns draft colours on and saves
the screen as SVG. Not a test: the picture changes with the machine's speed (tok/s) and the model's draws.

    .venv/bin/python scripts/chat_screenshot.py [--size 110x34] [--out docs/chat.svg]

The demo pair's target is derived once into this script's home (about a minute, 540 MB under /tmp).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Write a Python function that adds two numbers, with a short explanation."


async def _wait(pilot, predicate, what: str, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def shoot(out: Path, size: tuple[int, int]) -> None:
    from localspec.tui.app import make_app
    from localspec.tui.conversation import Phase
    from localspec.tui.settings import ChatOptions
    from localspec.tui.widgets import PromptInput

    options = ChatOptions(pair="demo", cursor_blink=False, max_tokens=160, overrides={"seed": 1})
    app = make_app(options)
    async with app.run_test(size=size) as pilot:
        chat = app.chat
        await _wait(pilot, lambda: chat.session is not None and chat.phase is not Phase.LOADING, "the demo pair")
        app.query_one(PromptInput).text = QUESTION
        before = chat.turn_ids
        await pilot.press("enter")
        await _wait(pilot, lambda: chat.turn_ids > before, "the answer to start")
        await _wait(pilot, lambda: chat.turn is None, "the answer to end")
        await pilot.press("ctrl+t")
        app.clear_notifications()
        await pilot.pause(0.5)
        app.save_screenshot(filename=out.name, path=str(out.parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="110x34", help="columns x rows (default 110x34)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "chat.svg", help="the SVG to write")
    parser.add_argument("--home", type=Path, default=Path("/tmp/localspec-screenshot"), help="its LOCALSPEC_HOME")
    args = parser.parse_args()
    os.environ["LOCALSPEC_HOME"] = str(args.home)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT))
    columns, rows = (int(n) for n in args.size.split("x"))
    asyncio.run(shoot(args.out.resolve(), (columns, rows)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
