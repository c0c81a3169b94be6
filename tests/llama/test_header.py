"""Damaged GGUF headers (issue 44): one line naming the file, never a traceback, a MemoryError or an abort.

The files are the tiny models with their metadata rewritten by the `gguf` package (`rewrite_gguf`) or their bytes
overwritten (`patch_gguf`) — what a bad conversion, a bit flip or a hostile file gives. The abort cases run the real
`localspec generate` in a child process: llama.cpp's GGML_ASSERT ends the process with SIGABRT (or SIGFPE), which
no `except` can catch, so the header is checked before llama.cpp reads it.
"""

from __future__ import annotations

import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFValueType as T
from support.tinymodels import patch_gguf, rewrite_gguf, write_mtp_model

from localspec.errors import ModelFileError
from localspec.llama.footprint import header_problem, read_footprint, read_header
from localspec.llama.model import Model


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory) -> Path:
    return write_mtp_model(tmp_path_factory.mktemp("mtp") / "tiny-mtp.gguf")


# (which model, metadata changes, what the one line says): each made llama.cpp abort the process before
ABORTS = {
    "no-blocks": ("llama", {"llama.block_count": (0, T.UINT32)}, "block_count 0"),
    "700-blocks": ("llama", {"llama.block_count": (700, T.UINT32)}, "block_count 700"),
    "4e9-mtp-layers": ("qwen35", {"qwen35.nextn_predict_layers": (4_000_000_000, T.UINT32)}, "MTP layers"),
    "rope-scaling": ("llama", {"llama.rope.scaling.type": ("bogus", T.STRING)}, "rope.scaling.type"),
    "experts-unused": ("llama", {"llama.expert_count": (4, T.UINT32)}, "experts"),
    "2000-experts": ("llama", {"llama.expert_count": (2000, T.UINT32)}, "experts"),
    "groups-no-experts": ("llama", {"llama.expert_group_count": (3, T.UINT32)}, "expert groups"),
    "attention-every-0": ("qwen35", {"qwen35.full_attention_interval": (0, T.UINT32)}, "full_attention_interval"),
    "odd-rope-dims": ("qwen35", {"qwen35.rope.dimension_count": (3, T.UINT32)}, "rope.dimension_count"),
}
# ... and each of these a Python error out of the header reader: MemoryError, ValueError, OverflowError
RAISES = {
    "1e12-blocks": ("llama", {"llama.block_count": (10**12, T.UINT64)}, "block_count"),
    "blocks-a-string": ("llama", {"llama.block_count": ("two", T.STRING)}, "not a count"),
    "width-a-string": ("llama", {"llama.embedding_length": ("wide", T.STRING)}, "not a count"),
}


def damaged(case: tuple, tiny_models, mtp_model, tmp_path: Path) -> Path:
    arch, changes, _ = case
    return rewrite_gguf(tiny_models.target if arch == "llama" else mtp_model, tmp_path / "damaged.gguf", changes)


@pytest.mark.parametrize("name", ABORTS)
def test_a_header_llama_cpp_would_abort_on_is_one_line(name, tiny_models, mtp_model, tmp_path):
    path = damaged(ABORTS[name], tiny_models, mtp_model, tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "localspec", "generate", "--target", str(path), "--max-tokens", "4", "Hi"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"LOCALSPEC_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 1, f"exit {run.returncode}: {run.stderr[-500:]}"  # before: -6 (SIGABRT) or -8 (SIGFPE)
    [line] = run.stderr.strip().splitlines()
    assert line.startswith("localspec: error: could not load") and str(path) in line and ABORTS[name][2] in line
    assert "re-download" in line
    for read in (read_footprint, lambda p: Model(p, vocab_only=True)):  # the vocabulary-only pre-flight too
        with pytest.raises(ModelFileError, match="llama.cpp would abort"):
            read(path)


@pytest.mark.parametrize("name", RAISES)
def test_a_header_with_a_count_of_the_wrong_size_or_type_is_one_line(name, tiny_models, mtp_model, tmp_path):
    path = damaged(RAISES[name], tiny_models, mtp_model, tmp_path)
    with pytest.raises(ModelFileError, match=RAISES[name][2]) as caught:
        read_footprint(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def _offset_after(key: bytes, skip: int):
    """Where the bytes `skip` past the end of metadata key `key` start."""
    return lambda data: data.index(key) + len(key) + skip


@pytest.mark.parametrize(
    ("what", "offset_of", "value"),
    [
        ("metadata count", lambda data: 16, struct.pack("<Q", 2**62)),
        ("tensor count", lambda data: 8, struct.pack("<Q", 2**40)),
        ("key length", lambda data: 24, struct.pack("<Q", 2**63)),
        # tokenizer.ggml.scores: a float array whose count (after the key and the array's item type) is huge
        ("array count", _offset_after(b"tokenizer.ggml.scores", 4 + 4), struct.pack("<Q", 2**61)),
        ("vocabulary count", _offset_after(b"tokenizer.ggml.tokens", 4 + 4), struct.pack("<Q", 2**60)),
        ("string length", _offset_after(b"general.name", 4), struct.pack("<Q", 2**63 + 5)),
    ],
)
def test_a_count_larger_than_the_file_is_one_line(what, offset_of, value, tiny_models, tmp_path):
    path = patch_gguf(tiny_models.target, tmp_path / "damaged.gguf", offset_of, value)
    with pytest.raises(ModelFileError, match="truncated or corrupt") as caught:
        read_footprint(path)
    assert "\n" not in str(caught.value)


def test_200_randomly_damaged_headers_are_each_one_line_or_a_footprint(tiny_models, mtp_model, tmp_path):
    """Before: 65 of 200 ended in an OverflowError, a ValueError or a MemoryError."""
    rng = random.Random(44)
    escaped = []
    for i in range(200):
        source = (tiny_models.target, mtp_model)[i % 2].read_bytes()
        data = bytearray(source)
        header_end = min(len(data), 4096)
        for _ in range(rng.choice((1, 2, 4, 8))):
            at = rng.randrange(4, header_end - 8)
            if rng.random() < 0.5:  # a count or a length: a few bytes of a u64 made huge
                data[at : at + 8] = struct.pack("<Q", rng.choice((2**32 - 1, 2**40, 2**62, 2**64 - 1, 10**12)))
            else:
                data[at] = rng.randrange(256)
        path = tmp_path / f"random-{i}.gguf"
        path.write_bytes(bytes(data))
        try:
            header_problem(read_header(path))
            read_footprint(path)
        except ModelFileError as e:
            assert "\n" not in str(e)
        except Exception as e:  # noqa: BLE001 - what the test looks for
            escaped.append(f"{i}: {type(e).__name__}: {e}")
        path.unlink()
    assert escaped == []


def test_a_truncated_file_is_refused_before_llama_cpp_reads_its_vocabulary(tiny_models):
    with pytest.raises(ModelFileError, match="truncated or corrupt") as caught:  # before: a vocab-only load passed
        Model(tiny_models.truncated, vocab_only=True)
    assert "tensors end at byte" in str(caught.value)
    assert "truncated" in header_problem(read_header(tiny_models.truncated))
    assert header_problem(read_header(tiny_models.target)) == ""


def test_a_refused_load_quotes_llama_cpps_most_specific_line(mtp_model, tmp_path):
    path = rewrite_gguf(mtp_model, tmp_path / "no-head.gguf", {}, drop=lambda name: name.startswith("blk.2."))
    with pytest.raises(ModelFileError) as caught:
        Model(path, n_gpu_layers=0)
    assert "(llama.cpp: tensor 'blk.2.attn_norm.weight' not found)" in str(caught.value)  # before: "failed to load"


def test_a_context_length_of_0_says_the_header_is_damaged(tiny_models, tmp_path, capsys):
    from support.badinput import assert_outcome, run_main

    path = rewrite_gguf(tiny_models.target, tmp_path / "no-context.gguf", {"llama.context_length": (0, T.UINT32)})
    outcome = run_main(["generate", "--target", path, "--max-tokens", "2", "Hi"], capsys)
    # before: "n_ctx 4096 exceeds what no-context.gguf was trained for (0)", as if --n-ctx were the mistake
    assert_outcome(outcome, 1, "has a damaged header (llama.context_length 0: a model trained on no context)")
    assert "would abort" not in outcome.err


def test_a_header_with_a_huge_block_count_is_one_line_under_generate(tiny_models, tmp_path, capsys):
    from support.badinput import assert_outcome, run_main

    path = rewrite_gguf(tiny_models.target, tmp_path / "huge.gguf", {"llama.block_count": (10**12, T.UINT64)})
    outcome = run_main(["generate", "--target", path, "--max-tokens", "2", "Hi"], capsys)  # before: MemoryError
    assert_outcome(outcome, 1, "block_count 1000000000000, not 1–512")
