"""Pairs with a projector (issue 59, item 1): `mmproj` in models.toml, resolving it (and `--mmproj`), pulling it
with the pair through a local fake Hub and opening it beside the target, and what `models` and `doctor` say.

The files are the tiny image-reading trio (tests/support/tinyvision.py): a llama target, its draft and a LLaVA-style
projector mtmd opens beside the target, plus a projector whose output size is not the target's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.fakehub import FakeHub, cli_env
from support.tinyvision import TinyVision, write_tiny_vision

from localspec.errors import ConfigError, InvalidParamsError
from localspec.models import hub
from localspec.models.catalog import DEFAULT_PROJECTOR_QUANT, read_models_file
from localspec.models.flags import RunFlags
from localspec.models.loading import resolve_models

PAIRS = """
[pairs.eyes]
target = "test/vision-GGUF:Q8_0"
draft = "test/vision-draft-GGUF:Q8_0"
mmproj = "test/vision-GGUF"

[pairs.blind]
target = "test/vision-GGUF:Q8_0"
draft = "test/vision-draft-GGUF:Q8_0"
mmproj = { repo = "test/vision-GGUF", file = "mmproj-wrong-size-f16.gguf" }
"""


@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory) -> TinyVision:
    return write_tiny_vision(tmp_path_factory.mktemp("vision"))


def models_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(body, encoding="utf-8")
    return path


# --- models.toml --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "label"),
    [
        ('"owner/repo-GGUF"', f"owner/repo-GGUF:{DEFAULT_PROJECTOR_QUANT}"),  # a projector's quant, not Q4_K_M
        ('"owner/repo-GGUF:Q8_0"', "owner/repo-GGUF:Q8_0"),
        ('{ repo = "owner/repo-GGUF" }', f"owner/repo-GGUF:{DEFAULT_PROJECTOR_QUANT}"),
        ('{ repo = "owner/repo-GGUF", file = "mmproj-model-f16.gguf" }', "owner/repo-GGUF/mmproj-model-f16.gguf"),
    ],
)
def test_a_pair_names_its_projector_in_the_forms_a_model_takes(tmp_path, value, label):
    body = f'[pairs.p]\ntarget = "owner/repo-GGUF:Q4_K_M"\nmmproj = {value}\n'
    spec = read_models_file(models_file(tmp_path, body)).pairs["p"]
    assert spec.mmproj is not None and (spec.mmproj.kind, spec.mmproj.label()) == ("hub", label)
    assert spec.target.quant == "Q4_K_M"  # the target's default is untouched


def test_a_local_projector_is_relative_to_its_models_toml(tmp_path):
    body = '[pairs.p]\ntarget = { path = "t.gguf" }\nmmproj = { path = "proj/mmproj.gguf" }\n'
    spec = read_models_file(models_file(tmp_path, body)).pairs["p"]
    assert spec.mmproj is not None and spec.mmproj.path == tmp_path / "proj" / "mmproj.gguf"
    plain = read_models_file(models_file(tmp_path, '[pairs.p]\ntarget = "a/b"\n')).pairs["p"]
    assert plain.mmproj is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('"not a ref"', "owner/repo:QUANT"),
        ('{ builtin = "smollm2-135m-instruct-f32" }', "a projector is a Hub file"),
        ('{ repo = "a/b", file = "m.gguf", quant = "F16" }', "not both"),
        ('{ repo = "a/b", flie = "m.gguf" }', "unknown key"),
        ("3", "mmproj"),
    ],
)
def test_a_bad_projector_is_one_line_naming_pair_and_field(tmp_path, value, expected):
    with pytest.raises(ConfigError) as info:
        read_models_file(models_file(tmp_path, f'[pairs.bad]\ntarget = "a/b"\nmmproj = {value}\n'))
    message = str(info.value)
    assert "\n" not in message and "pair 'bad'" in message and "mmproj" in message, message
    assert expected in message, message


def test_a_quant_picks_among_projector_files_only():
    files = ["m-F16.gguf", "m-Q8_0.gguf", "mmproj-m-f16.gguf", "mmproj-m-Q8_0.gguf"]
    assert hub.match_quant(files, "F16") == ["m-F16.gguf"]
    assert hub.match_quant(files, "F16", projector=True) == ["mmproj-m-f16.gguf"]
    assert hub.match_quant(files, "Q4_K_M", projector=True) == []


# --- resolving: the pair's projector, --mmproj --------------------------------------------------------------


def test_resolving_gives_the_pairs_projector_and_mmproj_replaces_it(localspec_home, vision, tmp_path):
    localspec_home.config_dir.mkdir(parents=True)
    localspec_home.config_file.write_text(
        f'[pairs.local]\ntarget = {{ path = "{vision.target}" }}\ndraft = {{ path = "{vision.draft}" }}\n'
        f'mmproj = {{ path = "{vision.mmproj}" }}\n'
        f'[pairs.gone]\ntarget = {{ path = "{vision.target}" }}\nmmproj = {{ path = "{tmp_path / "nope.gguf"}" }}\n',
        encoding="utf-8",
    )
    resolved = resolve_models(RunFlags(pair="local"), localspec_home)
    assert (resolved.target, resolved.draft, resolved.mmproj) == (vision.target, vision.draft, vision.mmproj)
    other = vision.mmproj_wrong_size
    assert resolve_models(RunFlags(pair="local", mmproj=str(other)), localspec_home).mmproj == other
    gone = resolve_models(RunFlags(pair="gone"), localspec_home)  # text still works; the notice says why no images
    assert gone.mmproj is None and "reads text only" in gone.defaults.notice and "fix the path" in gone.defaults.notice


def test_mmproj_goes_with_target_files_or_a_named_pair(localspec_home, vision):
    files = resolve_models(RunFlags(target=str(vision.target), mmproj=str(vision.mmproj)), localspec_home)
    assert (files.target, files.draft, files.mmproj, files.name) == (vision.target, None, vision.mmproj, None)
    assert resolve_models(RunFlags(target=str(vision.target)), localspec_home).mmproj is None
    with pytest.raises(InvalidParamsError, match="--mmproj needs the model it was made for"):
        resolve_models(RunFlags(mmproj=str(vision.mmproj)), localspec_home)


# --- pull, models and doctor through the fake Hub ----------------------------------------------------------


@pytest.fixture
def env(vision, tmp_path):
    """The CLI's environment, as test_hub's: a fake Hub serving the trio (and the wrong projector), a private HF cache
    and a LOCALSPEC_HOME whose models.toml has the pairs above."""
    fake = FakeHub()
    fake.add("test/vision-GGUF", "vision-Q8_0.gguf", vision.target.read_bytes())
    fake.add("test/vision-GGUF", "mmproj-vision-f16.gguf", vision.mmproj.read_bytes())
    fake.add("test/vision-GGUF", "mmproj-wrong-size-f16.gguf", vision.mmproj_wrong_size.read_bytes())
    fake.add("test/vision-draft-GGUF", "vision-draft-Q8_0.gguf", vision.draft.read_bytes())
    fake.start()
    yield cli_env(fake, tmp_path, PAIRS)
    fake.stop()


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "localspec", *args], env=env, capture_output=True, text=True, timeout=60
    )


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("localspec: error: "), result.stderr
    return lines[0]


def cached_files(env: dict) -> list[Path]:
    return sorted(p for p in Path(env["HF_HUB_CACHE"]).rglob("*.gguf") if "snapshots" in p.parts)


def listed(env: dict) -> dict[str, dict]:
    result = cli(env, "models", "--json")
    assert result.returncode == 0, result.stderr
    return {p["name"]: p for p in json.loads(result.stdout)}


@pytest.mark.slow
def test_models_and_doctor_say_images_after_pull_for_a_pair_not_pulled(env):
    before = listed(env)["eyes"]
    assert before["mmproj"] == "test/vision-GGUF:F16" and before["downloaded"] is False
    assert before["vision"] is None and before["audio"] is None  # not known before the projector is here
    assert listed(env)["qwen2.5-7b"]["vision"] is False  # a text-only pair
    text = cli(env, "models").stdout
    assert "    mmproj  test/vision-GGUF:F16  [not downloaded]" in text
    assert "    media   images (after `localspec pull eyes`" in text
    dry = cli(env, "pull", "eyes", "--dry-run")
    assert dry.returncode == 0 and "  mmproj  test/vision-GGUF:F16: would download" in dry.stdout, dry.stderr
    doctor = cli(env, "doctor")
    [line] = [line for line in doctor.stdout.splitlines() if line.startswith("  eyes [user]:")]
    assert "mmproj missing (test/vision-GGUF:F16)" in line and "media: images (after `localspec pull eyes`" in line


@pytest.mark.slow
def test_pull_downloads_the_projector_with_the_pair_and_opens_it_beside_the_target(env):
    result = cli(env, "pull", "eyes")
    assert result.returncode == 0, result.stderr
    assert "mmproj: downloading test/vision-GGUF:F16" in result.stdout
    assert "  mmproj  test/vision-GGUF:F16: downloaded" in result.stdout
    assert "mmproj: the target sees images" in result.stdout  # the probe's answer, from the child process
    assert [p.name for p in cached_files(env)] == [
        "mmproj-vision-f16.gguf",
        "vision-Q8_0.gguf",
        "vision-draft-Q8_0.gguf",
    ]
    pair = listed(env)["eyes"]
    assert pair["downloaded"] is True and (pair["vision"], pair["audio"]) == (True, False)
    assert pair["files"]["mmproj"]["size"] > 0
    assert "    media   sees images\n" in cli(env, "models").stdout
    [line] = [line for line in cli(env, "doctor").stdout.splitlines() if line.startswith("  eyes [user]:")]
    assert "mmproj ok" in line and "media: sees images" in line


@pytest.mark.slow
def test_a_projector_that_does_not_fit_its_target_is_one_line_and_the_files_stay(env):
    line = one_error_line(cli(env, "pull", "blind"))
    assert "pair 'blind'" in line and "does not match target" in line and "the files stay downloaded" in line
    assert "mmproj-wrong-size-f16.gguf" in {p.name for p in cached_files(env)}
    assert listed(env)["blind"]["downloaded"] is True  # nothing was deleted: a fixed file can replace it
