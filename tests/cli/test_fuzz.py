"""Fuzzing the two parsers a user feeds directly (issue #9): the command line and models.toml.

Any input must give either success or one `LocalspecError` / usage line, never another exception. The
command line is fuzzed through `check` below: what `main` does before loading (parse, then `check_run_args` for
the commands that run models; nothing loaded); models.toml through
`read_models_file` and `load_config`, with raw bytes and with TOML built from the schema's own keys.
Examples are bounded and derandomized, so the suite stays fast and repeatable.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localspec.cli.checks import check_run_args
from localspec.cli.main import build_parser
from localspec.cli.textinput import one_line
from localspec.errors import ConfigError, LocalspecError
from localspec.models.catalog import load_config, read_models_file
from localspec.paths import Paths


def check(argv: list[str]):
    """Parse and check a command line as `main` and the run commands do, loading nothing."""
    args = build_parser().parse_args(argv)
    return check_run_args(args) if args.command in ("generate", "chat", "bench") else args


FUZZ = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

COMMANDS = ["generate", "chat", "models", "pull", "doctor", "nonsense", "--verbose", "-v", "--help"]
FLAGS = [
    "--pair",
    "--target",
    "--draft",
    "--drafter",
    "--n-ctx",
    "--n-gpu-layers",
    "--n-gpu-layers-draft",
    "--gpu-memory",
    "--cpu-moe",
    "--threads",
    "--chat-template",
    "--max-tokens",
    "--temperature",
    "--top-k",
    "--top-p",
    "--min-p",
    "--repeat-penalty",
    "--seed",
    "--draft-max",
    "--p-min",
    "--verify",
    "--no-adaptive",
    "--stop",
    "--chat",
    "--system",
    "--n",
    "--json",
    "--truncate",
    "--dry-run",
    "--help",
    "-h",
    "--",
    "-",
]
NUMBERS = [
    "0",
    "-0",
    "1",
    "-1",
    "16",
    "15",
    "64",
    "65",
    "1e309",
    "-1e309",
    "nan",
    "inf",
    "-inf",
    "0x10",
    "1_000",
    "18446744073709551615",
    "18446744073709551616",
    str(2**70),
    "0.5",
    "1.0000001",
    " 3 ",
    "",
    "8G",
    "7.5GiB",
    "1e9G",
    "9" * 400 + "T",
]
SURROGATES = st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF)  # how Python hands over non-UTF-8 argv
WORDS = st.one_of(
    st.sampled_from(FLAGS),
    st.sampled_from(NUMBERS),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet=st.one_of(st.characters(blacklist_characters="\x00"), SURROGATES), max_size=12),
)


def _single_line(text: str) -> bool:
    return text.count("\n") <= 1 and "Traceback" not in text


@pytest.mark.slow
@FUZZ
@given(command=st.sampled_from(COMMANDS), words=st.lists(WORDS, max_size=8))
def test_command_line_gives_success_or_one_line(command, words, capsys, chat_home):
    argv = [command, *words]
    try:
        check(argv)
    except SystemExit as e:  # --help (0) or a usage error (2), printed by argparse
        out, err = capsys.readouterr()
        assert e.code in (0, 2), argv
        if e.code == 2:
            assert _single_line(err) and err.startswith("localspec: error:"), (argv, err)
    except LocalspecError as e:
        line = one_line(str(e))  # what `main` prints
        assert line and "\n" not in line, argv
    capsys.readouterr()


# --- models.toml ----------------------------------------------------------------------------------------------

PAIR_FIELDS = [
    "description",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "draft_max",
    "p_min",
    "verify",
    "n_ctx",
    "n_gpu_layers",
    "n_gpu_layers_draft",
    "gpu_memory",
    "cpu_moe",
    "chat_template",
    "colour",
]
SCALARS = st.one_of(
    st.text(max_size=10),
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.sampled_from(
        ["a/b:Q4_K_M", "a/b", "bartowski/x-GGUF:Q8_0", "pq", "match", "demo", "smollm2-135m-instruct-q4_1"]
    ),
)
SOURCE = st.one_of(
    SCALARS,
    st.dictionaries(st.sampled_from(["repo", "file", "quant", "path", "builtin", "other"]), SCALARS, max_size=3),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def toml_value(value) -> str:
    """A value as TOML (the stdlib reads TOML but does not write it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


@st.composite
def models_toml(draw) -> str:
    lines = []
    if draw(st.booleans()):
        lines.append(f"default = {toml_value(draw(st.one_of(st.sampled_from(['p', 'q']), SCALARS)))}")
    for name in draw(
        st.lists(st.one_of(st.sampled_from(["p", "q", "bad name", ""]), st.text(max_size=6)), max_size=3, unique=True)
    ):
        lines.append(f"[pairs.{json.dumps(name)}]")
        for role in draw(st.lists(st.sampled_from(["target", "draft"]), max_size=2, unique=True)):
            lines.append(f"{role} = {toml_value(draw(SOURCE))}")
        for field in draw(st.lists(st.sampled_from(PAIR_FIELDS), max_size=3, unique=True)):
            lines.append(f"{field} = {toml_value(draw(VALUES))}")
    return "\n".join(lines) + "\n"


def _load(tmp_path: Path, data: bytes) -> None:
    home = tmp_path / "fuzz-home"
    home.mkdir(exist_ok=True)
    (home / "models.toml").write_bytes(data)
    for reader in (
        lambda: read_models_file(home / "models.toml"),
        lambda: load_config(Paths(config_dir=home, data_dir=home / "data", log_dir=home / "logs")),
    ):
        try:
            reader()
        except ConfigError as e:
            assert "\n" not in str(e) and str(home / "models.toml") in str(e), str(e)


@pytest.mark.slow
@FUZZ
@given(text=models_toml())
def test_models_toml_from_the_schema_gives_success_or_one_line(text, tmp_path):
    _load(tmp_path, text.encode("utf-8", "surrogatepass"))


@FUZZ
@given(data=st.one_of(st.binary(max_size=120), st.text(max_size=120).map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_models_toml_bytes_give_success_or_one_line(data, tmp_path):
    _load(tmp_path, data)


def test_the_fuzzers_reach_both_outcomes(chat_home, capsys, tmp_path):
    """Guard against a fuzzer that only ever sees errors (or only successes)."""
    check(["generate", "hi", "--pair", "tiny", "--seed", "1"])
    with pytest.raises(LocalspecError):
        check(["generate", "hi", "--seed", "-1"])
    (tmp_path / "models.toml").write_text('[pairs.p]\ntarget = "a/b:Q4_K_M"\ndraft = "a/b:Q8_0"\n')
    assert "p" in read_models_file(tmp_path / "models.toml").pairs
