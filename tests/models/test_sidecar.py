"""The sidecar drafter a repository ships beside its model (issue 64, item 3): llama-server's rule for finding an
`mtp-*.gguf` (ggml-org/llama.cpp common/download.cpp, `find_best_sibling`; its cases in
tests/test-model-resolution.cpp), and `pull` of a pair that names only its target fetching it (with the projector)
through a local fake Hub and the real huggingface_hub client, then `models`, `doctor` and `generate` using it as the
pair's draft.

The files are the tiny image-reading trio (tests/support/tinyvision.py): its draft stands in for the sidecar (same
vocabulary as the target), so the pairing check `pull` runs on a draft passes as it would for a named one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.fakehub import FakeHub, cli_env
from support.tinyvision import TinyVision

from localspec.models import hub

# Repository listings of llama.cpp's test fixtures (tests/test-model-resolution.cpp @039426a), named for the real
# repositories they copy, and the file it finds for a model file and tag.
FLAT = [  # "in the style of ggml-org/gemma-4-31B-it-GGUF"
    "README.md",
    "model-BF16.gguf",
    "model-Q4_K_M.gguf",
    "model-Q8_0.gguf",
    "mmproj-model-BF16.gguf",
    "mmproj-model-Q8_0.gguf",
    "mtp-model-BF16.gguf",
    "mtp-model-Q4_0.gguf",
    "mtp-model-Q8_0.gguf",
    "dflash-model-BF16.gguf",
    "dflash-model-Q8_0.gguf",
]
SUBDIR = [  # quants in folders, split files, the sidecars at the root
    "mmproj-model-f16.gguf",
    "model-mtp-BF16.gguf",
    "model-mtp-Q8_0.gguf",
    "Q3_K_M/model-Q3_K_M-00001-of-00003.gguf",
    "Q3_K_M/model-Q3_K_M-00002-of-00003.gguf",
    "Q3_K_M/model-Q3_K_M-00003-of-00003.gguf",
    "Q8_0/model-Q8_0-00001-of-00002.gguf",
    "Q8_0/model-Q8_0-00002-of-00002.gguf",
]
UNSLOTH = ["model-UD-Q8_K_XL.gguf", "mmproj-BF16.gguf", "model-MTP-BF16.gguf"]  # a suffix -MTP file: not a sidecar
GEMMA = [  # the names ggml-org/gemma-4-E4B-it-GGUF is recorded with in public catalogs (models.toml says where)
    "gemma-4-E4B-it-Q4_K_M.gguf",
    "gemma-4-E4B-it-Q8_0.gguf",
    "mmproj-gemma-4-E4B-it-Q8_0.gguf",
    "mtp-gemma-4-E4B-it-Q8_0.gguf",
]


@pytest.mark.parametrize(
    ("files", "model", "tag", "expected"),
    [
        (FLAT, "model-Q8_0.gguf", "Q8_0", "mtp-model-Q8_0.gguf"),  # the exact tag
        (FLAT, "model-Q4_K_M.gguf", "", "mtp-model-Q4_0.gguf"),  # no tag: the bits closest to the model file's
        (FLAT, "model-BF16.gguf", "BF16", "mtp-model-BF16.gguf"),
        (SUBDIR, "Q3_K_M/model-Q3_K_M-00001-of-00003.gguf", "Q3_K_M", "model-mtp-Q8_0.gguf"),  # a folder above
        (UNSLOTH, "model-UD-Q8_K_XL.gguf", "Q8_K_XL", None),  # "mtp-" as written: -MTP- is not one
        (GEMMA, "gemma-4-E4B-it-Q4_K_M.gguf", "Q4_K_M", "mtp-gemma-4-E4B-it-Q8_0.gguf"),  # the only one
        (["m-Q8_0.gguf", "mmproj-m-f16.gguf"], "m-Q8_0.gguf", "Q8_0", None),  # a repo that ships none
    ],
)
def test_the_sidecar_is_found_by_llama_servers_rule_whatever_the_listing_order(files, model, tag, expected):
    for turn in range(len(files)):
        listing = files[turn:] + files[:turn]
        listing = listing[::-1] if turn % 2 else listing
        assert hub.sidecar_name(listing, model, tag) == expected, listing


def test_a_quant_never_picks_a_sidecar_as_the_model():
    """llama.cpp's `gguf_filename_is_model`: mtp-, eagle3-, dflash-, dspark- and imatrix files are not models; a
    model that keeps its MTP head inside (unsloth's `…-MTP-…`, upper case) still is."""
    assert hub.match_quant(FLAT, "Q8_0") == ["model-Q8_0.gguf"]
    assert hub.match_quant(["mtp-m-Q8_0.gguf", "dflash-m-Q8_0.gguf", "imatrix-Q8_0.gguf"], "Q8_0") == []
    assert hub.available_quants(FLAT) == ["BF16", "Q4_K_M", "Q8_0"]
    assert hub.match_quant(["Qwen3.5-9B-MTP-Q4_K_M.gguf"], "Q4_K_M") == ["Qwen3.5-9B-MTP-Q4_K_M.gguf"]
    assert hub.is_sidecar("MTP/mtp-gemma-4-E4B-it-BF16.gguf") and not hub.is_sidecar("model-MTP-BF16.gguf")


# --- pull, models, doctor and generate through the fake Hub -------------------------------------------------

PAIRS = """
[pairs.eyes]
description = "a target whose repository ships a sidecar drafter and a projector"
target = "test/vision-GGUF:Q8_0"
mmproj = "test/vision-GGUF"

[pairs.plain]
description = "a target whose repository ships a projector only"
target = "test/plain-GGUF:Q8_0"
mmproj = "test/plain-GGUF"
"""


@pytest.fixture
def fake(tiny_vision: TinyVision):
    vision = tiny_vision
    hub_ = FakeHub()
    for repo in ("test/vision-GGUF", "test/plain-GGUF"):
        hub_.add(repo, "vision-Q8_0.gguf", vision.target.read_bytes())
        hub_.add(repo, "mmproj-vision-f16.gguf", vision.mmproj.read_bytes())
    hub_.add("test/vision-GGUF", "mtp-vision-Q8_0.gguf", vision.draft.read_bytes())
    hub_.start()
    yield hub_
    hub_.stop()


@pytest.fixture
def env(fake, tmp_path):
    """The CLI's environment, as test_hub's: the fake Hub, a private HF cache, a LOCALSPEC_HOME with the pairs above."""
    return cli_env(fake, tmp_path, PAIRS)


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "localspec", *args], env=env, capture_output=True, text=True, timeout=60
    )


def cached(env: dict) -> list[str]:
    return sorted(p.name for p in Path(env["HF_HUB_CACHE"]).rglob("*.gguf") if "snapshots" in p.parts)


def listed(env: dict) -> dict[str, dict]:
    result = cli(env, "models", "--json")
    assert result.returncode == 0, result.stderr
    return {p["name"]: p for p in json.loads(result.stdout)}


@pytest.mark.slow
def test_pull_of_a_target_alone_fetches_the_sidecar_drafter_and_the_projector_and_uses_it(env, fake):
    before = listed(env)["eyes"]
    assert before["draft"] is None and before["sidecar"] is None  # not known before `pull` asks the Hub
    dry = cli(env, "pull", "eyes", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "  draft   test/vision-GGUF/mtp-vision-Q8_0.gguf: would download" in dry.stdout
    assert cached(env) == []

    result = cli(env, "pull", "eyes")
    assert result.returncode == 0, result.stderr
    assert "draft: mtp-vision-Q8_0.gguf is the drafter test/vision-GGUF ships beside the target" in result.stdout
    assert "  target  test/vision-GGUF:Q8_0: downloaded" in result.stdout  # the quant picked the model, not the sidecar
    assert "  draft   test/vision-GGUF/mtp-vision-Q8_0.gguf: downloaded" in result.stdout
    assert "  mmproj  test/vision-GGUF:F16: downloaded" in result.stdout
    assert "ok: the draft can draft for the target" in result.stdout
    assert "mmproj: the target sees images" in result.stdout
    assert cached(env) == ["mmproj-vision-f16.gguf", "mtp-vision-Q8_0.gguf", "vision-Q8_0.gguf"]

    pair = listed(env)["eyes"]
    assert pair["draft"] == "test/vision-GGUF/mtp-vision-Q8_0.gguf" and pair["downloaded"] is True
    assert (pair["sidecar"], pair["sidecar_found"], pair["vocabulary"]) == ("mtp-vision-Q8_0.gguf", True, "same")
    text = cli(env, "models").stdout
    assert "    sidecar mtp-vision-Q8_0.gguf: the drafter the target's repository ships (found by `pull`" in text
    [line] = [line for line in cli(env, "doctor").stdout.splitlines() if line.startswith("  eyes [user]:")]
    assert "draft ok" in line and "sidecar drafter mtp-vision-Q8_0.gguf" in line

    fake.stop()  # what was pulled is used with no network: the pair drafts with its sidecar
    again = cli(env, "pull", "eyes")
    assert again.returncode == 0 and again.stdout.count("already downloaded") == 3, again.stderr
    generated = cli(env, "generate", "--pair", "eyes", "--max-tokens", "8", "--temperature", "0", "--json", "hello")
    assert generated.returncode == 0, generated.stderr
    assert json.loads(generated.stdout)["drafter"] in ("model", "model+ngram")


@pytest.mark.slow
def test_pull_of_a_target_whose_repository_ships_no_sidecar_fetches_the_target_alone(env, fake):
    result = cli(env, "pull", "plain")
    assert result.returncode == 0, result.stderr
    assert "  draft " not in result.stdout and "draft: " not in result.stdout, result.stdout
    assert "no draft and no MTP head" in result.stdout and "ok: the target loads" in result.stdout
    assert cached(env) == ["mmproj-vision-f16.gguf", "vision-Q8_0.gguf"]
    pair = listed(env)["plain"]
    assert (pair["draft"], pair["sidecar"], pair["sidecar_found"], pair["downloaded"]) == (None, None, False, True)
