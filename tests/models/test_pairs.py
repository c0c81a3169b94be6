"""Pairs on this machine: quant file matching, resolving a pair for the engine, the demo fallback, doctor."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from localspec.cli.doctor import run_doctor
from localspec.errors import ModelFileError
from localspec.models import demo, hub
from localspec.models.catalog import ModelSource, load_config
from localspec.models.pairs import (
    choose_pair,
    compat_hint,
    family_of,
    pair_status,
    pull_pair,
    resolve_pair,
)
from localspec.models.preflight import check_files


@pytest.fixture(autouse=True)
def empty_hf_cache(tmp_path, monkeypatch):
    """A private, empty HF cache (huggingface_hub read HF_HUB_CACHE at import, so patch its constant too)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def local_pair(paths, target, draft, extra: str = "") -> None:
    paths.config_dir.mkdir(parents=True, exist_ok=True)
    paths.config_file.write_text(
        f'[pairs.local]\ntarget = {{ path = "{target}" }}\ndraft = {{ path = "{draft}" }}\n{extra}', encoding="utf-8"
    )


# --- quant names --------------------------------------------------------------------------------------------

FILES = [
    "README.md",
    "m-Q4_K_M.gguf",
    "m-Q4_K_S.gguf",
    "m-Q4_K.gguf",
    "m-q8_0.gguf",
    "mmproj-m-f16.gguf",
    "m-F16.gguf",
    "m-Q6_K/m-Q6_K-00002-of-00002.gguf",
    "m-Q6_K/m-Q6_K-00001-of-00002.gguf",
]


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        ("Q4_K_M", ["m-Q4_K_M.gguf"]),
        ("q4_k", ["m-Q4_K.gguf"]),  # a whole word only: not Q4_K_M or Q4_K_S
        ("Q8_0", ["m-q8_0.gguf"]),
        ("F16", ["m-F16.gguf"]),  # the mmproj file is never a model
        ("Q6_K", ["m-Q6_K/m-Q6_K-00001-of-00002.gguf", "m-Q6_K/m-Q6_K-00002-of-00002.gguf"]),
        ("Q5_K_M", []),
    ],
)
def test_match_quant(quant, expected):
    assert hub.match_quant(FILES, quant) == expected


def test_available_quants_and_quant_of():
    assert hub.available_quants(FILES) == ["F16", "Q4_K", "Q4_K_M", "Q4_K_S", "Q6_K", "Q8_0"]
    assert hub.quant_of("Qwen_Qwen3-8B-IQ4_XS.gguf") == "IQ4_XS"
    assert hub.quant_of("notes.gguf") is None


def test_cached_size_counts_every_shard(tmp_path):
    for i in (1, 2):
        (tmp_path / f"x-Q8_0-0000{i}-of-00002.gguf").write_bytes(b"x" * 10 * i)
    assert hub.cached_size(tmp_path / "x-Q8_0-00001-of-00002.gguf") == 30


@pytest.mark.parametrize(
    ("ref", "family"),
    [
        ("bartowski/Meta-Llama-3.1-8B-Instruct-GGUF", "Llama 3"),
        ("bartowski/Llama-3.2-1B-Instruct-GGUF", "Llama 3"),
        ("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "Qwen2.5"),
        ("bartowski/Qwen_Qwen3-0.6B-GGUF", "Qwen3"),
        ("unsloth/Qwen3.5-9B-MTP-GGUF", "Qwen3.5"),  # not Qwen3: another tokenizer
        ("ggml-org/gemma-3-1b-it-GGUF", "Gemma 3"),
        ("someone/mistral-GGUF", None),
    ],
)
def test_family_of(ref, family):
    assert family_of(ModelSource.model_validate(ref)) == family


def test_hint_names_the_curated_drafts_of_the_family_but_not_the_failing_one(localspec_home):
    config = load_config(localspec_home)
    hint = compat_hint(config.get("qwen2.5-7b"), config)
    assert hint.startswith("drafts known to fit Qwen2.5 targets: ")
    assert "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF" in hint and "Qwen/Qwen2.5-0.5B-Instruct-GGUF" not in hint
    assert "same model family" in compat_hint(config.get("qwen3-8b"), config)  # its own draft is the only one
    alone = compat_hint(config.get("qwen3.5-9b-mtp"), config)  # a target alone: the family's curated drafts
    assert alone == "drafts known to fit Qwen3.5 targets: ggml-org/Qwen3.5-0.8B-GGUF/Qwen3.5-0.8B-Q8_0.gguf"


# --- local-path pairs ---------------------------------------------------------------------------------------


def test_local_path_pair_resolves_with_its_settings(localspec_home, tiny_models):
    local_pair(localspec_home, tiny_models.target, tiny_models.draft_noisy, "temperature = 0.2\ndraft_max = 3\n")
    config = load_config(localspec_home)
    resolved = resolve_pair(config.get("local"), config, localspec_home)
    assert (resolved.target, resolved.draft, resolved.name, resolved.label) == (
        tiny_models.target,
        tiny_models.draft_noisy,
        "local",
        "local",
    )
    settings = resolved.defaults
    assert settings.temperature == 0.2 and settings.draft_max == 3 and settings.compat_hint
    assert pair_status(config.get("local"), localspec_home).downloaded
    done = pull_pair(config.get("local"), config, localspec_home)
    assert [d.action for d in done] == ["present", "present"]


def test_generate_runs_a_local_path_pair(localspec_home, tiny_models):
    local_pair(localspec_home, tiny_models.target, tiny_models.draft_same)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "localspec",
            "generate",
            "--pair",
            "local",
            "--max-tokens",
            "6",
            "--temperature",
            "0",
            "the",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "acceptance 100%" in result.stderr  # an identical draft agrees on every token


def test_missing_local_file_says_which_file(localspec_home, tiny_models, tmp_path):
    local_pair(localspec_home, tmp_path / "gone.gguf", tiny_models.draft_same)
    config = load_config(localspec_home)
    with pytest.raises(ModelFileError, match="gone.gguf"):
        resolve_pair(config.get("local"), config, localspec_home)
    with pytest.raises(ModelFileError, match=r"not a file: .*gone\.gguf \(fix the path in .*models\.toml\)"):
        pull_pair(config.get("local"), config, localspec_home)


def test_check_files_tells_same_from_bridged_and_names_the_first_difference(tiny_models):
    assert check_files(tiny_models.target, tiny_models.draft_noisy).kind == "same"
    renamed = check_files(tiny_models.target, tiny_models.vocab_renamed, hint="use another draft")
    assert renamed.kind == "bridged" and renamed.reason.startswith("token 300 differs (target 'M', draft '▁renamed')")
    far = check_files(tiny_models.target, tiny_models.vocab_far_size)
    assert far.kind == "bridged" and "vocabulary sizes differ by 200" in far.reason
    near = check_files(tiny_models.target, tiny_models.vocab_near_size)
    assert near.kind == "bridged" and "draft token 869 ('▁extra0000') is missing from the target's" in near.reason


# --- which pair when none is named --------------------------------------------------------------------------


def test_nothing_downloaded_falls_back_to_the_demo_and_says_so(localspec_home, smollm2_path):
    config = load_config(localspec_home)
    pair, note = choose_pair(None, config, localspec_home)
    assert pair.name == "demo"
    assert f"pair {config.default!r} is not downloaded" in note and "demo of the mechanism" in note
    assert choose_pair("qwen3-8b", config, localspec_home) == (config.get("qwen3-8b"), None)


def test_no_demo_and_nothing_downloaded_tells_what_to_do(localspec_home, monkeypatch):
    monkeypatch.setattr(demo, "packaged_draft", lambda: None)
    config = load_config(localspec_home)
    with pytest.raises(ModelFileError, match=r"run `localspec pull gemma4-e4b`, or install the demo models"):
        choose_pair(None, config, localspec_home)


def test_default_pair_is_used_when_downloaded(localspec_home, tiny_models):
    local_pair(localspec_home, tiny_models.target, tiny_models.draft_same, "")
    localspec_home.config_file.write_text('default = "local"\n' + localspec_home.config_file.read_text())
    pair, note = choose_pair(None, load_config(localspec_home), localspec_home)
    assert (pair.name, note) == ("local", None)


# --- doctor -------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_doctor_names_devices_paths_and_missing_pairs(localspec_home, empty_hf_cache):
    report = run_doctor(localspec_home)
    text = "\n".join(report.lines())
    assert "  device " in text  # by name: "device CPU", "device CUDA0", "device Metal"…
    assert "system info:" in text and str(localspec_home.config_file) in text
    assert "run `localspec pull gemma4-e4b`" in text
    assert str(empty_hf_cache) in text


@pytest.mark.slow
def test_doctor_reports_a_broken_models_toml_instead_of_failing(localspec_home):
    localspec_home.config_dir.mkdir(parents=True)
    localspec_home.config_file.write_text("[pairs.x]\ntarget = 3\n")
    report = run_doctor(localspec_home)
    assert any(f.label == "models.toml" and "pair 'x'" in (f.advice or "") for f in report.problems)


@pytest.mark.slow
def test_doctor_command_prints_the_report(localspec_home):
    result = subprocess.run([sys.executable, "-m", "localspec", "doctor"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Compute:" in result.stdout and "GPU offload:" in result.stdout and "Offline demo:" in result.stdout


@pytest.mark.slow
def test_a_bridged_pair_in_models_toml_generates_and_doctor_and_models_name_it(localspec_home, tiny_models, capsys):
    from localspec.cli.main import main

    localspec_home.config_dir.mkdir(parents=True, exist_ok=True)
    localspec_home.config_file.write_text(
        f'[pairs.bridged]\ntarget = {{ path = "{tiny_models.target}" }}\n'
        f'draft = {{ path = "{tiny_models.vocab_shuffled}" }}\n'
        f'[pairs.same]\ntarget = {{ path = "{tiny_models.target}" }}\n'
        f'draft = {{ path = "{tiny_models.draft_noisy}" }}\n',
        encoding="utf-8",
    )
    report = run_doctor(localspec_home)
    findings = {f.label.split()[0]: f.value for title, found in report.sections if title == "Pairs" for f in found}
    assert "bridged (token 261 differs" in findings["bridged"] and "same vocabulary" in findings["same"]
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    bridged_block = out[out.index("bridged (") : out.index("same (")]
    assert "vocab   bridged: token 261 differs" in bridged_block and "drafts through text" in bridged_block
    assert "vocab" not in out[out.index("same (") :].split("\n\n")[0]
    assert main(["models", "--json"]) == 0
    listed = {p["name"]: p["vocabulary"] for p in json.loads(capsys.readouterr().out)}
    assert listed["bridged"] == "bridged" and listed["same"] == "same"
    assert main(["generate", "hi", "--pair", "bridged", "--max-tokens", "6", "--temperature", "0"]) == 0
    assert capsys.readouterr().err.count("localspec: note: draft tokenizer differs: drafting on the") == 1
    with localspec_home.config_file.open("a", encoding="utf-8") as f:  # the pair's own mode; the flag wins
        f.write(f'[pairs.text]\ntarget = {{ path = "{tiny_models.target}" }}\n')
        f.write(f'draft = {{ path = "{tiny_models.vocab_shuffled}" }}\nbridge = "text"\n')
    assert main(["generate", "hi", "--pair", "text", "--max-tokens", "6"]) == 0
    assert "draft tokenizer differs: drafting through text" in capsys.readouterr().err
    assert main(["generate", "hi", "--pair", "text", "--max-tokens", "6", "--bridge", "shared"]) == 0
    assert "draft tokenizer differs: drafting on the" in capsys.readouterr().err
