"""Helpers for the chat app's Pilot tests: waiting for workers, building the app on the tiny pair."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from textual.pilot import Pilot

from localspec.core.params import PairDefaults
from localspec.tui.conversation import Phase

PAIR_SETTINGS = PairDefaults(temperature=0.0)  # the tiny pairs' defaults in Conversation tests


def roles(conv) -> list[str]:
    """The roles of a `Conversation`'s messages, in order."""
    return [m.role for m in conv.messages]


def saved(conv) -> list[tuple[str, str]]:
    """(role, content) of every message the `Conversation` saved in its store."""
    return [(m.role, m.content) for m in conv.store.messages(conv.saved_id)]


async def wait_until(
    pilot: Pilot, predicate: Callable[[], object], *, timeout: float = 60.0, what: str = "condition"
) -> None:
    """Pause the pilot until `predicate()` is true (a worker posted what we wait for), or fail after timeout."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await pilot.pause(0.02)


async def wait_ready(pilot: Pilot) -> None:
    """Wait until the models are loaded and no answer is being generated."""
    app = pilot.app
    await wait_until(
        pilot,
        lambda: app.chat.session is not None and app.chat.phase is not Phase.LOADING and app.chat.turn is None,
        what="the app to be ready",
    )


async def send(pilot: Pilot, text: str) -> None:
    """Type-free send: put `text` in the prompt box, press Enter, and wait for the whole answer."""
    from localspec.tui.widgets import PromptInput

    app = pilot.app
    before = app.chat.turn_ids
    app.query_one(PromptInput).text = text
    await pilot.press("enter")
    await wait_until(pilot, lambda: app.chat.turn_ids > before, what="the turn to start")
    await wait_until(pilot, lambda: app.chat.turn is None, what="the answer to end")
    await pilot.pause()


async def open_settings(pilot: Pilot) -> None:
    """Press F3 and wait for the settings screen."""
    from localspec.tui.screens import SettingsScreen

    await pilot.press("f3")
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, SettingsScreen), what="the settings screen")


def record_notifications(app) -> list[str]:
    """Every message the app notifies from now on (toasts expire; this list does not)."""
    seen: list[str] = []
    notify = app.notify

    def recording(message, *args, **kwargs):
        seen.append(str(message))
        return notify(message, *args, **kwargs)

    app.notify = recording
    return seen


def hold_answers(monkeypatch) -> threading.Event:
    """Make each answer wait after its first chunk until the returned event is set (it starts set: clear it before
    the answer that must still stream when the test acts). The tiny pair writes 1,800 tokens in about a second, and
    at the chat's 2 % frame budget its text may first show near the end, so keys or resizes meant for a streaming
    answer came after it. The wait is on the engine thread, between two chunks, where a slow model would be."""
    from localspec.tui import chat_screen
    from localspec.tui.live import Chunk

    held, stream = threading.Event(), chat_screen.stream_generation
    held.set()

    def stream_held(generation, emit, **kwargs):
        def emit_held(item):
            emit(item)
            if isinstance(item, Chunk):
                held.wait(timeout=60)

        stream(generation, emit_held, **kwargs)

    monkeypatch.setattr(chat_screen, "stream_generation", stream_held)
    return held
