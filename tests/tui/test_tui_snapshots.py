"""Snapshot tests (pytest-textual-snapshot) of the chat app's main screens.

The pictures must not change from run to run: a fixed terminal size, no cursor blink, a saved conversation
with fixed timestamps and stats, a fixed stats panel, notifications cleared, a models.toml whose pair
list does not depend on what the machine has downloaded, and the CPU placement whatever GPU the machine has.
The app still loads the REAL tiny pair.
Update after an intended change with `pytest tests/tui/test_tui_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import pytest
from support.tui import wait_ready, wait_until

from localspec.core.stats import Stats
from localspec.tui.app import make_app
from localspec.tui.settings import ChatOptions
from localspec.tui.store import ChatStore

SIZE = (110, 34)
RUNS = [  # the saved answer as (text, came from the draft) runs
    ("Speculative decoding lets a ", True),
    ("**small draft model** ", False),
    ("propose tokens that the target checks in one pass.\n\n", True),
    ('```python\nfor token in generation:\n    print(token.text, end="")\n```\n\n', False),
    ("Accepted tokens cost one target pass ", True),
    ("for several tokens.", False),
]
ANSWER = "".join(text for text, _ in RUNS)


def fixed_stats() -> Stats:
    """A turn's stats with round numbers (no clock reading)."""
    return Stats(
        prompt_tokens=40,
        drafted=120,
        accepted=84,
        rejections=30,
        target_passes=45,
        emitted=129,
        drafted_by_position=[30, 30, 30, 30],
        accepted_by_position=[27, 23, 19, 15],
        draft_length=4,
        seconds=2.5,
        seconds_prefill=0.5,
        seconds_draft=0.5,
        seconds_verify=1.2,
        seconds_sampling=0.3,
    )


@pytest.fixture
def snapshot_home(chat_home, tmp_path, monkeypatch):
    """chat_home with no bundled pairs (the pair list is only the test's) and one saved conversation; the pair is
    planned as on a build without a GPU, so that the pair screen's placement line does not hold this machine's free
    GPU memory."""
    from localspec.core import load

    monkeypatch.setattr(load, "local_gpu", lambda gpu_memory=None: None)
    bundled = tmp_path / "bundled.toml"
    bundled.write_text("", encoding="utf-8")
    store = ChatStore(chat_home.db_path)
    cid = store.create_conversation("What is speculative decoding?", pair="tiny")
    store.add_message(cid, "user", "What is speculative decoding? Show a loop.")
    store.add_message(
        cid,
        "assistant",
        ANSWER,
        finish_reason="stop",
        provenance=RUNS,
        stats={**fixed_stats().to_dict(), "tokens_per_second": 64.5},
    )
    other = store.create_conversation("A shorter chat", pair="tiny-same")
    store.add_message(other, "user", "Hi")
    with store.db:
        store.db.execute(
            "UPDATE conversations SET created = '2025-05-01T09:00:00+00:00', "
            "updated = '2025-05-0' || id || 'T10:30:00+00:00'"
        )
    store.close()
    return cid


def app_for_snapshot(tmp_path):
    options = ChatOptions(
        pair="tiny", cursor_blink=False, export_dir=tmp_path, max_tokens=64, bundled_config=tmp_path / "bundled.toml"
    )
    return make_app(options)


def resumed(cid: int, *keys: str):
    """A run_before that waits for the models, opens the saved chat, fixes the stats and presses keys."""

    async def run_before(pilot) -> None:
        app = pilot.app
        await wait_ready(pilot)
        await app.screen.resume(cid)
        app.chat.last_turn, app.chat.session_stats, app.chat.answers = fixed_stats(), fixed_stats(), 1
        app.screen.draw_stats()
        for key in keys:
            await pilot.press(key)
        app.clear_notifications()
        await pilot.pause()

    return run_before


def test_chat_screen(snap_compare, snapshot_home, tmp_path):
    assert snap_compare(app_for_snapshot(tmp_path), terminal_size=SIZE, run_before=resumed(snapshot_home))


def test_chat_screen_with_draft_tokens_coloured(snap_compare, snapshot_home, tmp_path):
    assert snap_compare(app_for_snapshot(tmp_path), terminal_size=SIZE, run_before=resumed(snapshot_home, "ctrl+t"))


def test_settings_screen(snap_compare, snapshot_home, tmp_path):
    assert snap_compare(app_for_snapshot(tmp_path), terminal_size=SIZE, run_before=resumed(snapshot_home, "f3"))


def test_pair_switcher(snap_compare, snapshot_home, tmp_path):
    assert snap_compare(app_for_snapshot(tmp_path), terminal_size=SIZE, run_before=resumed(snapshot_home, "f2"))


@pytest.mark.slow
def test_saved_chats(snap_compare, snapshot_home, tmp_path):
    async def run_before(pilot) -> None:
        await resumed(snapshot_home)(pilot)
        await pilot.press("f4")
        await wait_until(pilot, lambda: pilot.app.screen.query("DataTable"), what="the saved chats")
        await pilot.pause()

    assert snap_compare(app_for_snapshot(tmp_path), terminal_size=SIZE, run_before=run_before)


THINKING = "The user greets me.\nWe must give them a kind word first, then the answer."


@pytest.fixture
def thinking_snapshot_home(thinking_home, tmp_path):
    """thinking_home with no bundled pairs and one saved chat on the thinking pair whose answer thought first."""
    (tmp_path / "bundled.toml").write_text("", encoding="utf-8")
    store = ChatStore(thinking_home.db_path)
    cid = store.create_conversation("Hi", pair="thinking")
    store.add_message(cid, "user", "Hi")
    parts = fixed_parts()
    store.add_message(
        cid,
        "assistant",
        "Hello world! How can I help?",
        finish_reason="stop",
        provenance=[("Hello", True), (" world!", False), (" How can I help?", True)],
        stats={**fixed_stats().to_dict(), "parts": {k: v.to_dict() for k, v in parts.items()}},
        reasoning=THINKING,
        reasoning_provenance=[(THINKING[:30], True), (THINKING[30:], False)],
    )
    with store.db:
        store.db.execute("UPDATE conversations SET created = '2025-05-01T09:00:00+00:00', updated = created")
    store.close()
    return cid


def fixed_parts():
    from localspec.core.thinking import PartStats

    return {
        "thinking": PartStats(tokens=96, drafted=90, accepted=72, passes=30.0),
        "answer": PartStats(tokens=33, drafted=30, accepted=12, passes=15.0),
    }


def thinking_resumed(cid: int, *keys: str):
    async def run_before(pilot) -> None:
        await resumed(cid)(pilot)
        pilot.app.chat.last_parts = fixed_parts()
        pilot.app.screen.draw_stats()
        for key in keys:
            await pilot.press(key)
        pilot.app.clear_notifications()
        await pilot.pause()

    return run_before


def thinking_app(tmp_path):
    options = ChatOptions(
        pair="thinking",
        cursor_blink=False,
        export_dir=tmp_path,
        max_tokens=64,
        bundled_config=tmp_path / "bundled.toml",
    )
    return make_app(options)


def test_chat_screen_with_folded_thinking(snap_compare, thinking_snapshot_home, tmp_path):
    run_before = thinking_resumed(thinking_snapshot_home)
    assert snap_compare(thinking_app(tmp_path), terminal_size=SIZE, run_before=run_before)


@pytest.mark.slow
def test_settings_screen_with_the_thinking_switch(snap_compare, thinking_snapshot_home, tmp_path):
    run_before = thinking_resumed(thinking_snapshot_home, "f3")
    assert snap_compare(thinking_app(tmp_path), terminal_size=SIZE, run_before=run_before)
