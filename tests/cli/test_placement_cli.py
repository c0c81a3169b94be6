"""The placement on the command line: its flags' one-line errors, `generate --json`'s plan, `doctor`'s lines."""

from __future__ import annotations

import json

import pytest
from support.badinput import assert_outcome, run_main
from support.tinymodels import write_moe_model

from localspec.llama.devices import devices

CPU_ONLY = not any(d.kind in ("gpu", "igpu") for d in devices())


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--gpu-memory", "8X"], "--gpu-memory '8X' is not a memory size: write it like 8G"),
        (["--gpu-memory", "8"], "is not a memory size"),
        (["--n-gpu-layers-draft", "-2"], "--n-gpu-layers-draft -2 is out of range"),
        (["--n-gpu-layers", "-5"], "--n-gpu-layers -5 is out of range"),
    ],
)
@pytest.mark.parametrize("command", ["generate", "bench"])
def test_bad_placement_flags_are_one_line(tiny_models, capsys, flags, match, command):
    args = [command, *(["hi"] if command == "generate" else []), "--target", tiny_models.target, *flags]
    assert_outcome(run_main(args, capsys), 1, match)


def test_generate_json_carries_the_plan(tiny_models, capsys):
    args = ["generate", "hi", "--target", tiny_models.target, "--draft", tiny_models.draft_noisy, "--json"]
    outcome = run_main([*args, "--max-tokens", "4", "--n-ctx", "512", "--gpu-memory", "6G"], capsys)
    assert_outcome(outcome, 0)
    plan = json.loads(outcome.out.splitlines()[0])["placement"]
    assert plan["n_ctx"] == plan["n_ctx_asked"] == 512
    assert plan["target"]["n_layer"] == plan["draft"]["n_layer"] == 2
    assert plan["host_bytes"] + plan["gpu_bytes"] > 0 and plan["text"]
    if CPU_ONLY:
        assert plan["device"] == "CPU" and plan["gpu_free"] is None and "--gpu-memory ignored" in plan["text"]


def test_cpu_moe_runs_on_this_build(tmp_path, capsys):
    path = write_moe_model(tmp_path / "moe.gguf")
    outcome = run_main(["generate", "hi", "--target", path, "--cpu-moe", "--max-tokens", "4", "--json"], capsys)
    assert_outcome(outcome, 0)
    assert json.loads(outcome.out.splitlines()[0])["placement"]["target"]["cpu_moe_layers"] == 2


@pytest.mark.slow
def test_doctor_prints_each_downloaded_pairs_placement(chat_home, capsys):
    outcome = run_main(["doctor"], capsys)
    assert outcome.code == 0
    lines = outcome.out.splitlines()
    placed = [line for line in lines if line.startswith("  placement of ")]
    assert {line.split()[2].rstrip(":") for line in placed} == {"tiny", "tiny-same", "demo"}  # not the Hub pair
    if CPU_ONLY:
        assert all("CPU only; no GPU in this llama.cpp build; n_ctx 2048" in line for line in placed)
    outcome = run_main(["doctor", "--gpu-memory", "6G"], capsys)
    placed = [line for line in outcome.out.splitlines() if line.startswith("  placement of ")]
    assert placed and all("6.0 GiB free less 1.0 GiB margin: draft: 2/2 layers + output" in line for line in placed)
    assert_outcome(run_main(["doctor", "--gpu-memory", "lots"], capsys), 1, "is not a memory size")
