"""Tiny GGUF models with random weights, written on the fly for tests of the real llama.cpp.

Owns the shared test vocabulary (SentencePiece-style, ChatML control tokens, 256 byte-fallback tokens),
writers for llama, mamba (recurrent) and gemma3 (sliding-window) models, vocabulary variants for draft/target
compatibility checks, and deliberately broken files. Each model is a few hundred KB of F32 and loads and
decodes in milliseconds on two CPU cores, so tests never download weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

SPIECE_SPACE = "\u2581"  # "▁": SentencePiece's word-boundary marker
BPE_SPACE = "\u0120"  # "Ġ": GPT-2's byte-level image of b" "

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
_N_SPECIAL = len(_SPECIAL_TOKENS)
UNK_ID, BOS_ID, EOS_ID, IM_START_ID, IM_END_ID = range(_N_SPECIAL)

_WORDS = (
    "the of and to a in is it you that he was for on are with as I his they be at one have this from or had by "
    "hot word but what some we can out other were all there when up use your how said an each she which do "
    "their time if will way about many then them write would like so these her long make thing see him two has "
    "look more day could go come did number sound no most people my over know water than call first who may "
    "down side been now find any new work part take get place made live where after back little only round man "
    "year came show every good me give our under name very through just form sentence great think say help low "
    "line turn cause much mean before move right boy old too same tell does set three want air well also play "
    "small end put home read hand large spell add even land here must big high such follow act why ask men "
    "change went light kind off need house picture try us again animal point mother world near build self earth "
    "father Hello The It This We You What How chat model token draft target fast slow test"
).split()
_SUFFIXES = ("s", "ed", "ing", "er", "ly", "est")
_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?;:'\"-()[]{}<>/\\@#$%&*+=_~`|^"


@dataclass(frozen=True)
class Vocab:
    """A tokenizer as GGUF stores it: parallel token lists plus the special ids.

    `model` is `tokenizer.ggml.model` ("llama" = SentencePiece, "gpt2" = byte-level BPE with `merges`).
    """

    model: str
    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    eot_id: int | None = IM_END_ID
    unk_id: int | None = UNK_ID
    merges: tuple[str, ...] = ()
    pre: str | None = None

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class LlamaShape:
    """Hyperparameters of a tiny llama-architecture model (head_dim = n_embd // n_head)."""

    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128


@dataclass(frozen=True)
class TinyModels:
    """Paths of every tiny model file written by `write_tiny_models`, one directory for all."""

    target: Path  # llama, seed TARGET_SEED, shared vocabulary, ChatML template
    draft_same: Path  # the target's tensors exactly: every draft token is accepted
    draft_noisy: Path  # target + DRAFT_NOISE relative noise: ~75% greedy agreement
    draft_unrelated: Path  # another seed: ~0% agreement
    no_template: Path  # the target without tokenizer.chat_template
    vocab_bpe: Path  # "gpt2" (BPE) vocabulary type, another seed: bridged, little agreement
    vocab_other_specials: Path  # BOS/EOS ids swapped (2/1): bridged
    vocab_far_size: Path  # +200 tokens appended: bridged
    vocab_near_size: Path  # +64 tokens appended, target tensors: bridged (real extra tokens), 100% agreement
    vocab_renamed: Path  # token VARIANT_RENAMED_ID renamed, same size: bridged
    vocab_prefix: Path  # the last VARIANT_FEWER tokens missing (ids below identical): bridged
    vocab_shuffled: Path  # the target's pieces under other ids, its weights + DRAFT_NOISE: bridged, partial agreement
    recurrent: Path  # mamba, 2 layers: partial seq_rm fails
    swa: Path  # gemma3, sliding window 8 on layer 0: see write_swa_model
    not_gguf: Path  # a text file
    truncated: Path  # first half of the target
    no_tokenizer: Path  # the target's weights, tokenizer.ggml.model "none" and no token list: llama.cpp loads it


# --- vocabularies -------------------------------------------------------------------------------------------


def _word_pieces(space: str) -> list[str]:
    """Normal pieces in a fixed order: single characters, then every prefix of every word and suffix.

    Prefix chains matter: llama.cpp's SPM and BPE tokenizers grow a word by merging adjacent symbols, and
    only merges whose result is itself a token happen, so "▁the" needs "▁t" and "▁th" as well.
    """
    pieces = [space, *_CHARS]
    for word in [space + w for w in _WORDS] + list(_SUFFIXES):
        pieces.extend(word[:end] for end in range(2, len(word) + 1))
    return list(dict.fromkeys(pieces))


def make_vocab() -> Vocab:
    """Build the shared SentencePiece-style vocabulary.

    Layout: `<unk>`, `<s>`, `</s>` (ids 0-2), `<|im_start|>`, `<|im_end|>` (ids 3-4, CONTROL), the 256 byte
    tokens `<0x00>`..`<0xFF>` (ids 5-260, BYTE), then ~600 normal pieces. Any UTF-8 text tokenizes through
    byte fallback; ordinary English tokenizes into "▁word" tokens. `<|im_end|>` is the EOT token.

    Returns:
        The vocabulary (deterministic: equal on every call).
    """
    pieces = _word_pieces(SPIECE_SPACE)
    tokens = (*_SPECIAL_TOKENS, *(f"<0x{b:02X}>" for b in range(256)), *pieces)
    types = (
        gguf.TokenType.UNKNOWN,
        *[gguf.TokenType.CONTROL] * 4,
        *[gguf.TokenType.BYTE] * 256,
        *[gguf.TokenType.NORMAL] * len(pieces),
    )
    # SentencePiece scores are log-probabilities: earlier (shorter) pieces are more frequent.
    scores = (0.0,) * (_N_SPECIAL + 256) + tuple(-float(i) for i in range(len(pieces)))
    return Vocab(model="llama", tokens=tokens, scores=scores, types=tuple(int(t) for t in types))


def _gpt2_byte_chars() -> list[str]:
    """GPT-2's reversible map from the 256 byte values to printable unicode characters, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def make_bpe_vocab() -> Vocab:
    """Build a byte-level BPE ("gpt2") vocabulary with the same special tokens and words as `make_vocab`.

    Its type differs from the shared vocabulary, so a draft using it must be refused.

    Returns:
        The vocabulary, with merges that rebuild every word piece left to right.
    """
    byte_chars = _gpt2_byte_chars()
    pieces = [p for p in _word_pieces(BPE_SPACE) if len(p) > 1]
    tokens = (*_SPECIAL_TOKENS, *byte_chars, *pieces)
    types = (int(gguf.TokenType.CONTROL),) * _N_SPECIAL + (int(gguf.TokenType.NORMAL),) * (256 + len(pieces))
    merges = tuple(f"{p[:-1]} {p[-1]}" for p in pieces)
    return Vocab(
        model="gpt2",
        tokens=tokens,
        scores=(0.0,) * len(tokens),
        types=types,
        merges=merges,
        pre="gpt-2",
        unk_id=None,
    )


def with_special_ids(vocab: Vocab, *, bos_id: int, eos_id: int) -> Vocab:
    """Return `vocab` with other BOS/EOS ids (same token texts), e.g. to test the BOS/EOS compatibility check."""
    return dataclasses.replace(vocab, bos_id=bos_id, eos_id=eos_id)


def with_extra_tokens(vocab: Vocab, n_extra: int) -> Vocab:
    """Return `vocab` with `n_extra` normal tokens ("▁extra0000", ...) appended after the last id."""
    extra = tuple(f"{SPIECE_SPACE}extra{i:04d}" for i in range(n_extra))
    low = vocab.scores[-1] - 1.0
    return dataclasses.replace(
        vocab,
        tokens=vocab.tokens + extra,
        scores=vocab.scores + tuple(low - i for i in range(n_extra)),
        types=vocab.types + (int(gguf.TokenType.NORMAL),) * n_extra,
    )


def with_fewer_tokens(vocab: Vocab, n_fewer: int) -> Vocab:
    """Return `vocab` without its last `n_fewer` tokens (a prefix of it: the same ids below the cut)."""
    keep = len(vocab.tokens) - n_fewer
    return dataclasses.replace(vocab, tokens=vocab.tokens[:keep], scores=vocab.scores[:keep], types=vocab.types[:keep])


def shuffled(vocab: Vocab, tensors: Mapping[str, np.ndarray], seed: int) -> tuple[Vocab, dict[str, np.ndarray]]:
    """The same tokenizer and model under other ids: the normal pieces permuted (each keeps its score), and the
    embedding/output rows permuted with them, so the model writes the same text through different token ids."""
    first = next(i for i, t in enumerate(vocab.types) if t == int(gguf.TokenType.NORMAL))
    order = np.arange(vocab.n_vocab)  # new id -> old id
    order[first:] = first + np.random.default_rng(seed).permutation(vocab.n_vocab - first)
    pick = order.tolist()
    moved = dataclasses.replace(
        vocab,
        tokens=tuple(vocab.tokens[i] for i in pick),
        scores=tuple(vocab.scores[i] for i in pick),
        types=tuple(vocab.types[i] for i in pick),
    )
    rows = {name: np.ascontiguousarray(tensors[name][order]) for name in ("token_embd.weight", "output.weight")}
    return moved, {**tensors, **rows}


def with_renamed_token(vocab: Vocab, token_id: int, text: str) -> Vocab:
    """Return `vocab` with the text of one token replaced; size, types and scores are unchanged."""
    if text in vocab.tokens:
        raise ValueError(f"{text!r} is already a token")
    tokens = list(vocab.tokens)
    tokens[token_id] = text
    return dataclasses.replace(vocab, tokens=tuple(tokens))


# --- tensors ------------------------------------------------------------------------------------------------


def _output_row_scales(vocab: Vocab, *, control_scale: float, byte_scale: float) -> np.ndarray:
    """Per-token multipliers for the output matrix: control tokens (EOS, `<|im_end|>`) muted, bytes damped."""
    scales = np.ones(vocab.n_vocab, dtype=np.float32)  # (n_vocab,)
    types = np.asarray(vocab.types)
    scales[(types == gguf.TokenType.CONTROL) | (types == gguf.TokenType.UNKNOWN)] = control_scale
    scales[types == gguf.TokenType.BYTE] = byte_scale
    return scales


def make_llama_tensors(
    seed: int,
    *,
    vocab: Vocab | None = None,
    shape: LlamaShape = LlamaShape(),
    control_scale: float = 0.0,
    byte_scale: float = 0.3,
) -> dict[str, np.ndarray]:
    """Draw the random F32 tensors of a tiny llama model.

    The scales are chosen so that greedy decoding is well defined and not degenerate: output rows have unit
    scale, so logits have a standard deviation of ~sqrt(n_embd) = 8 and the top-2 gap is ~2 (near-ties below
    1e-3 are rare); queries/keys are scaled up so attention is sharp and the continuation depends on context,
    not only on the last token. Control tokens get output rows scaled by `control_scale` (0: the model
    practically never ends a generation by itself) and byte tokens by `byte_scale`.

    Args:
        seed: Seed of the numpy Generator; equal seeds give identical tensors.
        vocab: Vocabulary whose size and token types shape the embedding/output matrices (default `make_vocab()`).
        shape: Layer sizes.
        control_scale: Multiplier of the output rows of control/unknown tokens.
        byte_scale: Multiplier of the output rows of byte tokens.

    Returns:
        GGUF tensor name -> numpy array in numpy order (GGUFWriter reverses it into ggml order).
    """
    vocab = vocab or make_vocab()
    rng = np.random.default_rng(seed)
    d, head_dim = shape.n_embd, shape.n_embd // shape.n_head
    n_kv = shape.n_head_kv * head_dim

    def normal(rows: int, cols: int, std: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    scales = _output_row_scales(vocab, control_scale=control_scale, byte_scale=byte_scale)
    tensors = {
        "token_embd.weight": normal(vocab.n_vocab, d, 1.0),  # (n_vocab, n_embd)
        "output_norm.weight": np.ones(d, dtype=np.float32),
        "output.weight": normal(vocab.n_vocab, d, 1.0) * scales[:, None],  # (n_vocab, n_embd)
    }
    for il in range(shape.n_layer):
        blk = f"blk.{il}"
        tensors |= {
            f"{blk}.attn_norm.weight": np.ones(d, dtype=np.float32),
            f"{blk}.attn_q.weight": normal(d, d, 2.0 / np.sqrt(d)),  # (n_head*head_dim, n_embd)
            f"{blk}.attn_k.weight": normal(n_kv, d, 2.0 / np.sqrt(d)),  # (n_head_kv*head_dim, n_embd)
            f"{blk}.attn_v.weight": normal(n_kv, d, 1.0 / np.sqrt(d)),
            f"{blk}.attn_output.weight": normal(d, d, 1.0 / np.sqrt(d)),
            f"{blk}.ffn_norm.weight": np.ones(d, dtype=np.float32),
            f"{blk}.ffn_gate.weight": normal(shape.n_ff, d, 1.0 / np.sqrt(d)),  # (n_ff, n_embd)
            f"{blk}.ffn_up.weight": normal(shape.n_ff, d, 1.0 / np.sqrt(d)),
            f"{blk}.ffn_down.weight": normal(d, shape.n_ff, 1.0 / np.sqrt(shape.n_ff)),  # (n_embd, n_ff)
        }
    return tensors


def add_noise(tensors: Mapping[str, np.ndarray], noise: float, seed: int) -> dict[str, np.ndarray]:
    """Return a copy of `tensors` plus gaussian noise of relative scale `noise` (times each tensor's RMS).

    Args:
        tensors: Tensors to perturb (not modified).
        noise: Noise standard deviation relative to the tensor's root-mean-square; 0 copies exactly.
        seed: Seed of the noise generator.

    Returns:
        The perturbed tensors, F32.
    """
    rng = np.random.default_rng(seed)
    noisy = {}
    for name, t in tensors.items():
        rms = float(np.sqrt(np.mean(np.square(t, dtype=np.float64))))
        noisy[name] = (t + rng.standard_normal(t.shape) * noise * rms).astype(np.float32)
    return noisy


def _resize_vocab_rows(tensors: Mapping[str, np.ndarray], vocab: Vocab, seed: int) -> dict[str, np.ndarray]:
    """Fit the embedding/output matrices of `tensors` to `vocab`: keep shared rows, draw damped new ones."""
    rng = np.random.default_rng(seed)
    resized = dict(tensors)
    for name in ("token_embd.weight", "output.weight"):
        rows = tensors[name][: vocab.n_vocab]
        n_new = vocab.n_vocab - len(rows)
        # New tokens get small output rows: they exist for the vocabulary checks, not to be generated.
        new = rng.standard_normal((n_new, rows.shape[1])) * (1.0 if name == "token_embd.weight" else 0.1)
        resized[name] = np.concatenate([rows, new.astype(np.float32)])
    return resized


# --- writers ------------------------------------------------------------------------------------------------


def _add_vocab(writer: gguf.GGUFWriter, vocab: Vocab, chat_template: bool | str) -> None:
    """Write the `tokenizer.*` keys of `vocab` and, unless `chat_template` is False, a chat template."""
    writer.add_tokenizer_model(vocab.model)
    if vocab.model == "none":  # no tokenizer at all: the model key alone
        return
    if vocab.pre is not None:
        writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_scores(list(vocab.scores))
    writer.add_token_types(list(vocab.types))
    if vocab.merges:
        writer.add_token_merges(list(vocab.merges))
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    if vocab.eot_id is not None:
        writer.add_eot_token_id(vocab.eot_id)
    if vocab.unk_id is not None:
        writer.add_unk_token_id(vocab.unk_id)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if chat_template:
        writer.add_chat_template(CHATML_TEMPLATE if chat_template is True else chat_template)


def _write_gguf(
    path: Path,
    arch: str,
    add_hparams: Callable[[gguf.GGUFWriter], None],
    vocab: Vocab,
    chat_template: bool | str,
    tensors: Mapping[str, np.ndarray],
) -> Path:
    """Write one GGUF file: architecture hparams (via `add_hparams(writer)`), vocabulary, tensors."""
    path = Path(path)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_hparams(writer)
    _add_vocab(writer, vocab, chat_template)
    for name, tensor in tensors.items():
        writer.add_tensor(name, np.ascontiguousarray(tensor, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_llama_model(
    path: Path,
    *,
    seed: int = 0,
    base: Mapping[str, np.ndarray] | None = None,
    noise: float = 0.0,
    vocab: Vocab | None = None,
    chat_template: bool | str = True,
    context_length: int = 2048,
    shape: LlamaShape = LlamaShape(),
) -> Path:
    """Write a tiny llama-architecture GGUF model (F32, random weights).

    Args:
        path: Destination file.
        seed: Seed for the weights (when `base` is None) and for the noise.
        base: Tensors to start from instead of drawing new ones: the target's for a draft, or
            `make_llama_tensors(seed, control_scale=...)` for a model that does end its turns. Rows of the
            embedding/output matrices are kept, dropped or appended to fit `vocab`.
        noise: Relative gaussian noise added to every tensor (see `add_noise`); 0 keeps `base` exact.
        vocab: Vocabulary (default `make_vocab()`).
        chat_template: True for ChatML, False for none, or a Jinja template string.
        context_length: `llama.context_length` (n_ctx_train).
        shape: Layer sizes; must match `base` when given.

    Returns:
        `path`.
    """
    vocab = vocab or make_vocab()
    if base is None:
        tensors = make_llama_tensors(seed, vocab=vocab, shape=shape)
    else:
        tensors = _resize_vocab_rows(base, vocab, seed)
    if noise:
        tensors = add_noise(tensors, noise, seed)

    return _write_gguf(
        path, "llama", _llama_hparams(shape, context_length, vocab.n_vocab), vocab, chat_template, tensors
    )


def _llama_hparams(shape: LlamaShape, context_length: int, n_vocab: int) -> Callable[[gguf.GGUFWriter], None]:
    """The `llama.*` hyperparameters of a tiny llama model, as `_write_gguf` takes them."""

    def add_hparams(writer: gguf.GGUFWriter) -> None:
        writer.add_context_length(context_length)
        writer.add_embedding_length(shape.n_embd)
        writer.add_block_count(shape.n_layer)
        writer.add_feed_forward_length(shape.n_ff)
        writer.add_head_count(shape.n_head)
        writer.add_head_count_kv(shape.n_head_kv)
        writer.add_rope_dimension_count(shape.n_embd // shape.n_head)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_rope_freq_base(10000.0)
        writer.add_vocab_size(n_vocab)

    return add_hparams


def write_moe_model(
    path: Path, *, seed: int = 0, vocab: Vocab | None = None, n_expert: int = 4, n_expert_used: int = 2
) -> Path:
    """Write a tiny mixture-of-experts GGUF (Qwen3-MoE architecture, F32): the llama tensors, each layer's
    feed-forward replaced by `n_expert` experts (`blk.N.ffn_{gate,up,down}_exps`, what --cpu-moe keeps on the CPU)
    and a router, plus Qwen3's q/k norms."""
    vocab = vocab or make_vocab()
    shape = LlamaShape()
    d, n_ff_exp, head_dim = shape.n_embd, 32, shape.n_embd // shape.n_head
    rng = np.random.default_rng(seed + 1)
    tensors = {k: v for k, v in make_llama_tensors(seed, vocab=vocab).items() if ".ffn_" not in k or "norm" in k}
    for il in range(shape.n_layer):
        blk = f"blk.{il}"
        tensors |= {
            f"{blk}.attn_q_norm.weight": np.ones(head_dim, dtype=np.float32),
            f"{blk}.attn_k_norm.weight": np.ones(head_dim, dtype=np.float32),
            f"{blk}.ffn_gate_inp.weight": (rng.standard_normal((n_expert, d)) / np.sqrt(d)).astype(np.float32),
            f"{blk}.ffn_gate_exps.weight": (rng.standard_normal((n_expert, n_ff_exp, d)) / np.sqrt(d)).astype(
                np.float32
            ),
            f"{blk}.ffn_up_exps.weight": (rng.standard_normal((n_expert, n_ff_exp, d)) / np.sqrt(d)).astype(np.float32),
            f"{blk}.ffn_down_exps.weight": (rng.standard_normal((n_expert, d, n_ff_exp)) / np.sqrt(n_ff_exp)).astype(
                np.float32
            ),
        }
    llama_hparams = _llama_hparams(shape, 2048, vocab.n_vocab)

    def add_hparams(writer: gguf.GGUFWriter) -> None:
        llama_hparams(writer)
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_expert_count(n_expert)
        writer.add_expert_used_count(n_expert_used)
        writer.add_expert_feed_forward_length(n_ff_exp)

    return _write_gguf(path, "qwen3moe", add_hparams, vocab, True, tensors)


def write_mamba_model(
    path: Path, *, seed: int = 0, vocab: Vocab | None = None, n_embd: int = 64, n_layer: int = 2
) -> Path:
    """Write a tiny recurrent (Mamba-1) GGUF model with the shared vocabulary.

    llama.cpp only supports d_inner = 2 * n_embd; the state is d_state=16, conv kernel 4, dt_rank 4. Its
    memory is one recurrent state per sequence, so `llama_memory_seq_rm` of a partial tail returns False and
    removes nothing. The context param `n_rs_seq` (rollback snapshots) does not help: llama.cpp clamps it to 0
    for mamba (only a few architectures, e.g. qwen35, lfm2, nemotron_h, support it). Removing the whole
    sequence, and saving/restoring it with `llama_state_seq_get_data/set_data`, work.

    Args:
        path: Destination file.
        seed: Seed for the weights.
        vocab: Vocabulary (default `make_vocab()`).
        n_embd: Embedding width.
        n_layer: Number of Mamba blocks.

    Returns:
        `path`.
    """
    vocab = vocab or make_vocab()
    rng = np.random.default_rng(seed)
    d_inner, d_conv, d_state, dt_rank = 2 * n_embd, 4, 16, 4

    def normal(*dims: int, std: float) -> np.ndarray:
        return (rng.standard_normal(dims) * std).astype(np.float32)

    scales = _output_row_scales(vocab, control_scale=0.0, byte_scale=0.3)
    tensors = {
        "token_embd.weight": normal(vocab.n_vocab, n_embd, std=1.0),
        "output_norm.weight": np.ones(n_embd, dtype=np.float32),
        "output.weight": normal(vocab.n_vocab, n_embd, std=1.0) * scales[:, None],
    }
    a_log = np.log(np.arange(1, d_state + 1, dtype=np.float32))
    for il in range(n_layer):
        blk = f"blk.{il}"
        tensors |= {
            f"{blk}.attn_norm.weight": np.ones(n_embd, dtype=np.float32),
            f"{blk}.ssm_in.weight": normal(2 * d_inner, n_embd, std=1.0 / np.sqrt(n_embd)),
            f"{blk}.ssm_conv1d.weight": normal(d_inner, d_conv, std=0.5),  # ggml {d_conv, d_inner}
            f"{blk}.ssm_conv1d.bias": np.zeros(d_inner, dtype=np.float32),
            f"{blk}.ssm_x.weight": normal(dt_rank + 2 * d_state, d_inner, std=1.0 / np.sqrt(d_inner)),
            f"{blk}.ssm_dt.weight": normal(d_inner, dt_rank, std=1.0 / np.sqrt(dt_rank)),
            f"{blk}.ssm_dt.bias": np.full(d_inner, -2.0, dtype=np.float32),
            # A = -exp(A_log) as the HF->GGUF converter stores it: negative, one decay rate per state dim.
            f"{blk}.ssm_a": -np.exp(np.tile(a_log, (d_inner, 1))),  # (d_inner, d_state)
            f"{blk}.ssm_d": np.ones(d_inner, dtype=np.float32),
            f"{blk}.ssm_out.weight": normal(n_embd, d_inner, std=1.0 / np.sqrt(d_inner)),
        }

    def add_hparams(writer: gguf.GGUFWriter) -> None:
        writer.add_context_length(2048)
        writer.add_embedding_length(n_embd)
        writer.add_block_count(n_layer)
        writer.add_feed_forward_length(0)
        writer.add_head_count(0)
        writer.add_ssm_conv_kernel(d_conv)
        writer.add_ssm_inner_size(d_inner)
        writer.add_ssm_state_size(d_state)
        writer.add_ssm_time_step_rank(dt_rank)
        writer.add_layer_norm_rms_eps(1e-5)

    return _write_gguf(path, "mamba", add_hparams, vocab, True, tensors)


def write_swa_model(
    path: Path,
    *,
    seed: int = 0,
    vocab: Vocab | None = None,
    sliding_window: int = 8,
    n_embd: int = 64,
    n_head: int = 4,
    n_ff: int = 128,
) -> Path:
    """Write a tiny sliding-window (gemma3) GGUF model: layer 0 uses SWA, layer 1 full attention.

    Measured with tests/llama/test_tinymodels.py (n_swa=8, n_ubatch=32, so the SWA cache has 256 cells, its padded
    minimum; 300 tokens decoded; then `llama_memory_seq_rm(mem, 0, p0, -1)` and a decode of token p0):
      - default cache (swa_full=False): seq_rm returns True for every p0. seq_pos_min/max report the SWA cache,
        not the full one: (44, 299) before the removal, not (0, 299).
        * p0 >= pos_min + n_swa - 1 (p0 = 51, 60, 250, 290): after = (44, p0-1); logits match a fresh prefill
          (max |diff| 0.002-0.02, kernel-order noise).
        * pos_min < p0 < pos_min + n_swa - 1 (p0 = 47, 50): after = (44, p0-1), which looks healthy, but the
          window needs evicted positions: logits off by 5-27. Silently wrong.
        * p0 <= pos_min (p0 = 44, 20, 1): the SWA cache is emptied, after = (-1, -1), although the full layers
          still hold 0..p0-1; llama_decode at p0 returns 0 (its position check is skipped when pos_max is -1)
          and the logits are wrong. Silently wrong.
      - swa_full=True: pos_min stays 0, after = (0, p0-1), logits bit-identical to a fresh prefill for all p0.
    So a rollback to p0 is safe iff swa_full, or p0 >= seq_pos_min (read before removing) + n_swa - 1;
    otherwise clear the sequence and prefill again. `llama_model_n_swa` gives n_swa.

    Args:
        path: Destination file.
        seed: Seed for the weights.
        vocab: Vocabulary (default `make_vocab()`).
        sliding_window: Attention window of the SWA layer, in tokens.
        n_embd: Embedding width.
        n_head: Attention heads (head_dim = n_embd // n_head; one KV head).
        n_ff: Feed-forward width.

    Returns:
        `path`.
    """
    vocab = vocab or make_vocab()
    rng = np.random.default_rng(seed)
    n_layer, head_dim = 2, n_embd // n_head

    def normal(rows: int, cols: int, std: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    # Gemma scales the input embeddings by sqrt(n_embd); a separate output matrix (the real models tie it to the
    # embeddings) keeps greedy decoding from repeating the current token forever.
    scales = _output_row_scales(vocab, control_scale=0.0, byte_scale=0.3)
    tensors = {
        "token_embd.weight": normal(vocab.n_vocab, n_embd, 1.0 / np.sqrt(n_embd)),
        "output_norm.weight": ones(n_embd),
        "output.weight": normal(vocab.n_vocab, n_embd, 1.0) * scales[:, None],
    }
    for il in range(n_layer):
        blk = f"blk.{il}"
        tensors |= {
            f"{blk}.attn_norm.weight": ones(n_embd),
            f"{blk}.attn_q.weight": normal(n_head * head_dim, n_embd, 2.0 / np.sqrt(n_embd)),
            f"{blk}.attn_k.weight": normal(head_dim, n_embd, 2.0 / np.sqrt(n_embd)),
            f"{blk}.attn_v.weight": normal(head_dim, n_embd, 1.0 / np.sqrt(n_embd)),
            f"{blk}.attn_q_norm.weight": ones(head_dim),
            f"{blk}.attn_k_norm.weight": ones(head_dim),
            f"{blk}.attn_output.weight": normal(n_embd, n_head * head_dim, 1.0 / np.sqrt(n_embd)),
            f"{blk}.post_attention_norm.weight": ones(n_embd),
            f"{blk}.ffn_norm.weight": ones(n_embd),
            f"{blk}.ffn_gate.weight": normal(n_ff, n_embd, 1.0 / np.sqrt(n_embd)),
            f"{blk}.ffn_up.weight": normal(n_ff, n_embd, 1.0 / np.sqrt(n_embd)),
            f"{blk}.ffn_down.weight": normal(n_embd, n_ff, 1.0 / np.sqrt(n_ff)),
            f"{blk}.post_ffw_norm.weight": ones(n_embd),
        }

    def add_hparams(writer: gguf.GGUFWriter) -> None:
        writer.add_context_length(2048)
        writer.add_embedding_length(n_embd)
        writer.add_block_count(n_layer)
        writer.add_feed_forward_length(n_ff)
        writer.add_head_count(n_head)
        writer.add_head_count_kv(1)
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_layer_norm_rms_eps(1e-6)
        writer.add_rope_freq_base(10000.0)
        writer.add_sliding_window(sliding_window)
        writer.add_sliding_window_pattern(2)  # layer il is SWA when il % 2 < 1: layer 0 SWA, layer 1 full

    return _write_gguf(path, "gemma3", add_hparams, vocab, True, tensors)


def write_no_tokenizer_model(path: Path, *, seed: int = 0) -> Path:
    """A llama model whose GGUF says `tokenizer.ggml.model = "none"` and has no token list (an embedding-only or
    converted-by-hand file): llama.cpp loads it, and aborts the process on the first `llama_tokenize`."""
    vocab, shape = make_vocab(), LlamaShape()
    none = Vocab(model="none", tokens=(), scores=(), types=())
    tensors = make_llama_tensors(seed, vocab=vocab, shape=shape)
    return _write_gguf(path, "llama", _llama_hparams(shape, 2048, vocab.n_vocab), none, False, tensors)


def write_not_gguf(path: Path) -> Path:
    """Write a text file with a .gguf-looking name that is not GGUF at all. Returns `path`."""
    path = Path(path)
    path.write_text("This is not a GGUF file, just some text with a misleading name.\n")
    return path


def write_truncated(src: Path, dst: Path) -> Path:
    """Copy the first half of the valid GGUF file `src` to `dst` (header intact, tensor data cut). Returns `dst`."""
    data = Path(src).read_bytes()
    dst = Path(dst)
    dst.write_bytes(data[: len(data) // 2])
    return dst


# --- the standard set ---------------------------------------------------------------------------------------

TARGET_SEED = 0
DRAFT_NOISE = 0.025  # measured: 75% greedy agreement; 77/65/52% of drafts accepted at k = 1/2/4
VARIANT_RENAMED_ID = 300
VARIANT_FEWER = 100


def write_tiny_models(directory: Path) -> TinyModels:
    """Write the standard set of tiny models into `directory` (takes well under a second).

    The target is `write_llama_model(seed=TARGET_SEED)`. Drafts and most variants copy its tensors, so they
    differ from it only where their name says: `draft_same` (identical), `draft_noisy` (+`DRAFT_NOISE`
    relative noise: partial greedy agreement), `draft_unrelated` (another seed: near-zero agreement),
    `no_template`, `vocab_bpe` (gpt2/BPE type), `vocab_other_specials` (BOS/EOS ids swapped),
    `vocab_far_size` (+200 tokens), `vocab_near_size` (+64 tokens, within llama.cpp's tolerance of 128),
    `vocab_renamed` (token `VARIANT_RENAMED_ID` renamed), `vocab_prefix` (its last `VARIANT_FEWER` tokens cut),
    `vocab_shuffled` (the same pieces under other ids, with noise). Plus `recurrent` (mamba), `swa` (gemma3 with
    sliding window 8), `not_gguf` and `truncated`.

    Args:
        directory: Existing directory to write into.

    Returns:
        The paths.
    """
    d = Path(directory)
    vocab = make_vocab()
    target_tensors = make_llama_tensors(TARGET_SEED, vocab=vocab)
    target = write_llama_model(d / "target.gguf", base=target_tensors)
    bpe = make_bpe_vocab()
    shuffled_vocab, shuffled_tensors = shuffled(vocab, target_tensors, seed=6)
    return TinyModels(
        target=target,
        draft_same=write_llama_model(d / "draft_same.gguf", base=target_tensors),
        draft_noisy=write_llama_model(d / "draft_noisy.gguf", base=target_tensors, noise=DRAFT_NOISE, seed=1),
        draft_unrelated=write_llama_model(d / "draft_unrelated.gguf", seed=2),
        no_template=write_llama_model(d / "no_template.gguf", base=target_tensors, chat_template=False),
        vocab_bpe=write_llama_model(d / "vocab_bpe.gguf", seed=3, vocab=bpe),
        vocab_other_specials=write_llama_model(
            d / "vocab_other_specials.gguf",
            base=target_tensors,
            vocab=with_special_ids(vocab, bos_id=EOS_ID, eos_id=BOS_ID),
        ),
        vocab_far_size=write_llama_model(
            d / "vocab_far_size.gguf", base=target_tensors, vocab=with_extra_tokens(vocab, 200)
        ),
        vocab_near_size=write_llama_model(
            d / "vocab_near_size.gguf", base=target_tensors, vocab=with_extra_tokens(vocab, 64)
        ),
        vocab_renamed=write_llama_model(
            d / "vocab_renamed.gguf",
            base=target_tensors,
            vocab=with_renamed_token(vocab, VARIANT_RENAMED_ID, f"{SPIECE_SPACE}renamed"),
        ),
        vocab_prefix=write_llama_model(
            d / "vocab_prefix.gguf", base=target_tensors, vocab=with_fewer_tokens(vocab, VARIANT_FEWER)
        ),
        vocab_shuffled=write_llama_model(
            d / "vocab_shuffled.gguf", base=shuffled_tensors, vocab=shuffled_vocab, noise=DRAFT_NOISE, seed=6
        ),
        recurrent=write_mamba_model(d / "recurrent.gguf", seed=4, vocab=vocab),
        swa=write_swa_model(d / "swa.gguf", seed=5, vocab=vocab, sliding_window=8),
        not_gguf=write_not_gguf(d / "not_gguf.gguf"),
        truncated=write_truncated(target, d / "truncated.gguf"),
        no_tokenizer=write_no_tokenizer_model(d / "no_tokenizer.gguf"),
    )


# --- the thinking model: an "echo" model whose greedy output is fixed -----------------------------------------

THINK_START, THINK_END = "<think>", "</think>"
# The split-marker variant writes its markers in two tokens each (text markers, found in the chat template).
SPLIT_MARKER_PIECES = ("<thin", "k>", "</th", "ink>")
THINKING_WORDS = ("▁We", "▁must", "▁give", "▁them", "▁a", "▁kind", "▁word", "▁first", ".")
ANSWER_WORDS = ("▁Hello", "▁world", "!")
REASONING_TEXT = "We must give them a kind word first."
ANSWER_TEXT = "Hello world!"


def make_thinking_vocab(*, marker_tokens: bool = True) -> Vocab:
    """The shared vocabulary plus what a reasoning model adds: the markers and a "\\n\\n" piece.

    With `marker_tokens` the markers are one USER_DEFINED token each (as in Qwen3's vocabulary); without, they are
    ordinary pieces that a marker is written with in two tokens (`SPLIT_MARKER_PIECES`).
    """
    base = make_vocab()
    if marker_tokens:
        extra = (THINK_START, THINK_END)
        extra_types = (int(gguf.TokenType.USER_DEFINED),) * 2
    else:
        extra, extra_types = SPLIT_MARKER_PIECES, (int(gguf.TokenType.NORMAL),) * len(SPLIT_MARKER_PIECES)
    extra += ("\n\n",)
    extra_types += (int(gguf.TokenType.NORMAL),)
    low = base.scores[-1] - 1.0
    return dataclasses.replace(
        base,
        tokens=base.tokens + extra,
        scores=base.scores + tuple(low - i for i in range(len(extra))),
        types=base.types + extra_types,
    )


def thinking_chain(vocab: Vocab, *, marker_tokens: bool = True) -> list[str]:
    """The pieces the thinking model writes after a prompt that leaves thinking open: the thinking span, then
    the answer, then `<|im_end|>`. After a prompt that closed thinking ("…</think>\\n\\n") it writes only the
    answer: the chain from "\\n\\n" on."""
    start = [THINK_START] if marker_tokens else list(SPLIT_MARKER_PIECES[:2])
    end = [THINK_END] if marker_tokens else list(SPLIT_MARKER_PIECES[2:])
    return [*start, *THINKING_WORDS, *end, "\n\n", *ANSWER_WORDS, "<|im_end|>"]


def write_echo_model(
    path: Path,
    successors: Mapping[str, str],
    *,
    vocab: Vocab,
    chat_template: bool | str = True,
    seed: int = 0,
    alpha: float = 8.0,
    shape: LlamaShape = LlamaShape(),
) -> Path:
    """Write a llama model whose greedy next token depends only on the current token: `successors[piece]`.

    Every layer runs but adds nothing to the residual stream (attn_output and ffn_down are zero), so the last
    hidden state is the current token's embedding u_t (a random unit vector times sqrt(n_embd)); the output row
    of `successors[t]` is alpha·u_t, so its logit is alpha·n_embd^½ (64 here) against ~N(0, 8) for the other
    rows that have a source, and 0 for the rest. The greedy continuation is fixed whatever came before.

    Args:
        path: Destination file.
        successors: piece → the piece that follows it (each target piece has one source).
        vocab: the vocabulary (the pieces are looked up by text).
        chat_template: True for ChatML, False for none, or a Jinja template string.
        seed: Seed for the embeddings and the unused weights.
        alpha: Logit scale of the chosen successor.
        shape: Layer sizes.

    Returns:
        `path`.
    """
    ids = {piece: i for i, piece in enumerate(vocab.tokens)}
    sources = [ids[s] for s in successors]
    targets = [ids[t] for t in successors.values()]
    if len(set(targets)) != len(targets):
        raise ValueError("two pieces share a successor: an echo model gives each output row one source")
    tensors = make_llama_tensors(seed, vocab=vocab, shape=shape)
    d = shape.n_embd
    rng = np.random.default_rng(seed + 7)
    units = rng.standard_normal((vocab.n_vocab, d))
    units /= np.linalg.norm(units, axis=1, keepdims=True)  # (n_vocab, n_embd), unit rows
    output = np.zeros((vocab.n_vocab, d))
    output[targets] = alpha * units[sources]
    tensors["token_embd.weight"] = (units * np.sqrt(d)).astype(np.float32)
    tensors["output.weight"] = output.astype(np.float32)
    for il in range(shape.n_layer):
        tensors[f"blk.{il}.attn_output.weight"][:] = 0.0
        tensors[f"blk.{il}.ffn_down.weight"][:] = 0.0
    return write_llama_model(path, base=tensors, vocab=vocab, chat_template=chat_template, shape=shape)


TEMPLATES = Path(__file__).parent / "templates"


def qwen3_template() -> str:
    """Qwen3's real chat template (llama.cpp's models/templates copy: see the file's first lines)."""
    return (TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8")


def deepseek_r1_template() -> str:
    """The DeepSeek-R1 distill template as llama.cpp tests it: its generation prompt opens <think> itself."""
    return (TEMPLATES / "deepseek_r1_distill.jinja").read_text(encoding="utf-8")


@dataclass(frozen=True)
class ThinkingModels:
    """Echo models that think before they answer, with Qwen3's real template (see `write_thinking_models`)."""

    target: Path  # `<think>` and `</think>` are tokens; thinks unless the prompt closed thinking
    draft: Path  # the target's chain in the thinking span, another word after "▁Hello" in the answer
    split_markers: Path  # the markers are two tokens each ("</th" + "ink>"): found in the template's text
    opened: Path  # DeepSeek-R1's template, whose generation prompt writes "<think>\n": the model goes on thinking
    no_switch: Path  # the target with ChatML: it thinks (markers in the vocabulary), its template cannot switch


def write_thinking_models(directory: Path) -> ThinkingModels:
    """Write the thinking models into `directory`.

    After "assistant\\n" (Qwen3's generation prompt with thinking on) the target writes
    "<think> We must give them a kind word first.</think>\\n\\n Hello world!<|im_end|>"; after "</think>\\n\\n"
    (the prompt with `enable_thinking` false) only " Hello world!<|im_end|>". The draft agrees on every token but
    proposes "▁there" after "▁Hello": all its thinking drafts are accepted, one answer draft is not.
    """
    d = Path(directory)
    vocab = make_thinking_vocab()
    chain = thinking_chain(vocab)
    successors = {"<0x0A>": chain[0], **dict(zip(chain, chain[1:]))}
    draft = {**successors, "▁Hello": "▁there", "▁there": "!"}
    del draft["▁world"]  # "!" has one source in the draft: "▁there"
    split_vocab = make_thinking_vocab(marker_tokens=False)
    split_chain = thinking_chain(split_vocab, marker_tokens=False)
    opened = {**{k: v for k, v in successors.items() if k != THINK_START}, "<0x0A>": chain[1]}
    return ThinkingModels(
        target=write_echo_model(d / "thinking.gguf", successors, vocab=vocab, chat_template=qwen3_template()),
        draft=write_echo_model(d / "thinking_draft.gguf", draft, vocab=vocab, chat_template=qwen3_template()),
        split_markers=write_echo_model(
            d / "thinking_split.gguf",
            {"<0x0A>": split_chain[0], **dict(zip(split_chain, split_chain[1:]))},
            vocab=split_vocab,
            chat_template=qwen3_template(),
        ),
        opened=write_echo_model(d / "thinking_opened.gguf", opened, vocab=vocab, chat_template=deepseek_r1_template()),
        no_switch=write_echo_model(d / "thinking_chatml.gguf", successors, vocab=vocab, chat_template=True),
    )


# --- a qwen35 (hybrid: gated delta net + full attention) model with one MTP ("nextn") block ---------------------


@dataclass(frozen=True)
class Qwen35Shape:
    """Hyperparameters of a tiny qwen35 model: `n_layer` trunk layers (every `full_attention_interval`-th is full
    attention, the others gated delta net) and `n_nextn` MTP blocks after them (llama.cpp runs one)."""

    n_embd: int = 64
    n_layer: int = 2
    n_nextn: int = 1
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    full_attention_interval: int = 2
    ssm_d_state: int = 16  # head_k_dim = head_v_dim
    ssm_n_group: int = 2  # key heads
    ssm_dt_rank: int = 2  # value heads


def write_mtp_model(
    path: Path,
    *,
    seed: int = 0,
    vocab: Vocab | None = None,
    shape: Qwen35Shape = Qwen35Shape(),
    trunk_mix: float = 0.3,
    head_mix: float = 0.3,
    head_noise: float = 0.0,
    output_scale: float = 1.0,
    chat_template: bool | str = True,
) -> Path:
    """Write a tiny qwen35 GGUF model that carries `shape.n_nextn` MTP block(s) (F32, ~1 MB).

    The trunk is "mostly echo": each layer's contribution to the residual stream is scaled by `trunk_mix`, so the
    next token depends mostly on the current one (f(x) = argmax output·norm(embd(x))) and partly on the context.
    The MTP block reads (token x_{t+1}, the trunk's hidden row at t) and predicts x_{t+2}; its `eh_proj` keeps the
    token half plus `head_mix` of a random map of the hidden half, its attention adds `head_mix` of its output and
    its FFN nothing (plus `head_noise`), so it predicts mostly f(x_{t+1}) — what the trunk would say at x_{t+1}
    without context — while the hidden row and the head's own cache still matter (a stale one shows). The head
    therefore agrees with the trunk often, not always.
    Tensor names, shapes and hparams keys follow llama.cpp's qwen35 loader (src/models/qwen35.cpp).

    Args:
        path: Destination file.
        seed: Seed for the weights.
        vocab: Vocabulary (default `make_vocab()`).
        shape: Layer sizes.
        trunk_mix: Scale of the trunk layers' residual contributions (0: a pure echo model).
        head_mix: Weight of the hidden row and of the head's attention in its output (0: neither matters).
        head_noise: Relative noise on the head's weights (0: the head is the context-free trunk).
        output_scale: Multiplier of the output matrix (smaller: flatter laws at T > 0).
        chat_template: True for ChatML, False for none, or a Jinja template string.

    Returns:
        `path`.
    """
    vocab = vocab or make_vocab()
    rng = np.random.default_rng(seed)
    d, hd = shape.n_embd, shape.head_dim
    n_q, n_kv = shape.n_head * hd, shape.n_head_kv * hd
    key_dim, value_dim = shape.ssm_d_state * shape.ssm_n_group, shape.ssm_d_state * shape.ssm_dt_rank

    def normal(*dims: int, std: float) -> np.ndarray:
        return (rng.standard_normal(dims) * std).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def ffn(blk: str, out_scale: float) -> dict[str, np.ndarray]:
        return {
            f"{blk}.ffn_gate.weight": normal(shape.n_ff, d, std=1.0 / np.sqrt(d)),  # (n_ff, n_embd)
            f"{blk}.ffn_up.weight": normal(shape.n_ff, d, std=1.0 / np.sqrt(d)),
            f"{blk}.ffn_down.weight": normal(d, shape.n_ff, std=out_scale / np.sqrt(shape.n_ff)),  # (n_embd, n_ff)
        }

    def attention(blk: str, out_scale: float) -> dict[str, np.ndarray]:
        return {
            f"{blk}.attn_q.weight": normal(2 * n_q, d, std=2.0 / np.sqrt(d)),  # (query + gate, n_embd)
            f"{blk}.attn_k.weight": normal(n_kv, d, std=2.0 / np.sqrt(d)),
            f"{blk}.attn_v.weight": normal(n_kv, d, std=1.0 / np.sqrt(d)),
            f"{blk}.attn_output.weight": normal(d, n_q, std=out_scale / np.sqrt(n_q)),
            f"{blk}.attn_q_norm.weight": ones(hd),
            f"{blk}.attn_k_norm.weight": ones(hd),
        }

    def delta_net(blk: str, out_scale: float) -> dict[str, np.ndarray]:
        conv_dim = 2 * key_dim + value_dim
        return {
            f"{blk}.attn_qkv.weight": normal(conv_dim, d, std=1.0 / np.sqrt(d)),
            f"{blk}.attn_gate.weight": normal(value_dim, d, std=1.0 / np.sqrt(d)),
            f"{blk}.ssm_conv1d.weight": normal(conv_dim, 4, std=0.5),  # ggml {d_conv, conv_dim}
            f"{blk}.ssm_dt.bias": np.zeros(shape.ssm_dt_rank, dtype=np.float32),
            f"{blk}.ssm_a": -np.ones(shape.ssm_dt_rank, dtype=np.float32),  # -exp(A_log)
            f"{blk}.ssm_beta.weight": normal(shape.ssm_dt_rank, d, std=1.0 / np.sqrt(d)),
            f"{blk}.ssm_alpha.weight": normal(shape.ssm_dt_rank, d, std=1.0 / np.sqrt(d)),
            f"{blk}.ssm_norm.weight": ones(shape.ssm_d_state),
            f"{blk}.ssm_out.weight": normal(d, value_dim, std=out_scale / np.sqrt(value_dim)),
        }

    scales = _output_row_scales(vocab, control_scale=0.0, byte_scale=0.3) * output_scale
    tensors = {
        "token_embd.weight": normal(vocab.n_vocab, d, std=1.0),  # (n_vocab, n_embd)
        "output_norm.weight": ones(d),
        "output.weight": normal(vocab.n_vocab, d, std=1.0) * scales[:, None],
    }
    for il in range(shape.n_layer):
        blk = f"blk.{il}"
        recurrent = (il + 1) % shape.full_attention_interval != 0
        mixer = delta_net(blk, trunk_mix) if recurrent else attention(blk, trunk_mix)
        norms = {f"{blk}.attn_norm.weight": ones(d), f"{blk}.post_attention_norm.weight": ones(d)}
        tensors |= norms | mixer | ffn(blk, trunk_mix)
    for il in range(shape.n_layer, shape.n_layer + shape.n_nextn):
        blk = f"blk.{il}"
        hidden_half = rng.standard_normal((d, d)) * head_mix / np.sqrt(d)
        eh_proj = np.concatenate([np.eye(d), hidden_half], axis=1)  # (n_embd, 2*n_embd): mostly the token half
        head = {
            f"{blk}.attn_norm.weight": ones(d),
            f"{blk}.post_attention_norm.weight": ones(d),
            f"{blk}.nextn.eh_proj.weight": eh_proj.astype(np.float32),
            f"{blk}.nextn.enorm.weight": ones(d),
            f"{blk}.nextn.hnorm.weight": ones(d),
        }
        head |= attention(blk, head_mix) | ffn(blk, 0.0)
        if head_noise:
            head = add_noise(head, head_noise, seed + il)
        tensors |= head

    def add_hparams(writer: gguf.GGUFWriter) -> None:
        arch = writer.arch
        writer.add_context_length(2048)
        writer.add_embedding_length(d)
        writer.add_block_count(shape.n_layer + shape.n_nextn)
        writer.add_feed_forward_length(shape.n_ff)
        writer.add_head_count(shape.n_head)
        writer.add_head_count_kv(shape.n_head_kv)
        writer.add_key_length(hd)
        writer.add_value_length(hd)
        writer.add_rope_dimension_count(hd)
        writer.add_uint32(f"{arch}.nextn_predict_layers", shape.n_nextn)
        writer.add_uint32(f"{arch}.full_attention_interval", shape.full_attention_interval)
        writer.add_array(f"{arch}.rope.dimension_sections", [3, 3, 2, 0])  # sums to head_dim / 2
        writer.add_layer_norm_rms_eps(1e-6)
        writer.add_rope_freq_base(10000.0)
        writer.add_ssm_conv_kernel(4)
        writer.add_ssm_inner_size(value_dim)
        writer.add_ssm_state_size(shape.ssm_d_state)
        writer.add_ssm_time_step_rank(shape.ssm_dt_rank)
        writer.add_ssm_group_count(shape.ssm_n_group)
        writer.add_vocab_size(vocab.n_vocab)

    return _write_gguf(path, "qwen35", add_hparams, vocab, chat_template, tensors)


# --- damaged headers ------------------------------------------------------------------------------------------


def rewrite_gguf(
    src: Path, dst: Path, changes: Mapping[str, object], drop: Callable[[str], bool] = lambda name: False
) -> Path:
    """Copy the GGUF file `src` to `dst` with some metadata changed: each key of `changes` maps to a
    `(value, GGUFValueType)`, a `(list, GGUFValueType.ARRAY, item type)`, or None (the key removed). The tensors are
    copied as they are, but those whose name `drop` is true for. Returns `dst`."""
    reader = gguf.GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in changes:
            continue
        vtype = gguf.GGUFValueType(field.types[0])
        sub = gguf.GGUFValueType(field.types[-1]) if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub)
    for name, change in changes.items():
        if change is not None:
            writer.add_key_value(name, *change)
    for tensor in (t for t in reader.tensors if not drop(t.name)):
        writer.add_tensor(
            tensor.name, tensor.data, raw_shape=list(reversed(tensor.shape)), raw_dtype=tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(dst)


def patch_gguf(src: Path, dst: Path, offset_of: Callable[[bytes], int], value: bytes) -> Path:
    """Copy `src` to `dst` with `value` written over the bytes at `offset_of(data)`: damage no writer makes (a
    count larger than the file, a length past its end). Returns `dst`."""
    data = bytearray(Path(src).read_bytes())
    at = offset_of(bytes(data))
    data[at : at + len(value)] = value
    Path(dst).write_bytes(bytes(data))
    return Path(dst)
