"""A damaged file in models.toml (issue 44): `models`, `doctor`, `pull`, the chat's pair list and `serve` name it in
one line and go on with the other pairs; a target alone is described as its header shows it, never called usable
when it is not. The files are the tiny models damaged by the `gguf` package (`rewrite_gguf`)."""

from __future__ import annotations

import json
import signal

import pytest
from gguf import GGUFValueType as T
from support.server import error_of, raw, start_server
from support.tinymodels import Qwen35Shape, rewrite_gguf, write_mtp_model, write_truncated

from localspec.cli.doctor import run_doctor
from localspec.cli.main import main
from localspec.tui.loading import list_pairs
from localspec.tui.settings import ChatOptions


@pytest.fixture(scope="module")
def files(tiny_models, tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    mtp = write_mtp_model(d / "mtp.gguf")
    return {
        "good": (tiny_models.target, tiny_models.draft_noisy),
        # a block count of 10^12: a MemoryError out of the header reader before
        "huge-blocks": (rewrite_gguf(tiny_models.target, d / "huge.gguf", {"llama.block_count": (10**12, T.UINT64)}),),
        # 4e9 MTP layers in 3 blocks: llama.cpp's GGML_ASSERT(n_layer_nextn <= n_layer_all) before
        "abort": (rewrite_gguf(mtp, d / "abort.gguf", {"qwen35.nextn_predict_layers": (4_000_000_000, T.UINT32)}),),
        "bad-draft": (
            tiny_models.target,
            rewrite_gguf(tiny_models.draft_noisy, d / "d.gguf", {"llama.block_count": (0, T.UINT32)}),
        ),
        "truncated-head": (write_truncated(mtp, d / "truncated-mtp.gguf"),),
        "head-missing": (rewrite_gguf(mtp, d / "no-head.gguf", {}, drop=lambda n: n.startswith("blk.2.")),),
        "no-tokenizer": (tiny_models.no_tokenizer,),
        "two-blocks": (write_mtp_model(d / "two.gguf", shape=Qwen35Shape(n_nextn=2)),),
        "one-head": (mtp,),
    }


def write_config(home, files) -> None:
    home.config_dir.mkdir(parents=True, exist_ok=True)
    lines = ['default = "good"']
    for name, paths in files.items():
        lines.append(f'[pairs."{name}"]\ntarget = {{ path = "{paths[0]}" }}\nn_ctx = 256')
        if len(paths) > 1:
            lines.append(f'draft = {{ path = "{paths[1]}" }}')
    home.config_file.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def home(localspec_home, files):
    write_config(localspec_home, files)
    return localspec_home


def blocks(out: str) -> dict[str, str]:
    """`localspec models`' output, by pair."""
    found = {}
    for block in out.split("\n\n")[0].split("\n"):
        if not block.startswith(" "):
            name = block.split(" ", 1)[0]
            found[name] = ""
        else:
            found[name] += block.strip() + "\n"
    return found


def test_models_lists_every_pair_and_names_each_damaged_file(home, capsys):
    assert main(["models"]) == 0  # before: a MemoryError traceback, no pair listed
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    pairs = blocks(out.out)
    assert set(pairs) >= {
        "good",
        "huge-blocks",
        "abort",
        "bad-draft",
        "truncated-head",
        "head-missing",
        "no-tokenizer",
        "two-blocks",
        "one-head",
    }
    assert "damaged" not in pairs["good"] and "damaged" not in pairs["one-head"]
    assert "damaged the target huge.gguf has a damaged header (block_count 1000000000000" in pairs["huge-blocks"]
    assert "damaged the target abort.gguf has a damaged header" in pairs["abort"]
    assert "MTP layers" in pairs["abort"] and "own MTP head" not in pairs["abort"]  # before: "4000000000 MTP layers"
    assert "damaged the draft d.gguf has a damaged header (block_count 0" in pairs["bad-draft"]
    assert "damaged the target truncated-mtp.gguf is truncated" in pairs["truncated-head"]  # before: its own head
    assert "claims 1 MTP layer but blk.2 has no tensors" in pairs["head-missing"]  # before: its own head
    assert "unusable: no_tokenizer.gguf has no tokenizer" in pairs["no-tokenizer"]  # before: "no draft and no…"
    assert "single MTP block of qwen35, and the file has 2: it drafts with n-grams" in pairs["two-blocks"]
    assert "drafts with its own MTP head (1 MTP layer)" in pairs["one-head"]
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["good"]["problems"] == [] and len(rows["abort"]["problems"]) == 1


@pytest.mark.slow
def test_doctor_reports_every_pair_and_plans_only_the_readable_ones(home):
    report = run_doctor(home)  # before: a MemoryError traceback, the report never printed
    found = {f.label: f for title, fs in report.sections if title == "Pairs" for f in fs}
    for name in ("good [default]", "huge-blocks", "abort", "bad-draft", "truncated-head", "no-tokenizer"):
        assert f"{name} [user]" in found
    assert "damaged header" in found["abort [user]"].value and "own MTP head" not in found["abort [user]"].value
    assert "placement of good" in found and "placement of abort" not in found


@pytest.mark.parametrize(
    ("pair", "said"),
    [("abort", "llama.cpp would abort"), ("truncated-head", "truncated"), ("no-tokenizer", "no tokenizer")],
)
def test_pull_refuses_a_damaged_local_file_in_one_line(home, capsys, pair, said):
    assert main(["pull", pair]) == 1  # before: "ok: the target loads", its own MTP head
    err = capsys.readouterr().err
    [line] = [e for e in err.splitlines() if e.startswith("localspec: error:")]
    assert said in line


def test_the_chats_pair_list_marks_damaged_files_and_lists_the_others(home):
    rows = {r.name: r for r in list_pairs(ChatOptions())}
    assert rows["good"].ready and rows["one-head"].ready and "MTP head" in rows["one-head"].status
    for name in ("huge-blocks", "abort", "bad-draft", "truncated-head"):
        assert not rows[name].ready and "damaged" in rows[name].status
    assert "no tokenizer" in rows["no-tokenizer"].status and "n-gram" in rows["two-blocks"].status
    assert "MTP head missing" in rows["head-missing"].status


def test_serve_answers_a_request_for_a_damaged_pair_and_stays_up(files, tmp_path, monkeypatch):
    from localspec.paths import get_paths

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    write_config(get_paths(), files)
    server = start_server(tmp_path / "home", "--pair", "good")
    try:
        body = {"model": "abort", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        status, _, data = raw(server.port, "POST", "/v1/chat/completions", body)
        assert 400 <= status < 600 and "llama.cpp would abort" in error_of(data)["message"]  # before: the server died
        assert server.healthy()
        body["model"] = "good"
        assert raw(server.port, "POST", "/v1/chat/completions", body)[0] == 200
    finally:
        assert server.stop(signal.SIGINT) == 130, server.stderr()
    assert "Traceback" not in server.stderr() and "Traceback" not in server.log()
