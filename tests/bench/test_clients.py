"""`bench --clients`: several clients at once against `localspec serve --parallel N` (its real server, in a process
of its own, on the tiny pair) and llama-server `-np N` plainly and with the draft (the fake llama-server of
tests/support/fakepeer.py: how each starts is checked, and its speed is known in advance)."""

from __future__ import annotations

import json

import pytest
from support.benchrun import bench_tiny
from support.fakepeer import SPEEDS, starts, write_fake_peer

from localspec.cli.main import main


def bench_clients(capsys, tiny_models, *extra: str) -> tuple[int, str, str]:
    return bench_tiny(capsys, tiny_models, "--chat-template", "chatml", "--tokens", "6", "--rounds", "1",
                      "--threads", "1", *extra)  # fmt: skip


@pytest.mark.slow
def test_clients_at_once_against_llama_servers_slots_plain_and_with_its_draft(
    tiny_models, capsys, localspec_home, tmp_path
):
    peer, log = write_fake_peer(tmp_path)
    code, out, err = bench_clients(
        capsys, tiny_models, "--clients", "1,3", "--parallel", "2", "--peer", str(peer), "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    rows = {(row["server"], row["clients"]): row for row in report["rows"]}
    servers = ["localspec --parallel 2", "llama-server -np 2", "llama-server -np 2 -md"]
    assert set(rows) == {(s, c) for s in servers for c in (1, 3)}
    for (server, clients), row in rows.items():
        assert row["tokens_per_second"] > 0 and row["latency"] > 0
        ours = rows[("localspec --parallel 2", clients)]["tokens_per_second"]
        expected = None if server.startswith("localspec") else ours / row["tokens_per_second"]
        assert row["ratio"] == pytest.approx(expected)
    # the fake answers one request at a time at its plain speed: one client's tok/s is about it
    plain = SPEEDS[("", None, False)][0]
    assert 0.5 * plain < rows[("llama-server -np 2", 1)]["tokens_per_second"] <= plain
    started = starts(log)
    assert len(started) == 2 and all(args[args.index("-np") + 1] == "2" for args in started)
    assert all("--kv-unified" in args for args in started)  # one pool for the slots, as localspec's
    assert ["-md" in args for args in started] == [False, True]
    assert all(args[args.index("--chat-template") + 1] == "chatml" for args in started)
    assert report["parallel"] == 2 and report["tokens"] == 6


def test_the_table_names_each_server_and_its_ratio(tiny_models, capsys, localspec_home):
    code, out, err = bench_clients(capsys, tiny_models, "--clients", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert any(line.split()[:4] == ["localspec", "--parallel", "2", "2"] for line in lines)
    assert "llama-server" not in out  # no --peer: localspec alone


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--clients", "0,2"], "--clients 0,2: each client count must be 1 to 64"),
        (["--clients", "2", "--parallel", "0"], "--parallel 0 is out of range"),
        (["--parallel", "4"], "--parallel goes with --clients"),
        (["--clients", "two"], "--clients takes a comma-separated list"),
    ],
)
def test_bad_clients_flags_are_one_line(tiny_models, capsys, localspec_home, flags, message):
    code, _, err = bench_clients(capsys, tiny_models, *flags)
    assert code != 0 and message in err and "Traceback" not in err


def test_a_server_that_refuses_the_slots_is_one_line(tiny_models, capfd, localspec_home):
    """`--parallel` above 1 on a model whose cache cannot drop a tail (a recurrent target) is refused by the server at
    start: its one line, then the bench's, and no traceback from either process."""
    code = main(["bench", "--target", str(tiny_models.recurrent), "--chat-template", "chatml", "--clients", "2",
                 "--tokens", "4", "--rounds", "1", "--threads", "1"])  # fmt: skip
    _, err = capfd.readouterr()
    assert code != 0 and "Traceback" not in err, err
    assert "localspec serve: error: --parallel above 1 needs a model whose cache can drop a tail" in err
    assert "localspec serve exited at start (code 2)" in err


@pytest.mark.slow
def test_structured_clients_run_beside_a_server_whose_grammar_streams_draft_alone(smollm2_path, capsys, localspec_home):
    """`--structured`: every request asks for a JSON schema's answer, and the yardstick — the same server with requests
    under a grammar drafting only alone (LOCALSPEC_SHARED_DRAFTS=off) — runs beside, its ratio in the table."""
    code = main(["bench", "--target", str(smollm2_path), "--draft", str(smollm2_path), "--clients", "2", "--structured",
                 "--tokens", "12", "--rounds", "1", "--threads", "1", "--json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["structured"] is True
    rows = {row["server"]: row for row in report["rows"]}
    assert set(rows) == {"localspec --parallel 2", "localspec --parallel 2, grammar drafts alone"}
    ours = rows["localspec --parallel 2"]["tokens_per_second"]
    yardstick = rows["localspec --parallel 2, grammar drafts alone"]
    assert yardstick["tokens_per_second"] > 0 and yardstick["ratio"] == pytest.approx(
        ours / yardstick["tokens_per_second"]
    )


def test_the_ratio_to_each_server_is_also_given_round_by_round():
    """A median over rounds hides their scatter (four structured clients gave 1.14–1.27× the yardstick from run to
    run): the report gives localspec's ratio to each server in each round, where the servers took turns."""
    from localspec.bench.clients import ClientsRow, rounds_lines

    rows = [
        ClientsRow("localspec --parallel 4", 4, 150.0, 1.8, None, (150.0, 180.0, 140.0)),
        ClientsRow("localspec --parallel 4, grammar drafts alone", 4, 130.0, 2.7, 150.0 / 130.0, (120.0, 150.0, 0.0)),
        ClientsRow("llama-server -np 4", 4, 100.0, 3.5, 1.5, (100.0,)),  # one round: nothing to scatter
        ClientsRow("localspec --parallel 4", 1, 100.0, 0.9, None, (100.0, 90.0, 95.0)),
    ]
    assert rounds_lines(rows) == [
        "localspec × localspec --parallel 4, grammar drafts alone, 4 clients, by round: 1.25, 1.20, –"
    ]
