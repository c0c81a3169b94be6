"""`load_with_flags`, the one loader of a pair that `serve`'s runners and the chat's F2 switch share (issue 57):
another pair with the same flags drops the files and the projector given for the first; the chat's words and the
server's slots go through it."""

from __future__ import annotations

import dataclasses

from localspec.models.flags import RunFlags
from localspec.models.loading import PairLoad, load_with_flags, switched
from localspec.tui.loading import load_models
from localspec.tui.settings import ChatOptions


def test_a_switch_drops_the_startup_projector_and_files(tiny_models):
    flags = RunFlags(pair="tiny", mmproj="/nowhere/mmproj.gguf", n_ctx=256)
    assert switched(flags, None) is flags and switched(flags, "tiny") is flags  # the same pair keeps its --mmproj
    other = switched(flags, "tiny-same")
    assert (other.pair, other.mmproj, other.target, other.draft, other.n_ctx) == ("tiny-same", None, None, None, 256)
    files = RunFlags(target=str(tiny_models.target), draft=str(tiny_models.draft_noisy), mmproj="/nowhere/p.gguf")
    assert (switched(files, "tiny").target, switched(files, "tiny").mmproj) == (None, None)


def test_the_chat_switch_loads_the_other_pair_without_the_startup_mmproj(chat_home):
    options = ChatOptions(pair="tiny", mmproj="/nowhere/mmproj.gguf", n_ctx=256, paths=chat_home)
    said: list[str] = []
    loaded = load_models(options, None, None, said.append, pair="tiny-same")
    try:
        assert loaded.pair.name == "tiny-same" and loaded.pair.mmproj is None and loaded.engine.media is None
        assert said[-1].startswith("loading ") and " + " in said[-1]  # the chat's words: target + draft
    finally:
        loaded.engine.close()


def test_the_loader_tells_before_and_takes_the_servers_slots(chat_home):
    seen: list[PairLoad] = []
    flags = RunFlags(n_ctx=256, drafter="ngram")
    loaded = load_with_flags(flags, chat_home, pair="tiny-same", n_seq=2, before=seen.append)
    try:
        assert [p.name for p in seen] == ["tiny-same"] and seen[0].engine is None
        assert loaded.name == "tiny-same" and loaded.params.n_seq == 2 and loaded.engine is not None
        assert loaded.engine.target.ctx.n_seq == 2
        assert dataclasses.replace(loaded, engine=None) == seen[0]
    finally:
        assert loaded.engine is not None
        loaded.engine.close()
