"""models.toml pairs with a target and no draft (issue #32): the target drafts with its own MTP head where it carries
one, else decodes plainly. The schema, `models`, `doctor` (its placement plan too), `generate`, `bench` and the
pre-flight line, on real tiny GGUFs written by the tests: a qwen35 with one MTP block and a llama without a head.
"""

from __future__ import annotations

import json

import pytest
from support import PROMPT
from support.tinymodels import write_mtp_model

from localspec.cli.doctor import run_doctor
from localspec.cli.main import main
from localspec.models.catalog import load_config
from localspec.models.flags import RunFlags
from localspec.models.loading import resolve_models
from localspec.models.pairs import pair_status, resolve_pair, vocabulary_verdict

HEAD_LINE = "no draft: the target drafts with its own MTP head (1 MTP layer)"


@pytest.fixture(scope="module")
def mtp_path(tmp_path_factory):
    return write_mtp_model(tmp_path_factory.mktemp("mtp") / "tiny-mtp.gguf", seed=1, output_scale=0.4)


@pytest.fixture
def alone_home(localspec_home, mtp_path, tiny_models):
    """LOCALSPEC_HOME with target-only pairs: "mtp-alone" (a target with a head), "plain-alone" (one without) and
    "missing-alone" (a Hub target that is not downloaded)."""
    localspec_home.config_dir.mkdir(parents=True, exist_ok=True)
    localspec_home.config_file.write_text(
        f'[pairs."mtp-alone"]\ndescription = "tiny qwen35, its own head"\ntarget = {{ path = "{mtp_path}" }}\n'
        "n_ctx = 256\n"
        f'[pairs."plain-alone"]\ntarget = {{ path = "{tiny_models.target}" }}\nn_ctx = 256\n'
        '[pairs."missing-alone"]\ntarget = "localspec-test/Missing-GGUF:Q4_K_M"\n',
        encoding="utf-8",
    )
    return localspec_home


def test_a_pair_may_name_a_target_and_no_draft(alone_home, mtp_path):
    config = load_config(alone_home)
    pair = config.get("mtp-alone")
    assert pair.draft is None
    status = pair_status(pair, alone_home)
    assert status.draft is None and status.files == (status.target,) and status.downloaded
    assert vocabulary_verdict(status) is None  # no vocabulary to compare
    resolved = resolve_pair(pair, config, alone_home)
    assert resolved.target == mtp_path and resolved.draft is None and resolved.name == "mtp-alone"
    assert resolve_models(RunFlags(pair="mtp-alone"), alone_home).draft is None  # as every command resolves it
    missing = pair_status(config.get("missing-alone"), alone_home)
    assert not missing.downloaded and missing.draft is None


def test_models_names_what_drafts_for_a_target_alone(alone_home, capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    block = out[out.index("mtp-alone (") :].split("\n\n")[0]
    assert f"    draft   {HEAD_LINE}" in block and "    target  " in block
    plain = out[out.index("plain-alone (") :]
    assert "draft   no draft and no MTP head: plain decoding (or --drafter ngram)" in plain.splitlines()[2]
    missing = out[out.index("missing-alone (") :].splitlines()
    assert "draft   no draft: the target drafts with its own MTP head if it has one" in missing[2]
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["mtp-alone"]["draft"] is None and rows["mtp-alone"]["mtp_layers"] == 1
    assert list(rows["mtp-alone"]["files"]) == ["target"] and rows["mtp-alone"]["downloaded"] is True
    assert rows["plain-alone"]["mtp_layers"] == 0 and rows["missing-alone"]["mtp_layers"] is None
    assert rows["missing-alone"]["downloaded"] is False


@pytest.mark.slow
def test_doctor_says_the_head_and_plans_the_target_alone(alone_home):
    report = run_doctor(alone_home, gpu_memory=8 * 2**30)
    found = {f.label: f for title, fs in report.sections if title == "Pairs" for f in fs}
    line = found["mtp-alone [user]"].value
    assert line.startswith("target ok (") and HEAD_LINE in line and "draft" not in line.split(";")[0]
    assert "no draft and no MTP head" in found["plain-alone [user]"].value
    assert found["missing-alone [user]"].advice == "run `localspec pull missing-alone`"
    plan = found["placement of mtp-alone"]
    assert plan.advice is None and "does not fit" not in plan.value and "draft" not in plan.value, plan.value
    assert "placement of missing-alone" not in found


@pytest.mark.slow
def test_generate_on_a_target_alone_drafts_with_its_head_and_prints_the_plain_text(alone_home, capsys):
    texts = {}
    for flags in ([], ["--drafter", "none"]):
        args = ["generate", PROMPT, "--pair", "mtp-alone", "--temperature", "0", "--max-tokens", "40", "--json"]
        assert main([*args, "--draft-max", "3", "--no-adaptive", "--threads", "1", *flags]) == 0
        out, err = capsys.readouterr()
        texts[tuple(flags)] = (json.loads(out.splitlines()[-1]), err)
    (head, err), (plain, _) = texts[()], texts[("--drafter", "none")]
    assert "localspec: note: draft head: 1 MTP layer (the target drafts for itself)" in err  # the pre-flight line
    assert head["drafter"] == "mtp" and head["stats"]["drafted"] > 0 and head["stats"]["accepted"] > 0
    assert plain["drafter"] == "none" and plain["stats"]["drafted"] == 0
    assert head["text"] == plain["text"]
    assert main(["generate", "hi", "--pair", "plain-alone", "--max-tokens", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["drafter"] == "none"  # no head: plain decoding


def test_bench_on_a_target_alone_benches_its_head(alone_home, capsys):
    args = ["bench", "--pair", "mtp-alone", "--k", "2", "--temperature", "0", "--tokens", "12", "--rounds", "1"]
    assert main([*args, "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "draft:  the target MTP head (--drafter mtp)" in out
    [row] = [line.split() for line in out.splitlines() if line.startswith("k=2 ")]
    assert float(row[4].rstrip("%")) > 0
    assert main(["bench", "--pair", "plain-alone", "--k", "2", "--tokens", "4"]) != 0  # no head to bench: one line
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pair 'plain-alone' has no draft and its target target.gguf no MTP head" in err[0], err
