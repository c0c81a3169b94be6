"""The CPU half of the GPU recipe (scripts/gpu/): the "echo" models it writes agree on the share of tokens they were
asked to, so `localspec bench --json` reports that acceptance; and the report it renders from JSON is the table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from localspec.bench.report import from_json, render, to_json
from localspec.cli.main import main

MAKE_MODEL = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "make_model.py"
SHAPE = ["--n-embd", "256", "--n-head", "4", "--n-head-kv", "2", "--n-vocab", "1024", "--mode", "echo"]


def echo_model(path: Path, *flags: str) -> Path:
    subprocess.run([sys.executable, str(MAKE_MODEL), str(path), *SHAPE, *flags], check=True, capture_output=True)
    return path


@pytest.fixture(scope="module")
def echo_target(tmp_path_factory) -> Path:
    return echo_model(tmp_path_factory.mktemp("echo") / "target.gguf", "--n-layer", "2", "--n-ff", "512")


@pytest.mark.parametrize("agree", [0.5, 0.85])
def test_an_echo_pair_accepts_the_share_it_was_asked_for(echo_target, tmp_path, capsys, localspec_home, agree):
    draft = echo_model(tmp_path / "draft.gguf", "--n-layer", "1", "--n-ff", "256", "--agree", str(agree))
    flags = ["--k", "4", "--temperature", "0", "--tokens", "96", "--rounds", "1", "--threads", "1", "--json"]
    code = main(["bench", "--target", str(echo_target), "--draft", str(draft), *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = from_json(out)
    (row,) = [r for r in report.rows if r.setting == "k=4"]
    assert row.alpha == pytest.approx(agree, abs=0.05)
    assert render(report) == render(from_json(to_json(report)))  # the table bench.sh prints from the JSON
    assert json.loads(to_json(report)) == json.loads(out)
