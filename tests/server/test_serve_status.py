"""`localspec serve --status` (issue 57): a running server's pairs as a table — loaded ones with their memory,
slots and queue, then those it could load; no server there is one line on stderr and exit code 1."""

from __future__ import annotations

import pytest
from support.server import free_port, start_server, write_home

from localspec.cli.main import main


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_models):
    m = tiny_models
    home = write_home(tmp_path_factory.mktemp("status-home"), m.target, m.draft_noisy, m.draft_same)
    running = start_server(home, "--parallel", "2", "--api-key", "sesame")
    yield running
    running.stop()
    assert "Traceback" not in running.stderr()


def _status(capsys, *args: str) -> tuple[int, list[str], str]:
    code = main(["serve", "--status", *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_status_names_the_loaded_pair_its_slots_and_the_available_ones(server, localspec_home, capsys):
    code, lines, err = _status(capsys, "--port", str(server.port), "--api-key", "sesame")
    assert code == 0 and err == ""
    assert lines[0] == f"localspec serve on http://127.0.0.1:{server.port}: ok, default pair tiny"
    assert lines[1].split() == ["PAIR", "STATE", "MEMORY", "SLOTS", "QUEUE"]
    name, state, *memory, slots, queue = lines[2].split()
    assert (name, state, slots, queue) == ("tiny", "loaded", "0/2", "0")
    assert memory[-1] in ("MiB", "GiB")
    assert lines[3:] == ["available: tiny-same"]


def test_status_without_the_key_still_shows_the_loaded_pairs(server, localspec_home, capsys):
    code, lines, _ = _status(capsys, "--port", str(server.port))
    assert code == 0 and lines[2].split()[:2] == ["tiny", "loaded"]
    assert lines[-1] == "available: give the server's --api-key to list them"


def test_status_with_no_server_is_one_line_and_exit_1(localspec_home, capsys):
    port = free_port()
    code, lines, err = _status(capsys, "--port", str(port))
    assert code == 1 and lines == []
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"localspec serve: no localspec server answers on http://127.0.0.1:{port}")
