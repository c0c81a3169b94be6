"""The chat names the target's own MTP head: loading a target that carries one picks the drafter `mtp`, and the
stats panel shows it with the pre-flight's note; F2 lists a models.toml pair that is a target alone and loads it."""

from __future__ import annotations

import dataclasses

import pytest
from support.tinymodels import write_mtp_model
from support.tui import send, wait_ready, wait_until
from textual.widgets import DataTable

from localspec.models.resolved import ResolvedPair
from localspec.tui.app import make_app
from localspec.tui.live import StatsView
from localspec.tui.loading import load_models
from localspec.tui.screens import PairScreen
from localspec.tui.settings import ChatOptions
from localspec.tui.widgets import StatsPanel, render_stats


def test_the_chat_loads_the_head_and_the_panel_names_it(tmp_path):
    target = write_mtp_model(tmp_path / "tiny-mtp.gguf")
    loaded = load_models(ChatOptions(n_ctx=256), ResolvedPair.files(target, None), None, lambda _: None)
    try:
        assert loaded.drafter == "mtp"
        view = StatsView(drafter=loaded.drafter, draft_max=8, drafting_note=loaded.engine.drafting_note)
        panel = render_stats(view).plain
    finally:
        loaded.engine.close()
    assert "drafter       mtp\n" in panel and "draft length  adaptive ≤ 8\n" in panel
    assert "draft head: 1 MTP layer (the target drafts for itself)" in panel


@pytest.mark.anyio
@pytest.mark.slow
async def test_f2_lists_a_target_alone_and_switching_to_it_drafts_with_its_head(options, chat_home, tmp_path):
    """A models.toml pair with no draft: F2 says its target carries an MTP head, Enter loads it, the head drafts and
    the stats panel names it."""
    target = write_mtp_model(tmp_path / "tiny-mtp.gguf", seed=1)
    with chat_home.config_file.open("a", encoding="utf-8") as f:
        f.write(f'[pairs."mtp-alone"]\ndescription = "its own head"\ntarget = {{ path = "{target}" }}\n')
        f.write("temperature = 0.0\nn_ctx = 512\n")
    app = make_app(dataclasses.replace(options, max_tokens=24))
    async with app.run_test(size=(110, 36)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f2")
        await wait_until(pilot, lambda: isinstance(app.screen, PairScreen), what="the pair list")
        table = app.screen.query_one(DataTable)
        rows = {str(table.get_row_at(i)[1]): [str(c) for c in table.get_row_at(i)] for i in range(table.row_count)}
        assert rows["mtp-alone"][2] == "downloaded, MTP head" and rows["tiny"][2] == "downloaded"
        table.move_cursor(row=list(rows).index("mtp-alone"))
        await pilot.press("enter")
        await wait_until(
            pilot, lambda: app.chat.loaded is not None and app.chat.loaded.pair.name == "mtp-alone", what="the switch"
        )
        assert app.chat.loaded.drafter == "mtp" and app.chat.loaded.pair.draft is None
        await send(pilot, "the man said that the water")
        panel = str(app.query_one(StatsPanel).render())
        assert "drafter       mtp" in panel and "draft head: 1 MTP layer (the target drafts for itself)" in panel
        assert app.chat.last_turn is not None and app.chat.last_turn.drafted > 0
