"""The chat names a Gemma 4 assistant: a pair whose draft is an assistant sidecar loads the drafter `assistant`, and
the stats panel shows it with the pre-flight's note."""

from __future__ import annotations

from localspec.models.resolved import ResolvedPair
from localspec.tui.live import StatsView
from localspec.tui.loading import load_models
from localspec.tui.settings import ChatOptions
from localspec.tui.widgets import render_stats


def test_the_chat_loads_the_assistant_and_the_panel_names_it(tiny_gemma4):
    pair = ResolvedPair.files(tiny_gemma4.target, tiny_gemma4.assistant)
    loaded = load_models(ChatOptions(n_ctx=256), pair, None, lambda _: None)
    try:
        assert loaded.drafter == "assistant"
        view = StatsView(drafter=loaded.drafter, draft_max=8, drafting_note=loaded.engine.drafting_note)
        panel = render_stats(view).plain
    finally:
        loaded.engine.close()
    assert "drafter       assistant\n" in panel
    assert "draft: mtp-gemma4.gguf, a Gemma 4 assistant reading the target's states" in panel
