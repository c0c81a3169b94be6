"""`localspec generate`: the JSON contract, greedy speculation == plain through the CLI, and one clear
line (never a traceback) for every bad input."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import typing

import pytest
from support.tinymodels import write_llama_model

from localspec.cli.main import main

STATS_KEYS = {
    "drafted",
    "accepted",
    "target_passes",
    "emitted",
    "acceptance_rate",
    "mean_tokens_per_pass",
    "accepted_by_position",
    "tokens_per_second",
    "seconds",
}


def generate(capsys, *args: str) -> tuple[int, list[dict], str]:
    code = main(["generate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines() if line.startswith("{")], err


@pytest.mark.slow
def test_json_contract_and_greedy_draft_equals_no_draft(tiny_models, capsys):
    base = ["the man said", "--target", tiny_models.target, "--temperature", "0", "--max-tokens", "40", "--json"]
    code, [plain], _ = generate(capsys, *base, "--drafter", "none")
    assert code == 0
    code, [spec], _ = generate(capsys, *base, "--draft", tiny_models.draft_noisy, "--draft-max", "4", "--no-adaptive")
    assert code == 0
    assert set(plain) >= {"text", "prompt_tokens", "tokens", "from_draft", "finish_reason", "stats"}
    assert set(spec["stats"]) >= STATS_KEYS
    assert spec["tokens"] == plain["tokens"]  # tiny F32 models: no near-tie on this prompt
    assert spec["text"] == plain["text"] and len(spec["tokens"]) == 40
    assert spec["stats"]["drafted"] > 0 and plain["stats"]["drafted"] == 0
    assert sum(spec["from_draft"]) == spec["stats"]["accepted"]
    assert spec["stats"]["target_passes"] < plain["stats"]["target_passes"]


@pytest.mark.slow
def test_n_completions_share_one_prefill(tiny_models, capsys):
    code, runs, _ = generate(
        capsys,
        "the man said",
        "--target",
        tiny_models.target,
        "--draft",
        tiny_models.draft_noisy,
        "--n",
        "3",
        "--max-tokens",
        "8",
        "--seed",
        "1",
        "--json",
    )
    assert code == 0 and len(runs) == 3
    assert runs[0]["stats"]["prefill_decoded"] == runs[0]["prompt_tokens"] - 1
    assert runs[1]["stats"]["prefill_decoded"] == runs[2]["stats"]["prefill_decoded"] == 0
    assert len({tuple(r["tokens"]) for r in runs}) > 1  # independent samples at T=0.8


def test_same_seed_same_output(tiny_models, capsys):
    args = [
        "the man said",
        "--target",
        tiny_models.target,
        "--draft",
        tiny_models.draft_noisy,
        "--seed",
        "7",
        "--max-tokens",
        "16",
        "--json",
    ]
    _, [a], _ = generate(capsys, *args)
    _, [b], _ = generate(capsys, *args)
    assert a["tokens"] == b["tokens"]


def test_text_mode_streams_to_stdout_and_one_stats_line_to_stderr(tiny_models, capsys):
    code = main(["generate", "hello", "--target", str(tiny_models.target), "--max-tokens", "5", "--chat"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip()
    assert err.count("\n") == 1 and "tok/s" in err


def one_line_error(capsys, args: list, match: str) -> None:
    code = main(["generate", "hi", *map(str, args)])
    _, err = capsys.readouterr()
    assert code != 0
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert match in err, err


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--temperature", "-1"], "temperature must be"),
        (["--top-p", "0"], "top-p must be"),
        (["--min-p", "2"], "min-p must be"),
        (["--top-k", "-3"], "top-k must be"),
        (["--temperature", "warm"], "invalid float value"),
        (["--draft-max", "1000"], "draft-max"),
        (["--max-tokens", "0"], "max-tokens"),
        (["--n-ctx", "100000"], "exceeds what"),
    ],
)
def test_invalid_settings(tiny_models, capsys, flags, match):
    one_line_error(capsys, ["--target", tiny_models.target, *flags], match)


@pytest.mark.parametrize(
    "name, match",
    [
        ("not_gguf", "not a GGUF file"),
        ("truncated", "truncated or corrupt"),
    ],
)
def test_bad_model_files(tiny_models, capsys, name, match):
    one_line_error(capsys, ["--target", getattr(tiny_models, name)], match)
    one_line_error(capsys, ["--target", tiny_models.target, "--draft", getattr(tiny_models, name)], match)


def test_missing_file(tiny_models, capsys, tmp_path):
    one_line_error(capsys, ["--target", tmp_path / "nope.gguf"], "model file not found")


@pytest.mark.parametrize(
    "name, mode",
    [
        ("vocab_bpe", "drafting on the"),
        ("vocab_other_specials", "drafting on the"),
        ("vocab_far_size", "drafting through text (79%"),  # 200 of its 1,069 tokens are not the target's
        ("vocab_renamed", "drafting on the"),
        ("vocab_shuffled", "drafting on the"),
    ],
)
@pytest.mark.slow
def test_a_draft_with_another_vocabulary_drafts_through_the_bridge_and_says_so_once(tiny_models, capsys, name, mode):
    args = ["hi", "--target", tiny_models.target, "--draft", getattr(tiny_models, name), "--max-tokens", "8"]
    code, [run], err = generate(capsys, *args, "--no-adaptive", "--temperature", "0", "--json")
    assert code == 0 and run["stats"]["drafted"] > 0
    assert err.count("localspec: note: draft tokenizer differs: ") == 1 and mode in err, err
    code, [run], err = generate(capsys, *args, "--bridge", "text", "--json")
    assert code == 0 and err.count("draft tokenizer differs: drafting through text") == 1, err
    code, [run], err = generate(capsys, *args, "--drafter", "ngram", "--json")
    assert code == 0 and "draft tokenizer differs" not in err  # no draft model: nothing is bridged


@pytest.mark.slow
def test_near_size_vocabulary_is_accepted(tiny_models, capsys):
    code, [run], _ = generate(
        capsys,
        "hi",
        "--target",
        tiny_models.target,
        "--draft",
        tiny_models.vocab_near_size,
        "--max-tokens",
        "4",
        "--no-adaptive",
        "--json",
    )
    assert code == 0 and run["stats"]["drafted"] > 0


def test_n_ctx_beyond_memory(tmp_path, capsys):
    huge = write_llama_model(tmp_path / "long.gguf", context_length=1 << 28)
    one_line_error(capsys, ["--target", huge, "--n-ctx", 1 << 28], "GiB of KV cache")


def test_console_script_prints_no_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "localspec", "generate", "hi", "--target", str(tmp_path / "x.gguf")],
        capture_output=True,
        text=True,
        env={"LOCALSPEC_HOME": str(tmp_path), "PATH": ""},
    )
    assert result.returncode == 1
    assert (
        result.stderr == f"localspec: error: model file not found: {tmp_path / 'x.gguf'} "
        "(check the path, or run `localspec pull PAIR`)\n"
    )
    assert result.stdout == ""


def test_every_entry_point_has_the_same_max_tokens_default():
    import inspect

    from localspec.cli.main import build_parser
    from localspec.core.engine import Engine, GenerateOptions, Generation
    from localspec.core.params import DEFAULT_MAX_TOKENS
    from localspec.core.session import ChatSession
    from localspec.tui.settings import ChatOptions, ChatSettings

    parser = build_parser()
    flags = {cmd: parser.parse_args([cmd]).max_tokens for cmd in ("generate", "chat")}
    # The Python API's entry points pass their keywords (`GenerateOptions`) on to `Generation`, which holds the default.
    assert "max_tokens" in GenerateOptions.__annotations__
    for fn in (Engine.generate, ChatSession.send, ChatSession.reply, ChatSession.answer, ChatSession.regenerate):
        parameters = inspect.signature(fn).parameters
        assert "max_tokens" not in parameters and parameters["options"].kind is inspect.Parameter.VAR_KEYWORD, fn
    api = {"Generation": inspect.signature(Generation.__init__).parameters["max_tokens"].default}
    app = {"options": ChatOptions().max_tokens, "settings": ChatSettings().max_tokens}
    assert set(flags.values()) | set(api.values()) | set(app.values()) == {DEFAULT_MAX_TOKENS}, (flags, api, app)


def test_chat_options_come_from_the_checked_flags(localspec_home):
    from localspec.cli.chat import chat_options
    from localspec.cli.checks import check_run_args
    from localspec.cli.main import build_parser

    argv = ["chat", "--pair", "demo", "--system", "be brief", "--max-tokens", "10", "--stop", "END"]
    argv += ["--temperature", "0", "--seed", "3", "--no-adaptive", "--rpc", "h:1,h:2", "--think", "off"]
    args = build_parser().parse_args(argv)
    given = vars(args).copy()
    run = check_run_args(args)
    assert vars(args) == given  # checking reads the namespace, never rewrites it
    with pytest.raises(AttributeError):
        run.max_tokens = 5  # frozen
    options = chat_options(run, localspec_home)
    assert options.overrides == {"temperature": 0.0, "seed": 3, "adaptive": False}
    assert options.stop == ("END",) and options.system == "be brief" and options.pair == "demo"
    assert options.max_tokens == 10 and options.rpc == ("h:1", "h:2") and options.paths == localspec_home
    assert options.think is False
    # The run flags are one type, declared once: the checked flags are it, the chat's options extend it, and the
    # server and the loading functions are typed with it.
    from localspec.models.flags import RunFlags
    from localspec.models.loading import load_params, resolve_models
    from localspec.server.runner import Runner

    assert type(run) is RunFlags and isinstance(options, RunFlags)
    assert all(getattr(options, f.name) == getattr(run, f.name) for f in dataclasses.fields(RunFlags))
    hints = [typing.get_type_hints(fn)["flags"] for fn in (load_params, resolve_models, Runner.__init__)]
    assert hints == [RunFlags] * 3


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "bench"])
def test_every_command_that_loads_a_model_takes_mmproj_into_its_run_flags(command, tiny_models, tmp_path):
    """`--mmproj PATH` beside `--target` (issue 59): parsed and checked like `--draft`, on each of the four."""
    from localspec.cli.checks import check_run_args
    from localspec.cli.main import build_parser

    projector = tmp_path / "mmproj.gguf"
    projector.write_bytes(tiny_models.target.read_bytes())  # a GGUF file: what the checks read before loading
    argv = [command, *(["hi"] if command == "generate" else []), "--target", str(tiny_models.target)]
    run = check_run_args(build_parser().parse_args([*argv, "--mmproj", str(projector)]))
    assert run.mmproj == str(projector) and run.target == str(tiny_models.target)
    assert check_run_args(build_parser().parse_args(argv)).mmproj is None


def test_a_missing_mmproj_is_one_line(tiny_models, capsys, tmp_path):
    one_line_error(capsys, ["--target", tiny_models.target, "--mmproj", tmp_path / "nope.gguf"], "nope.gguf")
    one_line_error(capsys, ["--target", tiny_models.target, "--mmproj", tiny_models.not_gguf], "not a GGUF file")
