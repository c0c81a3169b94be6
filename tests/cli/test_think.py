"""`localspec generate --chat` on the tiny thinking models: `--json` has the reasoning beside the text and the
numbers of each part, `--think on|off` and the pair's `thinking`, the thinking on stderr, and one line (never a
traceback) for every thinking choice a model cannot follow."""

from __future__ import annotations

import json

import pytest
from support.badinput import assert_outcome, run_cli, run_main
from support.tinymodels import ANSWER_TEXT, REASONING_TEXT

GEN = ["generate", "Hi", "--chat", "--max-tokens", "40"]


def completion(capsys, *args) -> dict:
    outcome = run_main([*GEN, "--json", *args], capsys)
    assert outcome.code == 0, outcome.err
    (line,) = outcome.out.splitlines()
    return json.loads(line)


def test_json_has_the_reasoning_beside_the_answer(thinking_home, capsys):
    data = completion(capsys, "--pair", "thinking", "--draft-max", "4", "--no-adaptive")
    assert (data["reasoning"], data["text"]) == (REASONING_TEXT, ANSWER_TEXT)
    thinking, answer = data["parts"]["thinking"], data["parts"]["answer"]
    assert thinking["tokens"] == 11 and thinking["tokens"] + answer["tokens"] == len(data["tokens"])
    assert thinking["drafted"] + answer["drafted"] == data["stats"]["drafted"]
    assert thinking["accepted"] + answer["accepted"] == data["stats"]["accepted"]
    assert thinking["passes"] + answer["passes"] == pytest.approx(data["stats"]["target_passes"])
    assert thinking["acceptance_rate"] == 1.0 and answer["acceptance_rate"] < 1.0  # the draft's other word
    assert set(thinking) >= {"tokens", "drafted", "accepted", "passes", "acceptance_rate", "tokens_per_pass"}


def test_think_off_and_the_pairs_thinking(thinking_home, capsys):
    off = completion(capsys, "--pair", "thinking", "--think", "off")
    assert (off["reasoning"], off["text"]) == ("", ANSWER_TEXT) and off["parts"]["thinking"]["tokens"] == 0
    assert len(off["tokens"]) == 4  # " Hello world!" and <|im_end|>: the model did not think at all
    assert completion(capsys, "--pair", "thinking-off")["tokens"] == off["tokens"]
    on = completion(capsys, "--pair", "thinking-off", "--think", "on")  # the flag wins over the pair
    assert on["reasoning"] == REASONING_TEXT


def test_a_model_that_does_not_think_is_unchanged(thinking_home, capsys):
    data = completion(capsys, "--pair", "tiny")
    assert data["reasoning"] == "" and data["parts"]["thinking"]["tokens"] == 0
    assert data["parts"]["answer"]["tokens"] == len(data["tokens"])
    raw = run_main(["generate", "Hi", "--pair", "tiny", "--max-tokens", "8", "--json"], capsys)
    assert json.loads(raw.out)["reasoning"] == "" and json.loads(raw.out)["parts"] is None


def test_thinking_streams_to_stderr_and_the_answer_to_stdout(thinking_home, capsys):
    outcome = run_main([*GEN, "--pair", "thinking"], capsys)
    assert outcome.code == 0
    assert outcome.out == ANSWER_TEXT + "\n"
    assert outcome.err.startswith(REASONING_TEXT + "\n")
    assert "thinking 11 tokens" in outcome.err and "answer 5 tokens" in outcome.err


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--pair", "always", "--think", "off"], "always thinks: its chat template has no thinking switch"),
        (["--pair", "always-off"], "`thinking = false` of pair 'always-off' in models.toml cannot be followed"),
        (["--pair", "tiny", "--think", "on"], "does not think (no <think> markers"),
    ],
    ids=["off-without-a-switch", "pair-off-without-a-switch", "on-for-a-model-that-does-not-think"],
)
def test_what_a_model_cannot_follow_is_one_line(thinking_home, args, match):
    outcome = run_cli([*GEN, *args])
    assert_outcome(outcome, 1, match, log_file=thinking_home.log_file)


def test_think_needs_chat(thinking_home):
    outcome = run_cli(["generate", "Hi", "--pair", "thinking", "--think", "on"])
    assert_outcome(outcome, 1, "--think only applies with --chat", log_file=thinking_home.log_file)


def test_always_on_is_accepted_for_a_model_that_always_thinks(thinking_home, capsys):
    data = completion(capsys, "--pair", "always", "--think", "on")
    assert (data["reasoning"], data["text"]) == (REASONING_TEXT, ANSWER_TEXT)


def test_bad_values_are_one_line(thinking_home):
    outcome = run_cli([*GEN, "--pair", "thinking", "--think", "maybe"])
    assert outcome.code == 2 and "Traceback" not in outcome.err
    assert "invalid choice: 'maybe'" in outcome.err
    config = thinking_home.config_file
    bad = '[pairs.bad]\ntarget = { path = "x.gguf" }\ndraft = { path = "x.gguf" }\nthinking = "yes"\n'
    config.write_text(config.read_text(encoding="utf-8") + bad, encoding="utf-8")
    outcome = run_cli([*GEN, "--pair", "thinking"])
    match = "pair 'bad', field 'thinking': Input should be a valid boolean"
    assert_outcome(outcome, 1, match, log_file=thinking_home.log_file)
