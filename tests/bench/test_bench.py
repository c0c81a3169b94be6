"""`localspec bench` on the real tiny pair: every setting runs, the table and --json hold finite ratios, greedy
divergences are reported with their top-2 gap, and a missing or broken peer is one note while the localspec
rows still print."""

from __future__ import annotations

import dataclasses
import json
import math
import stat

import numpy as np
import pytest

from localspec.cli.main import main
from localspec.core.params import SpeculativeParams
from localspec.core.sampling import SamplingParams

EXPECTED = {
    (0.0, "plain"),
    (0.0, "k=2"),
    (0.0, "k=3"),
    (0.0, "adaptive≤3"),
    (0.8, "plain"),
    (0.8, "k=2 pq"),
    (0.8, "k=3 pq"),
    (0.8, "adaptive≤3 pq"),
    (0.8, "k=2 match"),
    (0.8, "k=3 match"),
    (0.8, "adaptive≤3 match"),
}


def bench(capsys, tiny_models, *extra: str) -> tuple[int, str, str]:
    code = main(
        [
            "bench",
            "--target",
            str(tiny_models.target),
            "--draft",
            str(tiny_models.draft_noisy),
            "--tokens",
            "12",
            "--rounds",
            "1",
            "--k",
            "2,3",
            "--threads",
            "1",
            *extra,
        ]
    )
    out, err = capsys.readouterr()
    return code, out, err


def test_every_setting_runs_and_json_holds_finite_ratios(tiny_models, capsys, localspec_home):
    code, out, err = bench(capsys, tiny_models, "--json")
    assert code == 0, err
    report = json.loads(out)
    rows = {(r["temperature"], r["setting"]): r for r in report["rows"]}
    assert set(rows) == EXPECTED
    for (_, name), r in rows.items():
        for key in (
            "tokens_per_second",
            "ratio",
            "acceptance",
            "alpha",
            "tokens_per_pass",
            "draft_cost",
            "verify_cost",
            "predicted",
            "efficiency",
            "python_ms_per_step",
            "python_us_per_draft_token",
            "python_us_per_verify_step",
            "python_us_per_row",
        ):
            assert math.isfinite(r[key]), (name, key, r[key])
        assert r["tokens_per_second"] > 0 and r["ratio"] > 0
        assert len(r["per_prompt"]) == 4 and all(rate > 0 for rate in r["per_prompt"])  # the four built-in prompts
        if name == "plain":
            assert r["ratio"] == pytest.approx(1.0) and r["acceptance"] == 0
        elif not name.startswith("adaptive"):
            assert r["acceptance"] > 0 and r["draft_cost"] > 0 and r["verify_cost"] > 0 and r["predicted"] > 0
            assert r["tokens_per_pass"] > 1
            # The profile: Python per drafted token and per pass, which the whole step's Python time bounds.
            assert r["python_us_per_draft_token"] > 0 and r["python_us_per_verify_step"] > 0
            assert r["python_us_per_row"] == pytest.approx(r["python_us_per_verify_step"] / (1 + r["mean_k"]))
            parts = r["python_us_per_verify_step"] + r["mean_k"] * r["python_us_per_draft_token"]
            assert parts <= 1e3 * r["python_ms_per_step"] * 1.01, name
    assert report["threads"] == 1 and report["machine"] and report["date"]
    assert 0 <= report["logit_noise"] < 1  # batch vs single-row logits: last bits, not a different model
    # The yardstick: sampling fresh target rows, ours and llama.cpp's own chain, at each temperature of the run.
    assert [c["temperature"] for c in report["sampling"]] == [0.0, 0.8]
    for c in report["sampling"]:
        assert c["rows"] >= 1 and 0 < c["localspec_us"] < 1e6 and 0 < c["llama_cpp_us"] < 1e6
        assert c["k"] == 4 and 0 < c["verified_us"] < 1e6 and 0 < c["llama_cpp_verified_us"] < 1e6
    for r in report["rows"]:  # greedy divergences carry the target's top-2 gap at that token
        for d in r["divergences"]:
            assert d["index"] >= 0 and d["top2_gap"] >= 0


def test_table_and_a_missing_peer_is_one_note(tiny_models, capsys, localspec_home, tmp_path):
    code, out, err = bench(capsys, tiny_models, "--temperature", "0", "--peer", str(tmp_path / "nowhere"))
    assert code == 0, err
    lines = out.splitlines()
    assert any(line.startswith("setting") and "×plain" in line for line in lines)
    assert sum(line.startswith(("plain", "k=", "adaptive")) for line in lines) == 4
    notes = [line for line in lines if line.startswith("note: llama-server")]
    assert len(notes) == 1 and "no llama-server binary" in notes[0]
    yardstick = [line for line in lines if line.startswith("sampling freshly decoded rows")]
    assert len(yardstick) == 1 and "T 0: plain step" in yardstick[0] and "T 0.8" not in yardstick[0]
    assert "verified row (k=4)" in yardstick[0]
    assert "Traceback" not in out + err


def test_a_broken_peer_is_one_note(tiny_models, capsys, localspec_home, tmp_path):
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho 'error: unknown argument' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    code, out, err = bench(capsys, tiny_models, "--temperature", "0", "--k", "2", "--peer", str(fake))
    assert code == 0, err
    notes = [line for line in out.splitlines() if line.startswith("note: llama-server failed")]
    assert len(notes) == 1 and "exited at start (code 3): error: unknown argument" in notes[0]
    assert any(line.startswith("k=2") for line in out.splitlines())


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--k", "2,x"], "--k takes a comma-separated list"),
        (["--k", "0"], "--k values must be 1..64"),
        (["--verify", "maybe"], "--verify takes pq and/or match"),
        (["--tokens", "1"], "--tokens must be ≥ 2"),
        (["--k", ","], "--k is empty"),
        (["--prompts", "{tmp}/nowhere.txt"], "cannot read --prompts"),
        (["--prompts", "{tmp}/blank.txt"], "blank.txt has no prompt (one per line)"),
        # the worker the user named, not the relay bench puts in front of it
        (["--rpc", "127.0.0.1:1"], "cannot reach the RPC worker at 127.0.0.1:1 ("),
    ],
)
def test_bad_flags_are_one_line(tiny_models, capsys, localspec_home, tmp_path, flags, message):
    (tmp_path / "blank.txt").write_text("\n  \n")
    code, out, err = bench(capsys, tiny_models, *(f.format(tmp=tmp_path) for f in flags))
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1


def test_the_gap_of_a_divergence_is_read_from_plain_decodings_own_rows(tiny_models):
    from localspec.bench.exactness import plain_logits
    from localspec.core.engine import Engine

    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_threads=1) as engine:
        prompt = engine.tokenize("the gap")
        plain = engine.generate(
            prompt, sampling=SamplingParams(temperature=0), spec=SpeculativeParams(draft_max=0), max_tokens=24
        )  # each row below re-reads the prompt and the tokens before it: 1,024 tokens took 382 s on a loaded machine
        tokens = [event.token for event in plain if event.token is not None]
        assert len(tokens) > 3
        for i in range(len(tokens)):  # every row is the one plain decoding chose from
            assert int(np.argmax(plain_logits(engine, prompt, tokens[:i]))) == tokens[i]
        engine.check_invariants()


def test_runs_are_interleaved_each_exactly_once_and_no_setting_always_first():
    from collections import Counter

    from localspec.bench.run import interleaved

    runs = list(interleaved(["a", "b", "c"], n_prompts=2, rounds=range(3), groups=(0, 5)))
    assert Counter(runs) == Counter((r, g, p, s) for r in range(3) for g in (0, 5) for p in range(2) for s in "abc")
    firsts = Counter(runs[i][3] for i in range(0, len(runs), 3))  # the setting that opens each prompt's turn
    assert set(firsts) == {"a", "b", "c"} and max(firsts.values()) - min(firsts.values()) <= 2
    groups_first = [next(g for r, g, _, _ in runs if r == round_) for round_ in range(3)]
    assert groups_first == [0, 5, 0]  # the groups (e.g. round trips) rotate once per round


@pytest.mark.slow
def test_busy_rows_measure_each_setting_quiet_and_busy(capsys, tiny_models):
    code, out, err = bench(capsys, tiny_models, "--busy", "--json")
    assert code == 0, err
    busy = json.loads(out)["busy"]
    assert busy and all(set(row) == {"setting", "quiet", "busy"} for row in busy)
    assert all(row["quiet"] > 0 and row["busy"] > 0 for row in busy)


def test_the_table_shows_busy_rows_and_a_row_without_data():
    from localspec.bench.report import BenchReport, BusyRow, render

    report = BenchReport("m", "c", "d", "t", "dr", 1, busy=[BusyRow("plain", 40.0, 30.0), BusyRow("adaptive≤8", 0, 0)])
    lines = render(report)
    at = lines.index("one busy core (a busy-loop process on one core):")
    assert lines[at + 1 : at + 3] == [
        "  plain            quiet 40.0 tok/s, busy 30.0 tok/s (0.75× quiet)",
        "  adaptive≤8: no data",
    ]


def test_a_bridged_pair_is_benched_like_any_pair_with_the_bridges_own_time(tiny_models, capsys, localspec_home):
    args = ["bench", "--target", str(tiny_models.target), "--draft", str(tiny_models.vocab_shuffled)]
    args += ["--tokens", "12", "--rounds", "1", "--k", "3", "--temperature", "0,1", "--verify", "pq", "--threads", "1"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "bridge (the draft's other vocabulary), of µs/draft: k=3 T0 " in out
    assert main([*args, "--json"]) == 0
    rows = {(r["setting"], r["temperature"]): r for r in json.loads(capsys.readouterr().out)["rows"]}
    spec = rows[("k=3", 0.0)]
    assert spec["acceptance"] > 0 and spec["tokens_per_pass"] > 1
    assert 0 < spec["bridge_us_per_draft_token"] < spec["python_us_per_draft_token"]
    assert rows[("plain", 0.0)]["bridge_us_per_draft_token"] == 0


def test_an_older_llama_server_without_draft_sampling_runs_its_greedy_rows_only(tmp_path):
    """llama-server builds before `--spec-draft-sampling` refuse the option (the CUDA build of the pinned
    source did): bench asks `--help` first, leaves the option out and runs no pq rows on such a build."""
    from localspec.bench.peer import LlamaServer, has_draft_sampling
    from localspec.bench.peer_runs import peer_settings
    from localspec.bench.run import settings_for

    old, new = tmp_path / "old-server", tmp_path / "new-server"
    old.write_text("#!/bin/sh\necho '--spec-draft-n-max N   most draft tokens'\n")
    new.write_text("#!/bin/sh\necho '--spec-draft-sampling {greedy,probabilistic}'\n")
    for fake in (old, new):
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    assert not has_draft_sampling(old) and has_draft_sampling(new)

    chosen = settings_for([4], [0.0, 0.8], ["pq", "match"])
    kept = {(s.name, s.temperature) for s in peer_settings(chosen, draft_sampling=False)}
    assert kept == {("plain", 0.0), ("k=4", 0.0), ("plain", 0.8), ("k=4 match", 0.8)}
    assert ("k=4 pq", 0.8) in {(s.name, s.temperature) for s in peer_settings(chosen)}

    args = LlamaServer(old, "t.gguf", "d.gguf", k=4, probabilistic=None, threads=1, n_ctx=64).args
    assert "--spec-draft-n-max" in args and "--spec-draft-sampling" not in args
    args = LlamaServer(new, "t.gguf", "d.gguf", k=4, probabilistic=True, threads=1, n_ctx=64).args
    assert args[args.index("--spec-draft-sampling") + 1] == "probabilistic"


def test_the_peer_runs_with_the_repack_choice_of_localspec(tmp_path, monkeypatch):
    from localspec.bench.peer import LlamaServer

    monkeypatch.delenv("LOCALSPEC_REPACK", raising=False)
    assert "--no-repack" not in LlamaServer(tmp_path / "s", "t.gguf", None, threads=1, n_ctx=64).args
    monkeypatch.setenv("LOCALSPEC_REPACK", "off")
    assert "--no-repack" in LlamaServer(tmp_path / "s", "t.gguf", "d.gguf", k=2, threads=1, n_ctx=64).args


def test_a_peer_that_dies_at_start_is_named_by_its_signal(tiny_models, capsys, localspec_home, tmp_path, monkeypatch):
    from localspec.bench import peer
    from localspec.llama import cpu

    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\nkill -SEGV $$\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    amx = cpu.HostCpu("Intel(R) Xeon(R) Platinum 8488C", frozenset({"AVX2", "AVX512", "AMX_INT8"}))
    monkeypatch.setattr(peer, "host_cpu", lambda: amx)
    code, out, err = bench(capsys, tiny_models, "--temperature", "0", "--k", "2", "--peer", str(fake))
    assert code == 0, err
    notes = [line for line in out.splitlines() if line.startswith("note: llama-server failed")]
    assert len(notes) == 1 and "exited at start (code -11): it died with SIGSEGV; this CPU has AMX" in notes[0]
    assert "LOCALSPEC_REPACK=off" in notes[0]


def test_the_structured_workload_runs_every_setting_under_the_schema(tiny_models, capsys, localspec_home):
    """`--structured`: each setting again with the answer constrained to a JSON schema; tokens per pass (forced
    tokens are free), the mask's µs per row, and greedy speculative == plain under the schema (no divergence)."""
    code, out, err = bench(capsys, tiny_models, "--json", "--structured", "--temperature", "0", "--tokens", "24")
    assert code == 0, err
    rows = {r["setting"]: r for r in json.loads(out)["rows"]}
    assert set(rows) == {"plain", "k=2", "k=3", "adaptive≤3", "plain schema", "k=2 schema", "k=3 schema"} | {
        "adaptive≤3 schema"
    }
    for name, r in rows.items():
        schema = name.endswith("schema")
        assert (r["mask_us_per_row"] > 0) == schema, name
        if schema:
            assert r["divergences"] == [] or all(d["top2_gap"] >= 0 for d in r["divergences"])
    assert rows["plain schema"]["tokens_per_pass"] > 1  # forced tokens: more than one token per pass without drafts
    assert rows["plain schema"]["ratio"] == pytest.approx(1.0)


def test_each_adaptive_row_is_set_against_the_best_fixed_k_prompt_by_prompt():
    """Issue 66: the policy within 3 % of the best fixed k on every prompt — the report says it prompt by prompt
    (the best of the same temperature, verification, workload and drafter), and the lowest."""
    from localspec.bench.report import Row, adaptive_by_prompt

    base = Row("k=4", 0.0, 4, "pq", 10.0, 1.0, 0.5, 0.5, 2.0, 0.3, 1.2, 4.0, 1.4, 1.0, 0.1, 50.0, 80.0, 20.0)

    def row(setting, k, rates, **kw):
        return dataclasses.replace(base, setting=setting, k=k, per_prompt=rates, **kw)

    rows = [
        row("plain", 0, (5.0, 5.0, 5.0)),
        row("k=4", 4, (10.0, 20.0, 8.0)),
        row("k=8", 8, (12.0, 16.0, 8.0)),
        row("adaptive≤8", None, (12.0, 19.0, 8.8)),
        row("k=8 pq", 8, (1.0, 1.0, 1.0), temperature=0.8),  # another temperature: not its yardstick
        row("adaptive≤8 pq", None, (2.0, 1.0, 0.5), temperature=0.8, verify="pq"),
    ]
    assert adaptive_by_prompt(rows) == [
        "prompt by prompt, adaptive≤8 T0 over the best fixed k: 1.00 (k=8), 0.95 (k=4), 1.10 (k=4); lowest 0.95",
        "prompt by prompt, adaptive≤8 pq T0.8 over the best fixed k: 2.00 (k=8), 1.00 (k=8), 0.50 (k=8); lowest 0.50",
    ]
    assert adaptive_by_prompt([row("adaptive≤8", None, (1.0,))]) == []  # no fixed k to set it against
