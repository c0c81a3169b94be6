"""`localspec serve --status` (issue 57): a running server's pairs as a table — loaded ones with their memory,
slots and queue (or the pair a load waits for), then those it could load and those whose files are damaged, with the
fix; a key the server refuses is said to be wrong; no server there is one line on stderr and exit code 1."""

from __future__ import annotations

import pytest
from support.server import free_port, start_server, write_home

from localspec.cli.main import main


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_models):
    m = tiny_models
    home = write_home(tmp_path_factory.mktemp("status-home"), m.target, m.draft_noisy, m.draft_same)
    with (home / "models.toml").open("a", encoding="utf-8") as f:
        f.write(f'[pairs.broken]\ntarget = {{ path = "{m.truncated}" }}\n')  # here, but cut short
    running = start_server(home, "--parallel", "2", "--api-key", "sesame")
    yield running
    running.stop()
    assert "Traceback" not in running.stderr()


def _status(capsys, *args: str) -> tuple[int, list[str], str]:
    code = main(["serve", "--status", *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_status_names_the_loaded_pair_its_slots_and_the_available_ones(server, localspec_home, capsys, tiny_models):
    m = tiny_models
    code, lines, err = _status(capsys, "--port", str(server.port), "--api-key", "sesame")
    assert code == 0 and err == ""
    assert lines[0] == f"localspec serve on http://127.0.0.1:{server.port}: ok, default pair tiny"
    assert lines[1].split() == ["PAIR", "STATE", "MEMORY", "SLOTS", "QUEUE"]
    name, state, *memory, slots, queue = lines[2].split()
    assert (name, state, slots, queue) == ("tiny", "loaded", "0/2", "0")
    assert memory[-1] in ("MiB", "GiB")
    assert lines[3] == "available: tiny-same"  # not the damaged pair: it has a line of its own, with the fix
    assert len(lines) == 5 and lines[4].startswith("damaged: broken: the target truncated.gguf is truncated")
    assert lines[4].endswith(f"replace {m.truncated} (named in {server.home / 'models.toml'})")


def test_status_without_the_key_still_shows_the_loaded_pairs(server, localspec_home, capsys):
    code, lines, _ = _status(capsys, "--port", str(server.port))
    assert code == 0 and lines[2].split()[:2] == ["tiny", "loaded"]
    assert lines[-1] == "available: give the server's --api-key to list them"


def test_status_with_a_wrong_key_says_the_key_was_refused(server, localspec_home, capsys):
    code, lines, _ = _status(capsys, "--port", str(server.port), "--api-key", "open sesame")
    assert code == 0 and lines[2].split()[:2] == ["tiny", "loaded"]
    assert lines[-1] == "available: the server refused this --api-key (a wrong key): give the key it was started with"


def test_status_says_which_pair_a_waiting_load_waits_for():
    """A pair whose load waits for room under --max-loaded (its /health `waiting`): "waiting", and for whom."""
    from localspec.cli.serve import _status_table

    def pair(loaded: bool, waiting: dict | None) -> dict:
        slots = {"busy": int(loaded), "total": 1}
        return {"loaded": loaded, "loading": not loaded, "waiting": waiting, "memory": 0, "queue": 0, "slots": slots}

    waiting = {"for": "room", "limit": "--max-loaded 1", "pairs": ["tiny"]}
    health = {"status": "ok", "model": "tiny", "pairs": {"tiny": pair(True, None), "tiny-same": pair(False, waiting)}}
    lines = _status_table(health, {"data": []}, "http://127.0.0.1:8080").splitlines()
    assert lines[3].split() == ["tiny-same", "waiting", "-", "0/1", "0"]
    assert lines[4] == "tiny-same waits for room (--max-loaded 1): for tiny to finish and unload"


def test_status_with_no_server_is_one_line_and_exit_1(localspec_home, capsys):
    port = free_port()
    code, lines, err = _status(capsys, "--port", str(port))
    assert code == 1 and lines == []
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"localspec serve: no localspec server answers on http://127.0.0.1:{port}")
