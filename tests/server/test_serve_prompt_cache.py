"""`serve --cache-dir` in a terminal (issue 63): what goes wrong with the prompt cache on disk reaches the user's
terminal, not only the log file — one line per cause, however many files it concerns (the rest in the log)."""

from __future__ import annotations

import pytest
from support.server import start_server, write_home

from localspec.core.promptdisk import SUFFIX


@pytest.mark.slow
def test_damaged_cache_files_are_one_line_on_the_terminal(tmp_path, tiny_models):
    m = tiny_models
    home = write_home(tmp_path / "home", m.target, m.draft_noisy, m.draft_same)
    cache = tmp_path / "cache"
    cache.mkdir()
    for i in range(3):  # what a crash of another program, or a full disk long ago, could leave
        (cache / f"{i:032x}{SUFFIX}").write_bytes(b"LSPROMPT and then nothing that makes sense")
    server = start_server(home, "--parallel", "1", "--cache-dir", str(cache))
    try:
        assert server.healthy()
    finally:
        server.stop()
    said = [line for line in server.stderr().splitlines() if "prompt cache" in line]
    assert len(said) == 1, server.stderr()
    assert f"prompt cache: removed {cache}/" in said[0] and "its prompt is read again" in said[0], said[0]
    assert server.log().count("prompt cache: removed") == 3  # each in the log file
    assert not list(cache.glob("*" + SUFFIX)) and "Traceback" not in server.stderr()
