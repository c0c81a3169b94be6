"""`bench --agents`: agents taking turns with long system prompts against `localspec serve` (its real server, in a
process of its own, on the tiny pair) and llama-server plainly and with the draft (the fake llama-server of
tests/support/fakepeer.py, whose prompt cache keeps every earlier prompt and whose counts are logged)."""

from __future__ import annotations

import json
import statistics

import pytest
from support.benchrun import bench_tiny
from support.fakepeer import starts, streamed_requests, write_fake_peer

from localspec.bench.agents import conversation, system_prompt

WORDS, ROUNDS, AGENTS = 40, 3, 2


def bench_agents(capsys, tiny_models, *extra: str) -> tuple[int, str, str]:
    return bench_tiny(capsys, tiny_models, "--chat-template", "chatml", "--threads", "1", *extra)


@pytest.mark.slow
def test_agents_take_turns_against_llama_servers_plain_and_with_its_draft(
    tiny_models, capsys, localspec_home, tmp_path
):
    peer, log = write_fake_peer(tmp_path)
    code, out, err = bench_agents(
        capsys, tiny_models, "--agents", str(AGENTS), "--prompt-words", str(WORDS), "--rounds", str(ROUNDS),
        "--peer", str(peer), "--json",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    rows = {(row["workload"], row["server"]): row for row in report["rows"]}
    servers = ["localspec --parallel 1", "llama-server -np 1", "llama-server -np 1 -md"]
    assert list(rows) == [(w, s) for w in ("turns", "cold prompt") for s in servers], report["notes"]
    for (workload, server), row in rows.items():
        assert row["requests"] == (AGENTS * (ROUNDS - 1) if workload == "turns" else AGENTS + ROUNDS)
        assert 0 < row["first_token"] <= row["seconds"]
        ours = rows[(workload, "localspec --parallel 1")]
        local = server.startswith("localspec")
        assert row["ratio"] == (None if local else pytest.approx(ours["seconds"] / row["seconds"]))
        assert row["first_token_ratio"] == (None if local else pytest.approx(ours["first_token"] / row["first_token"]))
        assert (row["restored"] is None) != local  # localspec says what came from RAM; llama-server does not

    # what the fake llama-server was sent: after the warm-up, the agents in turn, round by round, then the cold prompts
    started = starts(log)
    assert len(started) == 2 and all(args[args.index("-np") + 1] == "1" for args in started)
    sent = [r for r in streamed_requests(log) if r["args"] == started[0]][1:]
    turns, colds = sent[: AGENTS * ROUNDS], sent[AGENTS * ROUNDS :]
    assert [r["messages"] for r in turns] == [conversation(i % AGENTS, i // AGENTS, WORDS) for i in range(len(turns))]
    systems = [r["messages"][0]["content"] for r in sent]
    assert len(colds) == ROUNDS and len(set(systems)) == AGENTS + ROUNDS  # a fresh system prompt each cold request
    for earlier, later in zip(turns, turns[AGENTS:], strict=False):  # each agent's next turn: all but its last message
        assert earlier["messages"][0] == later["messages"][0] and earlier["messages"][1] != later["messages"][1]
        # its cache keeps the role, the system prompt, the role and the message's first word ("Step 2: …")
        assert later["cache_n"] == 1 + WORDS + 1 + 1 and later["prompt_n"] == 7
    # the report's counts are the ones the server answered with
    fake_turns = rows[("turns", "llama-server -np 1")]
    assert fake_turns["cache_n"] == statistics.median(r["cache_n"] for r in turns[AGENTS:])
    assert fake_turns["prompt_n"] == statistics.median(r["prompt_n"] for r in turns[AGENTS:])
    assert rows[("cold prompt", "llama-server -np 1")]["cache_n"] <= 4  # "system You are agent" at most

    # localspec's one slot goes from agent to agent: each turn restores the agent's prompt from its prompt cache
    ours = rows[("turns", "localspec --parallel 1")]
    assert ours["cache_n"] >= ours["restored"] > 0.7 * (ours["cache_n"] + ours["prompt_n"]), ours
    cold = rows[("cold prompt", "localspec --parallel 1")]
    assert cold["prompt_n"] > 5 * cold["cache_n"], cold
    assert report["agents"] == AGENTS and report["words"] == WORDS and report["tokens"] == 4


def test_without_localspecs_prompt_cache_each_turn_reads_its_prompt_again(tiny_models, capsys, localspec_home):
    """The negative control of the restored column: `--cache-ram 0` (no prompt cache) leaves a turn only the chat
    template's first tokens, which both agents share; the table says so."""
    code, out, err = bench_agents(
        capsys, tiny_models, "--agents", "2", "--prompt-words", str(WORDS), "--rounds", "2", "--cache-ram", "0"
    )
    assert code == 0, err
    turns = next(line.split() for line in out.splitlines() if line.startswith("turns "))
    assert turns[1:4] == ["localspec", "--parallel", "1"]
    read, cached, restored = (int(x) for x in turns[-3:])
    assert restored == 0 and read > 5 * cached, out
    assert "cold prompt  localspec --parallel 1" in out and "llama-server" not in out


def test_each_agents_system_prompt_is_its_own_and_long():
    first, again, other = system_prompt(56, 1200), system_prompt(56, 1200), system_prompt(57, 1200)
    assert first == again != other and len(first.split()) == len(other.split()) == 1200
    assert len(set(first.split())) > 100  # words, not one word repeated


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--agents", "0"], "--agents 0 is out of range"),
        (["--agents", "2", "--rounds", "1"], "--agents needs --rounds ≥ 2"),
        (["--agents", "2", "--prompt-words", "5"], "--prompt-words 5 is out of range"),
        (["--prompt-words", "100"], "--prompt-words goes with --agents"),
        (["--agents", "2", "--clients", "2"], "--agents writes its own prompts and runs alone"),
        (["--agents", "2", "--parallel", "0"], "--parallel 0 is out of range"),
    ],
)
def test_bad_agents_flags_are_one_line(tiny_models, capsys, localspec_home, flags, message):
    code, _, err = bench_agents(capsys, tiny_models, *flags)
    assert code != 0 and message in err and "Traceback" not in err


def test_a_prompt_past_the_context_is_the_servers_one_line(tiny_models, capsys, localspec_home):
    code, _, err = bench_agents(capsys, tiny_models, "--agents", "2", "--prompt-words", "400", "--n-ctx", "256")
    assert code != 0 and "Traceback" not in err, err
    assert "the server refused a chat request (400): the " in err and "but the context holds 256" in err
