"""`localspec bench --image` on the tiny image-reading pair (tests/support/tinyvision.py), real llama.cpp: the image
turns beside the text turns, as a table of their own and as `image_rows` in --json; a pair without a projector and a
file that is no image refused in one line before anything loads; and llama-server as the peer (the fake one,
tests/support/fakepeer.py) started with the projector, sent each image turn in its multimodal form — the chat
template's text with a media marker where the image goes, and the file in base64 — and each text turn as token ids.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from support.fakepeer import HELP_NEW, HELP_VISION, completions, starts, write_fake_peer
from support.tinyvision import TinyVision, png_bytes, random_pixels

from localspec.bench.run import DEFAULT_PROMPTS
from localspec.cli.main import main

MARKER = "<__media__>"  # llama.cpp's mtmd_default_marker()
ROW_STARTS = ("plain", "k=", "adaptive")


@pytest.fixture
def picture(tmp_path: Path) -> Path:
    path = tmp_path / "picture.png"
    path.write_bytes(png_bytes(random_pixels(1)))
    return path


def bench(capsys, vision: TinyVision, *extra: str, mmproj: bool = True) -> tuple[int, str, str]:
    """`localspec bench` on the tiny vision pair, short: --tokens 8 --rounds 1 --k 2, one thread."""
    argv = ["bench", "--target", str(vision.target), "--draft", str(vision.draft)]
    argv += ["--mmproj", str(vision.mmproj)] if mmproj else []
    code = main([*argv, "--tokens", "8", "--rounds", "1", "--k", "2", "--threads", "1", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def sections(out: str) -> tuple[list[str], list[str]]:
    """The table's lines before the image turns' title, and from it on."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("image turns:"))
    return lines[:at], lines[at:]


def test_image_turns_are_a_table_of_their_own(tiny_vision, capsys, localspec_home, picture):
    code, out, err = bench(capsys, tiny_vision, "--image", str(picture))
    assert code == 0, err
    assert "8 settings × 1 round × 2 turns (text, image)" in err  # said before loading
    text, image = sections(out)
    assert image[0] == f"image turns: the same prompts with {picture} (png 32×32) before the text:"
    for lines in (text, image):
        header = [line for line in lines if line.startswith("setting")]
        rows = [line.split() for line in lines if line.startswith(ROW_STARTS)]
        assert len(header) == 1 and "×plain" in header[0] and "accept" in header[0]
        assert len(rows) == 8  # plain, k=2, adaptive at T 0; plain and pq/match k=2 and adaptive at T 0.8
        assert all(float(next(x for x in row if x[0].isdigit() and "." in x)) > 0 for row in rows)  # tok/s
    assert "Traceback" not in out + err


def test_json_has_image_rows(tiny_vision, capsys, localspec_home, picture, tmp_path):
    other = tmp_path / "other.png"
    other.write_bytes(png_bytes(random_pixels(2)))
    code, out, err = bench(capsys, tiny_vision, "--image", str(picture), "--image", str(other), "--temperature", "0",
                           "--json")  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert report["images"] == [f"{picture} (png 32×32)", f"{other} (png 32×32)"]
    text = {r["setting"]: r for r in report["rows"]}
    image = {r["setting"]: r for r in report["image_rows"]}
    assert set(image) == set(text) == {"plain", "k=2", "adaptive≤2"}
    for r in image.values():
        assert r["tokens_per_second"] > 0 and r["ratio"] > 0
    assert image["plain"]["acceptance"] == 0
    assert image["k=2"]["acceptance"] > 0 and image["k=2"]["tokens_per_pass"] > 1  # a blank for the draft, still of use
    assert all(r["peer_tokens_per_second"] is None for r in report["image_rows"])  # no --peer
    assert report["image_peer"] == [] and report["image_best_peer"] == []


def test_a_pair_without_a_projector_is_refused_in_one_line(tiny_vision, capsys, localspec_home, picture):
    code, out, err = bench(capsys, tiny_vision, "--image", str(picture), mmproj=False)
    assert code == 1 and out == ""
    assert err.startswith("localspec: error:") and err.count("\n") == 1  # before any run: no "bench: N runs" note
    assert "reads no images" in err and "--mmproj" in err


def test_a_file_that_is_no_image_is_refused_in_one_line(tiny_vision, capsys, localspec_home, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a picture")
    for path, expected in ((text, "not an image"), (tmp_path / "gone.png", "no such file")):
        code, out, err = bench(capsys, tiny_vision, "--image", str(path))
        assert code == 1 and out == "" and err.count("\n") == 1 and expected in err, err


@pytest.mark.slow
def test_the_peer_reads_the_image_turns_and_the_text_turns_as_token_ids(tiny_vision, capsys, localspec_home, picture,
                                                                        tmp_path):  # fmt: skip
    fake, log = write_fake_peer(tmp_path, help_text=HELP_VISION)
    code, out, err = bench(capsys, tiny_vision, "--image", str(picture), "--temperature", "0", "--peer", str(fake))
    assert code == 0, err
    assert starts(log) and all(args[args.index("--mmproj") + 1] == str(tiny_vision.mmproj) for args in starts(log))
    sent = completions(log)
    tokens = [c["prompt"] for c in sent if isinstance(c["prompt"], list)]
    turns = [c["prompt"] for c in sent if isinstance(c["prompt"], dict)]
    assert len(tokens) == len(turns) == len(starts(log)) * len(DEFAULT_PROMPTS)  # each server: both kinds of turn
    assert all(isinstance(t, int) and t >= 0 for prompt in tokens for t in prompt)
    data = base64.b64encode(picture.read_bytes()).decode()
    for turn, prompt in zip(turns, DEFAULT_PROMPTS * len(starts(log))):
        assert turn["multimodal_data"] == [data]
        text = turn["prompt_string"]
        assert text == f"<|im_start|>user\n{MARKER}{prompt}<|im_end|>\n<|im_start|>assistant\n", text
    text, image = sections(out)
    for lines in (text, image):  # the peer's column in both tables, and its own settings under each
        assert any(line.startswith("setting") and "peer tok/s" in line for line in lines)
        assert any(line.startswith("llama-server's own settings") for line in lines)
    assert not any(line.startswith("note: llama-server") for line in out.splitlines())


@pytest.mark.slow
def test_a_peer_without_mmproj_runs_the_text_turns_alone(tiny_vision, capsys, localspec_home, picture, tmp_path):
    fake, log = write_fake_peer(tmp_path, help_text=HELP_NEW)
    code, out, err = bench(capsys, tiny_vision, "--image", str(picture), "--temperature", "0", "--peer", str(fake))
    assert code == 0, err
    assert starts(log) and not any("--mmproj" in args for args in starts(log))
    assert all(isinstance(c["prompt"], list) for c in completions(log))
    text, image = sections(out)
    assert any(line.startswith("setting") and "peer tok/s" in line for line in text)
    assert not any("peer" in line for line in image if line.startswith("setting"))
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    assert notes == ["note: this llama-server has no --mmproj: it runs no image turns"]
