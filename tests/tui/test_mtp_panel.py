"""The chat names the target's own MTP head: loading a target that carries one picks the drafter `mtp`, and the
stats panel shows it with the pre-flight's note."""

from __future__ import annotations

from support.tinymodels import write_mtp_model

from localspec.models.resolved import ResolvedPair
from localspec.tui.live import StatsView
from localspec.tui.loading import load_models
from localspec.tui.settings import ChatOptions
from localspec.tui.widgets import render_stats


def test_the_chat_loads_the_head_and_the_panel_names_it(tmp_path):
    target = write_mtp_model(tmp_path / "tiny-mtp.gguf")
    loaded = load_models(ChatOptions(n_ctx=256), ResolvedPair.files(target, None), None, lambda _: None)
    try:
        assert loaded.drafter == "mtp"
        view = StatsView(drafter=loaded.drafter, draft_max=8, drafting_note=loaded.engine.drafting_note)
        panel = render_stats(view).plain
    finally:
        loaded.engine.close()
    assert "drafter       mtp, max 8 adaptive" in panel
    assert "draft head: 1 MTP layer (the target drafts for itself)" in panel
