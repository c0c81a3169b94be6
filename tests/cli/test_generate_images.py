"""`localspec generate --mmproj P --image X` (issue 59) on the tiny image-reading pair: the answer is about the
picture (another picture, another answer), speculation keeps it the target's (greedy equal to `--drafter none`), and
each bad picture or setting is one line before or instead of a traceback."""

from __future__ import annotations

import json

import pytest
from support.badinput import assert_outcome, run_main
from support.tinyvision import png_bytes, png_chunk, png_header, random_pixels


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("pictures")
    out = {}
    for seed in (1, 2):
        path = folder / f"photo {seed}.png"
        path.write_bytes(png_bytes(random_pixels(seed)))
        out[str(seed)] = str(path)
    cut = folder / "cut.png"
    cut.write_bytes(png_bytes(random_pixels(3))[:60])
    huge = folder / "huge.png"
    huge.write_bytes(png_header(20000, 20000) + png_chunk(b"IEND", b""))  # a whole file, claiming 400 megapixels
    text = folder / "notes.txt"
    text.write_text("not a picture", encoding="utf-8")
    return {**out, "cut": str(cut), "huge": str(huge), "text": str(text), "missing": str(folder / "gone.png")}


def answer(capsys, tiny_vision, *args) -> dict:
    base = ["generate", "--target", tiny_vision.target, "--mmproj", tiny_vision.mmproj, "--max-tokens", "12"]
    outcome = run_main([*base, "--temperature", "0", "--json", "--threads", "1", *args], capsys)
    assert_outcome(outcome, 0)
    return json.loads(outcome.out)


def test_the_answer_is_about_the_picture_and_speculation_keeps_it(capsys, tiny_vision, pictures):
    drafted = answer(capsys, tiny_vision, "--draft", tiny_vision.draft, "--image", pictures["1"], "the man said")
    plain = answer(capsys, tiny_vision, "--drafter", "none", "--image", pictures["1"], "the man said")
    other = answer(capsys, tiny_vision, "--drafter", "none", "--image", pictures["2"], "the man said")
    assert drafted["tokens"] == plain["tokens"] and drafted["stats"]["drafted"] > 0
    assert other["tokens"] != plain["tokens"]
    assert plain["prompt_tokens"] >= 16 + 3  # the picture's 16 positions count
    text_only = answer(capsys, tiny_vision, "--drafter", "none", "the man said")
    assert text_only["prompt_tokens"] == plain["prompt_tokens"] - 16


@pytest.mark.parametrize(
    ("picture", "match"),
    [
        ("missing", "--image"),
        ("cut", "cut-off"),
        ("huge", "megapixels"),
        ("text", "not a picture|format|PNG"),
    ],
)
def test_a_bad_picture_is_one_line(capsys, tiny_vision, pictures, picture, match):
    base = ["generate", "--target", tiny_vision.target, "--mmproj", tiny_vision.mmproj, "--drafter", "none"]
    outcome = run_main([*base, "--image", pictures[picture], "hello"], capsys)
    assert_outcome(outcome, 1)
    assert any(word in outcome.err for word in match.split("|")), outcome.err


def test_a_picture_for_a_pair_without_a_projector_or_without_text_is_one_line(capsys, tiny_vision, pictures):
    outcome = run_main(
        ["generate", "--target", tiny_vision.target, "--drafter", "none", "--image", pictures["1"], "hi"], capsys
    )
    assert_outcome(outcome, 1, "reads no images")
    assert "--mmproj" in outcome.err
    base = ["generate", "--target", tiny_vision.target, "--mmproj", tiny_vision.mmproj, "--drafter", "none"]
    assert_outcome(run_main([*base, "--image", pictures["1"], ""], capsys), 1, "ends with an image")
