"""`localspec pull` / `models` end to end against a local fake Hub, with the real huggingface_hub client.

Each test runs the real CLI in a subprocess whose HF_ENDPOINT points at `fakehub.FakeHub` on 127.0.0.1
(huggingface_hub reads its endpoint and cache folder at import), with its own HF cache and LOCALSPEC_HOME.
Nothing leaves the machine.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.fakehub import FakeHub, cli_env
from support.tinymodels import write_mtp_model

CHUNK = 10 * 1024 * 1024  # huggingface_hub streams downloads in 10 MiB chunks and resumes at chunk bounds

USER_PAIRS = """
[pairs.tiny]
description = "tiny test pair"
target = "test/Qwen2.5-tiny-GGUF:Q8_0"
draft = "test/tiny-draft-GGUF:Q8_0"

[pairs.renamed]
target = "test/Qwen2.5-tiny-GGUF:Q8_0"
draft = "test/tiny-renamed-GGUF:Q8_0"

[pairs.big]
target = "test/big-GGUF:Q8_0"
draft = "test/tiny-draft-GGUF:Q8_0"

[pairs.gated]
target = "test/gated-GGUF:Q8_0"
draft = "test/tiny-draft-GGUF:Q8_0"

[pairs.forbidden]
target = "test/forbidden-GGUF:Q8_0"
draft = "test/tiny-draft-GGUF:Q8_0"

[pairs.noquant]
target = "test/Qwen2.5-tiny-GGUF:Q5_K_S"
draft = "test/tiny-draft-GGUF:Q8_0"

[pairs.nofile]
target = { repo = "test/Qwen2.5-tiny-GGUF", file = "nope.gguf" }
draft = "test/tiny-draft-GGUF:Q8_0"

[pairs.alone]
description = "a target that drafts with its own MTP head"
target = "test/Qwen3.5-tiny-MTP-GGUF:Q8_0"
"""


@pytest.fixture
def fake_hub(tiny_models, tmp_path):
    target = tiny_models.target.read_bytes()
    hub = FakeHub()
    mtp = write_mtp_model(tmp_path / "tiny-mtp.gguf").read_bytes()
    hub.add("test/Qwen3.5-tiny-MTP-GGUF", "Qwen3.5-tiny-Q8_0.gguf", mtp)
    hub.add("test/Qwen2.5-tiny-GGUF", "tiny-Q8_0.gguf", target)
    hub.add("test/Qwen2.5-tiny-GGUF", "tiny-Q4_K_M.gguf", target)
    hub.add("test/Qwen2.5-tiny-GGUF", "tiny-F16.gguf", target)
    hub.add("test/Qwen2.5-tiny-GGUF", "mmproj-tiny-f16.gguf", b"GGUF not a model")
    hub.add("test/Qwen2.5-tiny-GGUF", "README.md", b"# tiny")
    hub.add("test/tiny-draft-GGUF", "tiny-draft-Q8_0.gguf", tiny_models.draft_noisy.read_bytes())
    hub.add("test/tiny-renamed-GGUF", "tiny-renamed-Q8_0.gguf", tiny_models.vocab_renamed.read_bytes())
    # Trailing bytes are ignored by llama.cpp; they make the file span two of huggingface_hub's chunks.
    hub.add("test/big-GGUF", "big-Q8_0.gguf", target + bytes(CHUNK + CHUNK // 2))
    hub.add("test/gated-GGUF", "gated-Q8_0.gguf", target)
    hub.gate("test/gated-GGUF", 401, "GatedRepo")
    hub.add("test/forbidden-GGUF", "forbidden-Q8_0.gguf", target)
    hub.gate("test/forbidden-GGUF", 403, None)
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture
def env(fake_hub, tmp_path):
    """Environment of the CLI subprocess: the fake Hub, a private HF cache and LOCALSPEC_HOME with test pairs."""
    return cli_env(fake_hub, tmp_path, USER_PAIRS)


def cli(env: dict, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "localspec", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The CLI failed with exactly one line on stderr; return it."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("localspec: error: "), result.stderr
    return lines[0]


def cached_files(env: dict) -> list[Path]:
    return sorted(p for p in Path(env["HF_HUB_CACHE"]).rglob("*.gguf") if "snapshots" in p.parts)


# --- pull ---------------------------------------------------------------------------------------------------


def test_pull_downloads_both_files_and_checks_the_pair(env, fake_hub, tiny_models):
    result = cli(env, "pull", "tiny")
    assert result.returncode == 0, result.stderr
    assert "target  test/Qwen2.5-tiny-GGUF:Q8_0: downloaded" in result.stdout
    assert "ok: the draft can draft for the target" in result.stdout
    names = [p.name for p in cached_files(env)]
    assert names == ["tiny-Q8_0.gguf", "tiny-draft-Q8_0.gguf"]  # the quant picked one of three copies
    assert len(fake_hub.file_gets("tiny-Q8_0.gguf")) == 1
    cached_target = next(p for p in cached_files(env) if p.name == "tiny-Q8_0.gguf")
    assert cached_target.read_bytes() == tiny_models.target.read_bytes()


@pytest.mark.slow
def test_pull_of_a_target_alone_downloads_the_target_only(env, fake_hub):
    """A pair with no draft: `pull` fetches the target, checks that it loads and says what drafts for it."""
    dry = cli(env, "pull", "alone", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert [line.split(":")[0] for line in dry.stdout.splitlines()[1:]] == ["  target  test/Qwen3.5-tiny-MTP-GGUF"]
    result = cli(env, "pull", "alone")
    assert result.returncode == 0, result.stderr
    assert "target  test/Qwen3.5-tiny-MTP-GGUF:Q8_0: downloaded" in result.stdout
    assert "no draft: the target drafts with its own MTP head (1 MTP layer)" in result.stdout
    assert "ok: the target loads" in result.stdout and "draft  " not in result.stdout
    assert [p.name for p in cached_files(env)] == ["Qwen3.5-tiny-Q8_0.gguf"]
    gets = [r.path for r in fake_hub.requests if r.method == "GET" and "/resolve/" in r.path]
    assert gets and all("Qwen3.5-tiny-MTP-GGUF" in p for p in gets)  # nothing else was fetched
    listed = {p["name"]: p for p in json.loads(cli(env, "models", "--json").stdout)}
    assert listed["alone"]["downloaded"] is True and listed["alone"]["draft"] is None
    assert listed["alone"]["mtp_layers"] == 1


@pytest.mark.slow
def test_second_pull_is_a_no_op_without_network(env, fake_hub):
    assert cli(env, "pull", "tiny").returncode == 0
    before = len(fake_hub.requests)
    fake_hub.stop()
    again = cli(env, "pull", "tiny")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already downloaded") == 2
    assert len(fake_hub.requests) == before


@pytest.mark.slow
def test_pull_again_mends_a_damaged_download(env, fake_hub, tiny_models, monkeypatch):
    """A cached file cut short after its download (a disk error, a copy gone wrong): what serve and `models` say of
    the pair names `localspec pull NAME` again, and that pull downloads it again (not "already downloaded")."""
    from huggingface_hub import constants

    from localspec.models.catalog import load_config
    from localspec.models.pairs import damage, pair_status
    from localspec.paths import get_paths

    assert cli(env, "pull", "tiny").returncode == 0
    target = next(p for p in cached_files(env) if p.name == "tiny-Q8_0.gguf")
    target.resolve().write_bytes(target.read_bytes()[:5000])
    monkeypatch.setattr(constants, "HF_HUB_CACHE", env["HF_HUB_CACHE"])
    paths = get_paths({"LOCALSPEC_HOME": env["LOCALSPEC_HOME"]})
    said = damage(pair_status(load_config(paths).get("tiny"), paths), paths)
    assert said.startswith("the target: could not load") and said.endswith(": run `localspec pull tiny` again")
    again = cli(env, "pull", "tiny")
    assert again.returncode == 0, again.stderr
    assert "tiny-Q8_0.gguf: the file is truncated or corrupt" in again.stdout and "fetching it again" in again.stdout
    assert "target  test/Qwen2.5-tiny-GGUF:Q8_0: downloaded" in again.stdout
    assert target.read_bytes() == tiny_models.target.read_bytes()
    assert again.stdout.count("already downloaded") == 1  # the draft, whole, stays


@pytest.mark.slow
def test_a_cut_connection_resumes_with_a_range_request(env, fake_hub):
    data = fake_hub.repos["test/big-GGUF"]["big-Q8_0.gguf"]
    fake_hub.cut_first_download("big-Q8_0.gguf", after_bytes=CHUNK + 4096)
    result = cli(env, "pull", "big")
    assert result.returncode == 0, result.stderr
    gets = fake_hub.file_gets("big-Q8_0.gguf")
    assert len(gets) == 2
    assert "Range" not in gets[0].headers
    assert gets[1].headers.get("Range") == f"bytes={CHUNK}-"  # only the missing part was fetched again
    cached = next(p for p in cached_files(env) if p.name == "big-Q8_0.gguf")
    assert cached.read_bytes() == data


def test_dry_run_reports_sizes_and_downloads_nothing(env, fake_hub, tiny_models):
    result = cli(env, "pull", "tiny", "--dry-run")
    assert result.returncode == 0, result.stderr
    size = tiny_models.target.stat().st_size / 2**10
    assert f"test/Qwen2.5-tiny-GGUF:Q8_0: would download {size:.0f} KiB" in result.stdout
    assert not fake_hub.file_gets(".gguf") and not cached_files(env)


def test_progress_callback_reports_bytes(env, fake_hub, tiny_models):
    script = (
        "from localspec.models.catalog import ModelSource\nfrom localspec.models import hub\nseen = []\n"
        "path = hub.download(ModelSource.model_validate('test/tiny-draft-GGUF:Q8_0'),"
        " progress=lambda name, done, total: seen.append((name, done, total)))\n"
        "print(seen[-1][1], seen[-1][2], path.name)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    size = tiny_models.draft_noisy.stat().st_size
    assert result.stdout.split() == [str(size), str(size), "tiny-draft-Q8_0.gguf"], result.stderr


# --- failures: one line that says what to do ----------------------------------------------------------------


def test_missing_quant_lists_the_quants_the_repo_has(env):
    line = one_error_line(cli(env, "pull", "noquant"))
    assert "test/Qwen2.5-tiny-GGUF has no Q5_K_S file; quants it has: F16, Q4_K_M, Q8_0" in line
    assert "mmproj" not in line


def test_missing_file_lists_the_gguf_files(env):
    line = one_error_line(cli(env, "pull", "nofile"))
    assert "has no file 'nope.gguf'" in line and "tiny-Q8_0.gguf" in line


@pytest.mark.parametrize("pair", ["gated", "forbidden"])
def test_gated_repo_says_how_to_log_in(env, pair):
    line = one_error_line(cli(env, "pull", pair))
    assert f"test/{pair}-GGUF" in line
    assert "hf auth login" in line and "HF_TOKEN" in line


@pytest.mark.slow
def test_dead_network_is_one_line_and_fast(env, fake_hub):
    fake_hub.stop()  # nothing listens on the port any more: connection refused
    start = time.monotonic()
    line = one_error_line(cli(env, "pull", "tiny"))
    assert "cannot reach the Hugging Face Hub" in line and "network" in line
    assert time.monotonic() - start < 20


@pytest.mark.slow
def test_offline_mode_uses_the_cache_and_says_what_is_missing(env, fake_hub):
    assert cli(env, "pull", "tiny").returncode == 0
    fake_hub.stop()
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    result = cli(offline, "pull", "tiny")
    assert result.returncode == 0 and result.stdout.count("already downloaded") == 2, result.stderr
    generated = cli(offline, "generate", "--pair", "tiny", "--max-tokens", "4", "--temperature", "0", "hello")
    assert generated.returncode == 0, generated.stderr
    line = one_error_line(cli(offline, "pull", "renamed"))
    assert "HF_HUB_OFFLINE" in line and "test/tiny-renamed-GGUF:Q8_0" in line


def test_a_draft_with_another_vocabulary_is_found_bridged_right_after_download(env):
    result = cli(env, "pull", "renamed")
    assert result.returncode == 0, result.stderr
    assert "the vocabularies differ (token 300 differs" in result.stdout
    assert "the draft will draft through text" in result.stdout


def test_not_downloaded_pair_tells_to_pull(env):
    line = one_error_line(cli(env, "generate", "--pair", "tiny", "hello"))
    assert "run `localspec pull tiny`" in line


# --- models -------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_models_json_lists_curated_and_user_pairs_with_download_state(env):
    assert cli(env, "pull", "tiny").returncode == 0
    result = cli(env, "models", "--json")
    assert result.returncode == 0, result.stderr
    pairs = {p["name"]: p for p in json.loads(result.stdout)}
    curated = [
        p for p in pairs.values() if p["source"] == "bundled" and "/" in p["target"] and "/" in (p["draft"] or "/")
    ]
    assert len(curated) >= 6
    assert {"name", "target", "draft", "downloaded", "source", "description"} <= set(pairs["tiny"])
    assert pairs["tiny"]["source"] == "user" and pairs["tiny"]["downloaded"] is True
    assert pairs["tiny"]["files"]["target"]["size"] > 0
    assert pairs["gated"]["downloaded"] is False and pairs["qwen2.5-7b"]["downloaded"] is False
    assert "not a good chat model" in pairs["demo"]["description"]
    text = cli(env, "models")
    assert text.returncode == 0 and "tiny (user) — tiny test pair" in text.stdout


@pytest.mark.slow
def test_pull_all_dry_run_goes_on_after_a_failure_and_says_what_it_could_not_check(env):
    result = cli(env, "pull", "--all", "--dry-run")
    assert result.returncode == 0  # a dry run: the bundled repositories, not on the fake Hub, are reported
    assert "dry run: pull tiny" in result.stdout and "would download" in result.stdout
    unchecked = [line for line in result.stdout.splitlines() if line.startswith("  could not check: ")]
    assert any("test/gated-GGUF is gated" in line for line in unchecked)
    [summary] = result.stderr.strip().splitlines()  # one line, not an error per pair mixed into the listing
    assert summary.startswith(f"localspec: note: dry run: {len(unchecked)} of ") and "could not be checked" in summary


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            OSError(errno.ENOSPC, "No space left on device"),
            "the disk is full while downloading a/b:Q8_0 (it needs 2.0 GiB)",
        ),
        (OSError(errno.EACCES, "Permission denied"), "cannot write a/b:Q8_0 into"),
        (ConnectionResetError("reset"), "cannot reach the Hugging Face Hub"),
    ],
)
def test_os_errors_become_one_line(error, expected):
    from localspec.errors import DownloadError
    from localspec.models.catalog import ModelSource
    from localspec.models.hub import hub_errors

    with pytest.raises(DownloadError) as info, hub_errors(ModelSource.model_validate("a/b:Q8_0"), 2 * 2**30):
        raise error
    assert expected in str(info.value) and "\n" not in str(info.value)
