"""`localspec generate --json-schema FILE` and `--grammar FILE` (issue 46): the answer follows the file, greedy
speculative equals plain under it, and a file that cannot be used is one line."""

from __future__ import annotations

import json

import pytest

from localspec.cli.main import main

WORDS = r'start: w (" " w)*\nw: "the" | "of" | "and" | "to"\n'


def generate(capsys, *args) -> tuple[int, str, str]:
    code = main(["generate", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_grammar_file_shapes_the_answer_and_speculation_keeps_it(tiny_models, tmp_path, capsys):
    grammar = tmp_path / "words.lark"
    grammar.write_text(WORDS.replace("\\n", "\n"), encoding="utf-8")
    base = ["hello", "--target", tiny_models.target, "--max-tokens", "24", "--temperature", "0", "--json"]
    base += ["--grammar", grammar]
    answers = []
    for draft in (["--drafter", "none"], ["--draft", tiny_models.draft_noisy, "--draft-max", "4"]):
        code, out, err = generate(capsys, *base, *draft)
        assert code == 0, err
        answers.append(json.loads(out)["text"])
    assert answers[0] == answers[1]
    *whole, last = answers[0].split(" ")  # --max-tokens may cut the last word
    assert all(w in ("the", "of", "and", "to") for w in whole) and any(
        w.startswith(last) for w in ("the", "of", "and", "to")
    )


def test_json_schema_file(tiny_models, tmp_path, capsys):
    schema = tmp_path / "s.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {"a": {"enum": ["the", "of"]}},
                "required": ["a"],
                "additionalProperties": False,
            }
        ),
        encoding="utf-8",
    )
    code, out, err = generate(
        capsys,
        "hi",
        "--target",
        tiny_models.target,
        "--max-tokens",
        "30",
        "--temperature",
        "0",
        "--drafter",
        "none",
        "--json-schema",
        schema,
    )
    assert code == 0, err
    assert json.loads(out.strip()) in ({"a": "the"}, {"a": "of"})


@pytest.mark.parametrize(
    "content,flag,match",
    [
        ("{not json", "--json-schema", "not JSON"),
        ('{"type": "nope"}', "--json-schema", "nope"),
        ("start: missing\n", "--grammar", "cannot be compiled"),
    ],
)
def test_a_file_that_cannot_be_used_is_one_line(tiny_models, tmp_path, capsys, content, flag, match):
    path = tmp_path / "bad"
    path.write_text(content, encoding="utf-8")
    code, out, err = generate(capsys, "hi", "--target", tiny_models.target, "--drafter", "none", flag, path)
    assert code != 0 and match in err and len(err.strip().splitlines()) == 1, err
    code, _, err = generate(capsys, "hi", "--target", tiny_models.target, "--grammar", tmp_path / "absent")
    assert code != 0 and "cannot read it" in err


def test_a_json_schema_files_open_objects_are_closed_to_their_properties(tmp_path):
    """Issue 63 item 9 on the command line too: an object that lists its properties and does not say
    `additionalProperties` takes those alone (as the server's `response_format` and llama.cpp read it); one that says
    it keeps what it says, and an empty schema is any JSON."""
    import argparse

    from localspec.cli.generate import _grammar

    def grammar_of(schema: dict) -> dict:
        path = tmp_path / "s.json"
        path.write_text(json.dumps(schema), encoding="utf-8")
        return json.loads(_grammar(argparse.Namespace(json_schema=str(path), grammar=None)).text)

    nested = {"type": "object", "properties": {"city": {"type": "object", "properties": {"name": {"type": "string"}}}}}
    closed = grammar_of(nested)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["city"]["additionalProperties"] is False
    assert grammar_of({**nested, "additionalProperties": True})["additionalProperties"] is True
    assert grammar_of({}) == {}
