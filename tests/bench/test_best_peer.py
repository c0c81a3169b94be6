"""`bench --peer` against llama-server's best: besides the same-k rows, the peer's own strong settings (its default
draft length, 8 and 16, its n-gram pool `ngram-mod` alone and chained before the draft, probabilistic at T > 0 where
the build has it), each row's ratio to the fastest of them and the headline — on a fake llama-server
(tests/support/fakepeer.py) whose speed depends on its settings, so which one is the best is known in advance."""

from __future__ import annotations

import json
import re

import pytest
from support.benchrun import bench_tiny
from support.fakepeer import HELP_OLD, write_fake_peer

from localspec.bench.peer import LlamaServer, PeerBuild, peer_build
from localspec.bench.peer_runs import PeerSetting, best_peer_settings
from localspec.bench.report import from_json, render
from localspec.core.params import DEFAULT_MODEL_DRAFTER as DEFAULT


def bench(capsys, tiny_models, peer, *extra: str) -> tuple[int, str, str]:
    return bench_tiny(capsys, tiny_models, "--tokens", "8", "--rounds", "1", "--threads", "1", "--peer", str(peer),
                      *extra)  # fmt: skip


def test_the_build_says_what_it_can_run(tmp_path):
    new, _ = write_fake_peer(tmp_path)
    assert peer_build(new) == PeerBuild(
        draft_sampling=True,
        spec_types=("none", "draft-simple", "draft-eagle3", "ngram-simple", "ngram-mod", "ngram-cache"),
        default_k=3,
    )
    (tmp_path / "old").mkdir()
    old, _ = write_fake_peer(tmp_path / "old", help_text=HELP_OLD)
    assert peer_build(old) == PeerBuild(False, ("none", "draft-simple", "ngram-simple"), 16)


def test_the_peers_strong_settings_and_how_each_starts(tmp_path):
    build = PeerBuild(True, ("draft-simple", "ngram-mod"), 3)
    chosen = best_peer_settings([0.0, 0.8], build)
    assert [(s.name, s.temperature) for s in chosen] == [
        ("draft k=3 (default)", 0.0),
        ("draft k=8", 0.0),
        ("draft k=16", 0.0),
        ("ngram-mod", 0.0),
        ("ngram-mod+draft k=8", 0.0),
        ("draft k=3 (default) prob", 0.8),
        ("draft k=8 prob", 0.8),
        ("draft k=16 prob", 0.8),
        ("ngram-mod", 0.8),
        ("ngram-mod+draft k=8 prob", 0.8),
    ]

    def args(setting: PeerSetting) -> list[str]:
        draft = "d.gguf" if setting.drafts_with_model else None
        return LlamaServer(
            tmp_path / "s", "t.gguf", draft, k=setting.k, probabilistic=setting.probabilistic, spec=setting.spec,
            threads=1, n_ctx=64,
        ).args  # fmt: skip

    chain = args(chosen[-1])
    assert chain[chain.index("--spec-type") + 1] == "ngram-mod,draft-simple" and "-md" in chain
    assert chain[chain.index("--spec-draft-n-max") + 1] == "8"
    assert chain[chain.index("--spec-draft-sampling") + 1] == "probabilistic"
    pool = args(chosen[3])
    assert pool[pool.index("--spec-type") + 1] == "ngram-mod" and "-md" not in pool
    assert "--spec-draft-sampling" not in pool  # its own defaults: the n-gram pool has no draft law
    greedy = args(chosen[0])
    assert greedy[greedy.index("--spec-draft-sampling") + 1] == "greedy"
    # A build that does not say its default draft length runs its draft without --spec-draft-n-max.
    unsaid = best_peer_settings([0.0], PeerBuild(False, ("draft-simple",), None))
    assert [s.name for s in unsaid] == ["draft (default)", "draft k=8", "draft k=16"]
    assert "--spec-draft-n-max" not in args(unsaid[0]) and "--spec-draft-sampling" not in args(unsaid[0])


@pytest.mark.slow
def test_bench_finds_the_peers_best_per_temperature_and_says_its_headline(
    tiny_models, capsys, localspec_home, tmp_path
):
    peer, log = write_fake_peer(tmp_path)
    flags = ["--k", "2,8", "--temperature", "0,0.8", "--verify", "pq", "--json"]
    code, out, err = bench(capsys, tiny_models, peer, *flags)
    assert code == 0, err
    report = json.loads(out)
    ran = {(p["setting"], p["temperature"]): p for p in report["peer"]}
    assert ran[("ngram-mod+draft k=8", 0.0)]["tokens_per_second"] == 61.0
    assert ran[("ngram-mod", 0.8)]["tokens_per_second"] == 47.0
    assert ("k=2", 0.0) in ran and ("k=2 pq", 0.8) in ran and ("plain", 0.8) in ran
    # localspec's k=8 and the peer's own "draft k=8" are one run, started once (one round)
    assert ("draft k=8", 0.0) in ran and ("k=8", 0.0) not in ran
    assert len(log.read_text().splitlines()) == len(report["peer"]) == 14
    best = {b["temperature"]: b for b in report["best_peer"]}
    assert best[0.0]["peer_setting"] == "ngram-mod+draft k=8" and best[0.8]["peer_setting"] == "ngram-mod"
    assert best[0.0]["setting"] == "adaptive≤8" and best[0.8]["setting"] == "adaptive≤8 pq"
    assert best[0.0]["label"] == "localspec default"
    rows = {(r["setting"], r["temperature"]): r for r in report["rows"]}
    for (_, t), r in rows.items():
        assert r["best_peer_ratio"] == pytest.approx(r["tokens_per_second"] / best[t]["peer_tokens_per_second"])
    assert rows[("k=8", 0.0)]["peer_tokens_per_second"] == 45.0  # the same k: its own column, as before
    assert best[0.0]["ratio"] == pytest.approx(rows[("adaptive≤8", 0.0)]["tokens_per_second"] / 61.0)

    lines = render(from_json(out))  # the JSON carries everything the table shows
    assert any("×best peer" in line for line in lines)
    headline = [line for line in lines if line.startswith("localspec default vs the peer's best setting: ")]
    assert len(headline) == 1
    assert "T 0: adaptive≤8 " in headline[0] and "/ ngram-mod+draft k=8 61.0 tok/s = " in headline[0]
    assert "T 0.8: adaptive≤8 pq " in headline[0] and "/ ngram-mod 47.0 tok/s = " in headline[0]
    marked = [line for line in lines if line.startswith(" *")]
    assert [line[2:].split("  ")[0] for line in marked] == ["ngram-mod+draft k=8", "ngram-mod"]


@pytest.mark.slow
def test_an_older_peer_without_ngram_mod_is_best_among_its_drafts(tiny_models, capsys, localspec_home, tmp_path):
    peer, log = write_fake_peer(tmp_path, help_text=HELP_OLD)
    code, out, err = bench(capsys, tiny_models, peer, "--k", "2", "--temperature", "0")
    assert code == 0, err
    assert "note: this llama-server has no ngram-mod" in out
    assert not any("ngram-mod" in " ".join(args) for args in map(json.loads, log.read_text().splitlines()))
    # its default k is 16 (HELP_OLD), so "draft k=16 (default)" and "draft k=8" run; plain (50 tok/s) is its best
    assert "draft k=16 (default)" in out
    assert "/ plain 50.0 tok/s = " in out


@pytest.mark.slow
def test_drafters_side_by_side_and_the_headline_follows_the_default(tiny_models, capsys, localspec_home, tmp_path):
    peer, _ = write_fake_peer(tmp_path)
    code, out, err = bench(
        capsys, tiny_models, peer, "--k", "2", "--temperature", "0", "--drafters", f"ngram,{DEFAULT}", "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    names = {r["setting"] for r in report["rows"]}
    assert names == {"plain", "k=2 ngram", "adaptive≤2 ngram", f"k=2 {DEFAULT}", f"adaptive≤2 {DEFAULT}"}
    assert {r["drafter"] for r in report["rows"]} == {"", "ngram", DEFAULT}
    (best,) = report["best_peer"]  # the default drafter (a draft given: model+ngram), not the first listed
    assert best["setting"] == f"adaptive≤2 {DEFAULT}" and best["label"] == "localspec default"
    rows = {r["setting"]: r for r in report["rows"]}
    assert rows["k=2 ngram"]["peer_tokens_per_second"] == rows[f"k=2 {DEFAULT}"]["peer_tokens_per_second"] == 30.0


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--drafters", "model,beam"], "--drafters takes model, ngram, model+ngram, mtp, assistant, none"),
        (["--drafters", "mtp"], "--drafters mtp: bench the MTP head with --drafter mtp"),
    ],
)
def test_bad_drafters_are_one_line(tiny_models, capsys, localspec_home, tmp_path, flags, message):
    code, out, err = bench(capsys, tiny_models, tmp_path / "nowhere", *flags)
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_structured_workload_is_not_compared_with_the_peers_free_text(
    tiny_models, capsys, localspec_home, tmp_path
):
    """`--structured` with `--peer`: llama-server runs free text only, so no schema row gets a peer figure or stands
    in the headline (the adaptive schema row comes after the free one and took its place)."""
    peer, log = write_fake_peer(tmp_path)
    code, out, err = bench(capsys, tiny_models, peer, "--k", "2", "--temperature", "0", "--structured", "--json")
    assert code == 0, err
    report = json.loads(out)
    rows = {r["setting"]: r for r in report["rows"]}
    assert {"plain schema", "k=2 schema", "adaptive≤2 schema"} <= set(rows) and rows["k=2 schema"]["schema"]
    for name in ("plain schema", "k=2 schema", "adaptive≤2 schema"):
        assert rows[name]["peer_tokens_per_second"] is None and rows[name]["best_peer_ratio"] is None
    assert rows["k=2"]["peer_tokens_per_second"] is not None
    (best,) = report["best_peer"]
    assert best["setting"] == "adaptive≤2"
    assert not any("schema" in p["setting"] for p in report["peer"])


@pytest.mark.slow
def test_the_peer_runs_a_round_after_each_of_localspecs(tiny_models, capsys, localspec_home, tmp_path, monkeypatch):
    """localspec's round of every setting, then the peer's round, and again: both measured in the same minutes (a
    machine's speed drifts 2-3x over a long bench; all of localspec's rounds before all of the peer's put the drift
    into the ratio)."""
    from localspec.cli import bench as cli_bench

    peer, log = write_fake_peer(tmp_path)
    shown: list[str] = []
    monkeypatch.setattr(cli_bench, "_progress", lambda: shown.append)
    code, out, err = bench(capsys, tiny_models, peer, "--k", "2", "--temperature", "0", "--rounds", "2")
    assert code == 0, err
    rounds = [(line, re.search(r"round (\d+)", line)) for line in shown]
    runs = [("llama-server" if "llama-server" in line else "localspec", int(m[1])) for line, m in rounds if m]
    order = [run for i, run in enumerate(runs) if i == 0 or run != runs[i - 1]]
    assert order == [
        ("localspec", 1),
        ("llama-server", 1),
        ("localspec", 2),
        ("llama-server", 2),
    ]
    assert len(log.read_text().splitlines()) == 2 * 7  # each of its 7 settings started once a round
