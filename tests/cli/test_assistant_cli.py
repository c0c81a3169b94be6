"""`localspec generate|bench|serve --target gemma4.gguf --draft mtp-gemma4.gguf` on the tiny Gemma 4 pair: the sidecar
is recognised by its architecture and drafts as the `assistant` drafter, exactly (greedy == `--drafter none`), and
each command names it; a request for it on a server that did not load it is refused in one line."""

from __future__ import annotations

import json

import openai
import pytest
from support import PROMPT
from support.server import start_server

from localspec.cli.main import main


def generate(pair, capsys, *flags: str) -> tuple[dict, str]:
    args = ["generate", PROMPT, "--target", str(pair.target), "--draft", str(pair.assistant), "--temperature", "0"]
    code = main([*args, "--max-tokens", "60", "--draft-max", "3", "--no-adaptive", "--threads", "1", "--json", *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out.splitlines()[-1]), err


def test_generate_speculates_with_the_assistant_exactly(tiny_gemma4, capsys, localspec_home):
    spec, err = generate(tiny_gemma4, capsys)
    plain, _ = generate(tiny_gemma4, capsys, "--drafter", "none")
    assert spec["drafter"] == "assistant" and plain["drafter"] == "none"
    assert spec["stats"]["drafted"] > 0 and 0 < spec["stats"]["accepted"] < spec["stats"]["drafted"]
    assert plain["stats"]["drafted"] == 0
    assert spec["tokens"] == plain["tokens"] and spec["text"] == plain["text"]
    assert "localspec: note: draft: mtp-gemma4.gguf, a Gemma 4 assistant reading the target's states" in err


def test_generate_refuses_a_draft_model_as_the_assistant_in_one_line(tiny_gemma4, tiny_models, capsys, localspec_home):
    args = ["generate", "hi", "--target", str(tiny_models.target), "--draft", str(tiny_models.draft_noisy)]
    assert main([*args, "--drafter", "assistant", "--max-tokens", "2"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "draft_noisy.gguf is a llama model, not an assistant sidecar" in err[0], err
    assert main(["generate", "hi", "--target", str(tiny_gemma4.assistant), "--max-tokens", "2"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a gemma4-assistant sidecar, not a model of its own" in err[0], err


def test_bench_names_the_assistant_and_its_drafts_are_accepted(tiny_gemma4, capsys, localspec_home):
    args = ["bench", "--target", str(tiny_gemma4.target), "--draft", str(tiny_gemma4.assistant), "--k", "2"]
    assert main([*args, "--temperature", "0", "--tokens", "16", "--rounds", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert f"draft:  {tiny_gemma4.assistant} (a Gemma 4 assistant)" in out
    [row] = [line.split() for line in out.splitlines() if line.startswith("k=2 ")]
    assert float(row[4].rstrip("%")) > 0  # the assistant's drafts were accepted
    code = main([*args, "--drafters", "model", "--tokens", "4", "--rounds", "1", "--threads", "1"])
    assert code != 0 and "it drafts as assistant, beside ngram and none" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_drafts_with_the_assistant_and_a_request_may_turn_it_off(tmp_path, tiny_gemma4):
    running = start_server(tmp_path, "--target", str(tiny_gemma4.target), "--draft", str(tiny_gemma4.assistant))
    try:
        client = running.client()

        def answer(drafter: str | None):
            extra = {"draft_max": 3, "adaptive": False} | ({"drafter": drafter} if drafter else {})
            messages = [{"role": "user", "content": PROMPT}]
            return client.chat.completions.create(
                model="gemma4.gguf", messages=messages, temperature=0, max_tokens=40, extra_body=extra
            )

        spec, plain, again = answer(None), answer("none"), answer("assistant")
        for reply, kind in ((spec, "assistant"), (plain, "none"), (again, "assistant")):
            assert reply.model_extra["localspec"]["drafter"] == kind
        assert spec.model_extra["timings"]["draft_n"] > 0 and plain.model_extra["timings"]["draft_n"] == 0
        assert spec.choices[0].message.content == plain.choices[0].message.content == again.choices[0].message.content
        with pytest.raises(openai.BadRequestError) as refused:
            answer("model")  # the sidecar is no draft model
        assert "needs a draft model" in refused.value.body["message"]
    finally:
        running.stop()
    assert "Traceback" not in running.stderr()


@pytest.mark.slow
def test_a_server_started_without_the_assistant_refuses_it_in_one_line(tmp_path, tiny_gemma4):
    args = ["--target", str(tiny_gemma4.target), "--draft", str(tiny_gemma4.assistant), "--drafter", "ngram"]
    running = start_server(tmp_path, *args)
    try:
        with pytest.raises(openai.BadRequestError) as refused:
            running.client().chat.completions.create(
                model="gemma4.gguf",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
                extra_body={"drafter": "assistant"},
            )
        message = refused.value.body["message"]
        assert "\n" not in message and "which this server did not load (it started with the drafter 'ngram')" in message
    finally:
        running.stop()
    assert "Traceback" not in running.stderr()
