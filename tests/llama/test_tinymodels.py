"""Proof that the tiny GGUF models of tests/support/tinymodels.py load and decode in the real llama.cpp.

Uses only llama.cpp's low-level C API (model/context/batch/logits/memory), the same layer the engine uses,
and pins down the memory behaviours the engine depends on: recurrent models refuse partial rollback, and a
sliding-window cache rolled back past its window breaks silently unless `swa_full` is set.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from support import tinymodels
from support.tinymodels import TinyModels

CHAT_PROMPT = "<|im_start|>user\nHello, how are you today?<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = (
    CHAT_PROMPT,
    "The water in the house was hot and the man said",
    "Write a long story about a mother and her little boy.",
)
# no_tokenizer loads but cannot tokenize (llama.cpp aborts): test_a_model_without_a_tokenizer_loads_…
LOADABLE = [f.name for f in dataclasses.fields(TinyModels) if f.name not in ("not_gguf", "truncated", "no_tokenizer")]


@pytest.fixture(scope="module", autouse=True)
def quiet_llama() -> Iterator[None]:
    """Silence llama.cpp's logging for this module, then restore whatever callback was installed before.

    The no-op callback object is kept alive by this frame until llama.cpp no longer points at it.
    """
    previous, previous_data = llama_cpp.llama_log_callback(), ctypes.c_void_p()
    llama_cpp.llama_log_get(ctypes.byref(previous), ctypes.byref(previous_data))
    callback = llama_cpp.llama_log_callback(lambda level, text, user_data: None)
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    yield
    llama_cpp.llama_log_set(previous, previous_data)


# --- thin low-level helpers ---------------------------------------------------------------------------------


@contextlib.contextmanager
def load_model(path: Path) -> Iterator[llama_cpp.llama_model_p]:
    """Load a model (CPU) and free it afterwards."""
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
    assert model, f"llama.cpp could not load {path}"
    try:
        yield model
    finally:
        llama_cpp.llama_model_free(model)


@contextlib.contextmanager
def new_context(model, **params) -> Iterator[llama_cpp.llama_context_p]:
    """Create a context with 2 threads, n_ctx 512 and the given overrides; free it afterwards."""
    cparams = llama_cpp.llama_context_default_params()
    for name, value in {"n_ctx": 512, "n_threads": 2, "n_threads_batch": 2, **params}.items():
        setattr(cparams, name, value)
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    assert ctx
    try:
        yield ctx
    finally:
        llama_cpp.llama_free(ctx)


def tokenize(model, text: str) -> list[int]:
    """Tokenize with BOS and special-token parsing, as a chat prompt is tokenized."""
    vocab = llama_cpp.llama_model_get_vocab(model)
    data = text.encode()
    buf = (llama_cpp.llama_token * (len(data) + 8))()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), True, True)
    assert n >= 0
    return list(buf[:n])


def detokenize(model, tokens: list[int]) -> bytes:
    """Concatenate the pieces of `tokens`, special tokens rendered."""
    vocab = llama_cpp.llama_model_get_vocab(model)
    buf = ctypes.create_string_buffer(256)
    pieces = []
    for token in tokens:
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
        assert n >= 0
        pieces.append(buf.raw[:n])
    return b"".join(pieces)


def n_vocab_of(model) -> int:
    return llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))


def decode(ctx, tokens: list[int], n_past: int, *, all_logits: bool = False) -> np.ndarray:
    """Decode `tokens` at positions n_past.. of sequence 0; return the logits of the last (or every) row."""
    n = len(tokens)
    batch = llama_cpp.llama_batch_init(n, 0, 1)
    try:
        batch.n_tokens = n
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, n_past + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = all_logits or i == n - 1
        assert llama_cpp.llama_decode(ctx, batch) == 0
    finally:
        llama_cpp.llama_batch_free(batch)
    n_vocab = n_vocab_of(llama_cpp.llama_get_model(ctx))
    rows = range(n) if all_logits else [n - 1]
    return np.stack(
        [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy() for i in rows]
    )  # (n_rows, n_vocab)


def generate_greedy(ctx, prompt: list[int], n_predict: int) -> tuple[list[int], np.ndarray]:
    """Greedy-decode n_predict tokens one at a time. Returns the tokens and each step's top-2 logit gap."""
    logits = decode(ctx, prompt, 0)[-1]
    tokens, gaps = [], []
    for n_past in range(len(prompt), len(prompt) + n_predict):
        top2 = np.partition(logits, -2)[-2:]
        gaps.append(top2[1] - top2[0])
        tokens.append(int(np.argmax(logits)))
        logits = decode(ctx, tokens[-1:], n_past)[-1]
    return tokens, np.array(gaps)


def greedy_agreement(target_path: Path, draft_path: Path, n_predict: int = 64) -> float:
    """Fraction of the target's greedy tokens that the draft also picks given the same (target) context."""
    agree = []
    with load_model(target_path) as target, load_model(draft_path) as draft:
        for text in PROMPTS:
            prompt = tokenize(target, text)
            with new_context(target) as ctx:
                tokens, _ = generate_greedy(ctx, prompt, n_predict)
            with new_context(draft) as ctx:
                logits = decode(ctx, prompt + tokens, 0, all_logits=True)  # (n_prompt + n_predict, n_vocab)
            agree.extend(logits[len(prompt) - 1 : -1].argmax(axis=1) == tokens)
    return float(np.mean(agree))


# --- every model loads and decodes --------------------------------------------------------------------------


@pytest.mark.parametrize("name", LOADABLE)
def test_model_loads_and_decodes_a_batch(tiny_models: TinyModels, name: str) -> None:
    with load_model(getattr(tiny_models, name)) as model, new_context(model) as ctx:
        prompt = tokenize(model, CHAT_PROMPT)
        logits = decode(ctx, prompt, 0, all_logits=True)
        assert logits.shape == (len(prompt), n_vocab_of(model))
        assert np.isfinite(logits).all() and logits.std() > 1.0


def test_a_model_without_a_tokenizer_loads_with_vocabulary_type_none(tiny_models: TinyModels) -> None:
    with load_model(tiny_models.no_tokenizer) as model:
        assert llama_cpp.llama_vocab_type(llama_cpp.llama_model_get_vocab(model)) == 0  # LLAMA_VOCAB_TYPE_NONE


@pytest.mark.parametrize("name", ["not_gguf", "truncated"])
def test_bad_files_are_refused(tiny_models: TinyModels, name: str) -> None:
    path = getattr(tiny_models, name)
    assert path.stat().st_size > 0
    assert not llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())


# --- vocabulary ---------------------------------------------------------------------------------------------


def test_vocab_has_chatml_specials_and_byte_fallback(tiny_models: TinyModels) -> None:
    with load_model(tiny_models.target) as model:
        vocab = llama_cpp.llama_model_get_vocab(model)
        assert llama_cpp.llama_vocab_type(vocab) == llama_cpp.LLAMA_VOCAB_TYPE_SPM
        assert (llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_eos(vocab)) == (1, 2)
        assert llama_cpp.llama_vocab_eot(vocab) == 4 and llama_cpp.llama_vocab_get_add_bos(vocab)
        assert llama_cpp.llama_vocab_is_eog(vocab, 2) and llama_cpp.llama_vocab_is_eog(vocab, 4)
        assert tokenize(model, "<|im_start|>user")[:2] == [1, 3]

        english = tokenize(model, "the man said that")
        assert len(english) == 5  # BOS + one token per word
        text = "Zürich 🙂, naïve\n\ttabs"
        assert detokenize(model, tokenize(model, text)[1:]) == b" " + text.encode()


def _texts(model) -> list[bytes]:
    vocab = llama_cpp.llama_model_get_vocab(model)
    return [llama_cpp.llama_vocab_get_text(vocab, i) for i in range(n_vocab_of(model))]


def test_vocab_variants_differ_only_where_named(tiny_models: TinyModels) -> None:
    with load_model(tiny_models.target) as model:
        texts = _texts(model)

    def inspect(path: Path) -> tuple[int, int, int, list[bytes]]:
        with load_model(path) as model:
            vocab = llama_cpp.llama_model_get_vocab(model)
            return (
                llama_cpp.llama_vocab_type(vocab),
                llama_cpp.llama_vocab_bos(vocab),
                llama_cpp.llama_vocab_eos(vocab),
                _texts(model),
            )

    assert inspect(tiny_models.vocab_bpe)[0] == llama_cpp.LLAMA_VOCAB_TYPE_BPE
    assert inspect(tiny_models.vocab_other_specials) == (llama_cpp.LLAMA_VOCAB_TYPE_SPM, 2, 1, texts)
    far = inspect(tiny_models.vocab_far_size)[3]
    assert len(far) - len(texts) > 128 and far[: len(texts)] == texts
    near = inspect(tiny_models.vocab_near_size)[3]
    assert 0 < len(near) - len(texts) <= 128 and near[: len(texts)] == texts
    renamed = inspect(tiny_models.vocab_renamed)[3]
    assert [i for i, (a, b) in enumerate(zip(texts, renamed)) if a != b] == [tinymodels.VARIANT_RENAMED_ID]
    assert len(renamed) == len(texts)


def test_chat_template_present_or_absent(tiny_models: TinyModels) -> None:
    with load_model(tiny_models.target) as model:
        assert b"<|im_start|>assistant\\n" in llama_cpp.llama_model_chat_template(model, None)
    with load_model(tiny_models.no_template) as model:
        assert llama_cpp.llama_model_chat_template(model, None) is None


# --- generation quality and draft agreement -----------------------------------------------------------------


def test_target_greedy_is_peaky_varied_and_does_not_stop(tiny_models: TinyModels) -> None:
    with load_model(tiny_models.target) as model, new_context(model) as ctx:
        tokens, gaps = generate_greedy(ctx, tokenize(model, CHAT_PROMPT), 64)
        vocab = llama_cpp.llama_model_get_vocab(model)
        assert not any(llama_cpp.llama_vocab_is_eog(vocab, t) for t in tokens)
    assert gaps.min() > 1e-3 and np.median(gaps) > 0.5
    assert len(set(tokens)) >= 32


@pytest.mark.slow
def test_draft_agreement_with_target(tiny_models: TinyModels) -> None:
    assert greedy_agreement(tiny_models.target, tiny_models.draft_same) == 1.0
    # Measured 0.75 (teacher-forced); in a k-token greedy draft loop: 0.77 (k=1), 0.65 (k=2), 0.52 (k=4).
    assert 0.5 <= greedy_agreement(tiny_models.target, tiny_models.draft_noisy) <= 0.9
    assert greedy_agreement(tiny_models.target, tiny_models.draft_unrelated) < 0.1


# --- memory behaviours the engine relies on -----------------------------------------------------------------


def test_recurrent_model_refuses_partial_rollback(tiny_models: TinyModels) -> None:
    with load_model(tiny_models.recurrent) as model, new_context(model, n_rs_seq=4) as ctx:
        assert llama_cpp.llama_model_is_recurrent(model)
        assert llama_cpp.llama_n_rs_seq(ctx) == 0  # rollback snapshots are clamped to 0 for mamba
        prompt = tokenize(model, PROMPTS[1])
        decode(ctx, prompt, 0)
        mem = llama_cpp.llama_get_memory(ctx)
        n = len(prompt)
        assert llama_cpp.llama_memory_seq_rm(mem, 0, n - 3, -1) is False
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == n - 1  # nothing was removed

        # What works instead: snapshot the sequence state, decode ahead, restore it.
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        state = (ctypes.c_uint8 * size)()
        assert llama_cpp.llama_state_seq_get_data(ctx, state, size, 0) == size
        expected = decode(ctx, [prompt[1]], n)
        decode(ctx, prompt[2:5], n + 1)
        assert llama_cpp.llama_memory_seq_rm(mem, 0, 0, -1) is True  # the whole sequence may go
        assert llama_cpp.llama_state_seq_set_data(ctx, state, size, 0) == size
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == n - 1
        np.testing.assert_array_equal(decode(ctx, [prompt[1]], n), expected)


SWA_SEQ_LEN = 300  # > 256 cells, the smallest SWA cache llama.cpp allocates


def _swa_rollback(path: Path, p0: int, *, swa_full: bool) -> tuple[bool, tuple[int, int], tuple[int, int], float]:
    """Decode SWA_SEQ_LEN tokens, remove positions >= p0, decode token p0 again.

    Returns (seq_rm result, (pos_min, pos_max) before, the same after, max |logits - reference|), where the
    reference decodes the same p0 tokens then token p0 in a fresh full-size cache (exact rollback gives ~0).
    """
    seq = [1, *np.random.default_rng(0).integers(261, 800, SWA_SEQ_LEN - 1).tolist()]
    with load_model(path) as model:
        params = {"n_ctx": 1024, "n_ubatch": 32}
        with new_context(model, swa_full=True, **params) as ctx:
            decode(ctx, seq[:p0], 0)
            reference = decode(ctx, [seq[p0]], p0)
        with new_context(model, swa_full=swa_full, **params) as ctx:
            mem = llama_cpp.llama_get_memory(ctx)
            decode(ctx, seq, 0)
            before = (llama_cpp.llama_memory_seq_pos_min(mem, 0), llama_cpp.llama_memory_seq_pos_max(mem, 0))
            removed = llama_cpp.llama_memory_seq_rm(mem, 0, p0, -1)
            after = (llama_cpp.llama_memory_seq_pos_min(mem, 0), llama_cpp.llama_memory_seq_pos_max(mem, 0))
            logits = decode(ctx, [seq[p0]], p0)
    return removed, before, after, float(np.abs(logits - reference).max())


@pytest.mark.parametrize(
    ("p0", "pos_after", "exact"),
    [
        (290, (44, 289), True),  # short rollback: fine
        (51, (44, 50), True),  # window 44..51 still cached: p0 >= pos_min + n_swa - 1
        (50, (44, 49), False),  # needs position 43, already evicted: wrong logits, pos_min looks fine
        (44, (-1, -1), False),  # at pos_min: the SWA cache is emptied, decode still succeeds
        (20, (-1, -1), False),
    ],
)
@pytest.mark.slow
def test_swa_rollback_with_default_cache(tiny_models: TinyModels, p0, pos_after, exact) -> None:
    with load_model(tiny_models.swa) as model:
        assert llama_cpp.llama_model_n_swa(model) == 8
    removed, before, after, diff = _swa_rollback(tiny_models.swa, p0, swa_full=False)
    assert removed is True
    assert before == (SWA_SEQ_LEN - 256, SWA_SEQ_LEN - 1)
    assert after == pos_after
    assert diff < 0.1 if exact else diff > 1.0


@pytest.mark.parametrize("p0", [290, 50, 20])
@pytest.mark.slow
def test_swa_full_rollback_is_exact(tiny_models: TinyModels, p0: int) -> None:
    removed, before, after, diff = _swa_rollback(tiny_models.swa, p0, swa_full=True)
    assert (removed, before, after) == (True, (0, SWA_SEQ_LEN - 1), (0, p0 - 1))
    assert diff < 1e-4


# --- the real small model from PyPI -------------------------------------------------------------------------


def test_smollm2_fixture_finds_a_chatml_gguf(smollm2_path: Path) -> None:
    with smollm2_path.open("rb") as f:
        assert f.read(4) == b"GGUF"
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(smollm2_path).encode(), params)
    assert model
    try:
        assert n_vocab_of(model) == 49152
        assert b"<|im_start|>" in llama_cpp.llama_model_chat_template(model, None)
    finally:
        llama_cpp.llama_model_free(model)
