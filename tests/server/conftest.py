"""Fixtures shared by the server's test modules: SmolLM2 served drafting for itself (a real tokenizer and template,
every draft accepted at T 0), one server per module, and Anthropic's client on it."""

from __future__ import annotations

import anthropic
import pytest
from support.server import start_server, write_smol_home


@pytest.fixture(scope="module")
def smol_server(smollm2_path, tmp_path_factory):
    """`localspec serve` on SmolLM2 (k = 4, fixed), one per test module, stopped with no traceback."""
    home = write_smol_home(tmp_path_factory.mktemp("smol-home"), smollm2_path)
    running = start_server(home, "--draft-max", "4", "--no-adaptive")
    yield running
    running.stop()
    assert "Traceback" not in running.stderr()


@pytest.fixture
def smol_claude(smol_server):
    """Anthropic's real client on `smol_server`."""
    return anthropic.Anthropic(
        base_url=f"http://127.0.0.1:{smol_server.port}", api_key="none", max_retries=0, timeout=120
    )
