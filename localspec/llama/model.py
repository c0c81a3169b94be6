"""`Model`: a loaded GGUF file (weights and vocabulary), its facts (`ModelInfo`) and its tokenizer.

The model owns its native handle (freed by `close()` or a `with` block). A model placed on RPC workers makes
every native call that may reach those devices through its `Placement` (see `context.py` for the rule).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import llama_cpp

from localspec.errors import LocalspecError, ModelFileError

from . import devices
from .cpu import repack_from_env
from .devices import device_handles
from .footprint import EXPERTS_PATTERN, header_problem, read_header
from .log import init, llama_error

log = logging.getLogger(__name__)
LOADING = "loading the model %s"  # logged as each file starts to load
GGUF_MAGIC = b"GGUF"
VOCAB_TYPES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2", 7: "test"}


def check_gguf_file(path: Path) -> None:
    """Raise `ModelFileError` unless `path` is an existing file that starts with the GGUF magic."""
    if not path.exists():
        if _is_link_loop(path):
            raise ModelFileError(f"{path} is a symbolic link loop: point the link at a .gguf file")
        raise ModelFileError(f"model file not found: {path} (check the path, or run `localspec pull PAIR`)")
    if not path.is_file():
        raise ModelFileError(f"not a file: {path} (give the path of a .gguf file)")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"not a GGUF file: {path} (llama.cpp needs a .gguf model; convert or re-download it)")


def _is_link_loop(path: Path) -> bool:
    try:
        os.stat(path)
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Facts about a loaded model that the engine and the UI need."""

    path: Path
    arch: str
    description: str
    n_vocab: int
    n_ctx_train: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_swa: int
    n_params: int
    file_size: int
    is_recurrent: bool
    is_hybrid: bool
    vocab_type: str
    bos: int
    eos: int
    add_bos: bool


class Placement(Protocol):
    """Where a model's layers go when they are not (only) local: `rpc.Remote`.

    Every native call that may reach the devices goes through `call`, which raises a `LocalspecError` when the
    devices are gone; once `lost`, the model and its contexts are abandoned, never freed.
    """

    devices: list[int]

    @property
    def lost(self) -> bool: ...

    def call(self, fn: Callable[..., Any], *args: Any) -> Any: ...


class _BuftOverride(ctypes.Structure):
    """llama.cpp's `llama_model_tensor_buft_override`: tensors whose name matches `pattern` go to `buft`."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def experts_on_cpu(n_layers: int) -> ctypes.Array:
    """The NULL-terminated override list that keeps the experts of layers 0..n_layers-1 in CPU memory.

    A pattern per layer, as llama.cpp's `--n-cpu-moe N` writes them (past llama.cpp's limit on overrides, one
    pattern for every layer, as `--cpu-moe`). On a build without a GPU everything is in CPU memory anyway: a no-op.
    """
    native = devices.native()
    native.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    cpu = native.ggml_backend_cpu_buffer_type()
    many = n_layers >= llama_cpp.llama_max_tensor_buft_overrides()
    patterns = [EXPERTS_PATTERN] if many else [rf"blk\.{i}{EXPERTS_PATTERN}" for i in range(n_layers)]
    overrides = (_BuftOverride * (len(patterns) + 1))()
    for override, pattern in zip(overrides, patterns, strict=False):
        override.pattern, override.buft = pattern.encode(), cpu
    return overrides


def _direct(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class Model:
    """A loaded GGUF model (weights and vocabulary). Use as a context manager or call `close()`."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        n_gpu_layers: int | None = None,
        cpu_moe_layers: int = 0,
        vocab_only: bool = False,
        placement: Placement | None = None,
        progress: Callable[[float], bool | None] | None = None,
        load_mtp: bool = False,
    ) -> None:
        """Load `path`.

        Args:
            path: a .gguf file.
            n_gpu_layers: layers to offload; None = all when the build can offload (or the model is placed on
                remote devices), else 0.
            cpu_moe_layers: keep the MoE experts of the first this many layers in CPU memory (llama.cpp's
                `--n-cpu-moe`; the model's layer count or more: every layer's, as `--cpu-moe`).
            vocab_only: load the tokenizer and metadata only (compatibility checks; no context possible).
            placement: remote devices (RPC workers) for the layers, followed by this machine's GPUs if any.
            progress: called with the fraction loaded (0..1) while the weights load; returning False stops the load.
            load_mtp: also load the model's MTP ("nextn") draft head, where it has one and this llama-cpp-python
                can run it (`mtp.mtp_calls`); `n_layer_nextn` says what the file carries either way.

        Raises:
            ModelFileError: missing file, not GGUF, truncated or otherwise unloadable.
            LocalspecError: the placement's devices were lost while loading, or `progress` stopped the load.
        """
        init().recent_errors.clear()  # what llama.cpp logs from here on explains a failed load
        self.path = Path(path)
        self.placement = placement
        self._call = placement.call if placement is not None else _direct
        check_gguf_file(self.path)
        # llama.cpp aborts the process on some damaged headers (GGML_ASSERT): they are refused here, in one line
        if problem := header_problem(read_header(self.path)):
            raise ModelFileError(f"could not load {self.path}: the file {problem}")
        params = llama_cpp.llama_model_default_params()
        if n_gpu_layers is None:
            n_gpu_layers = -1 if placement is not None or llama_cpp.llama_supports_gpu_offload() else 0
        params.n_gpu_layers = n_gpu_layers
        # Layers on a GPU of this machine (not only on RPC workers): where sampling in the graph pays.
        self.on_local_gpu = n_gpu_layers != 0 and any(d.kind in ("gpu", "igpu") for _, d in device_handles())
        params.vocab_only = vocab_only
        self.mtp_loaded = load_mtp and hasattr(params, "load_mtp")
        if self.mtp_loaded:
            params.load_mtp = True
        params.use_extra_bufts = repack_from_env()
        if cpu_moe_layers > 0:
            self._overrides = experts_on_cpu(cpu_moe_layers)  # kept alive as long as the model
            params.tensor_buft_overrides = ctypes.cast(self._overrides, ctypes.c_void_p)
        if placement is not None:
            local_gpus = [h for h, d in device_handles() if d.kind in ("gpu", "igpu")]
            devices = (ctypes.c_void_p * (len(placement.devices) + len(local_gpus) + 1))(
                *placement.devices, *local_gpus, None
            )
            params.devices = ctypes.cast(devices, ctypes.c_void_p)
        stopped = False
        if progress is not None:

            def on_progress(fraction: float, _user_data: ctypes.c_void_p) -> bool:
                nonlocal stopped
                stopped = progress(float(fraction)) is False  # False: stop loading (a server that stops)
                return not stopped

            callback = llama_cpp.llama_progress_callback(on_progress)
            params.progress_callback = callback
        log.info(LOADING, self.path)  # a crash note names the file (cli/crashes.py listens)
        handle = self._call(llama_cpp.llama_model_load_from_file, os.fsencode(self.path), params)
        if not handle and stopped:
            raise LocalspecError(f"the load of {self.path.name} was stopped")
        if not handle:
            raise ModelFileError(
                f"could not load {self.path}: the file is truncated or corrupt, or its architecture is not "
                f"supported by this llama.cpp build{llama_error()} — re-download it"
            )
        self._handle = handle
        self._vocab = llama_cpp.llama_model_get_vocab(handle)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.info = self._read_info(vocab_only)
        nextn = getattr(llama_cpp, "llama_model_n_layer_nextn", None)  # absent from older llama-cpp-pythons
        self.n_layer_nextn = 0 if vocab_only or nextn is None else int(nextn(handle))  # MTP blocks in the file
        self._piece_cache: dict[int, bytes] = {}

    def _read_info(self, vocab_only: bool) -> ModelInfo:
        h, v = self._handle, self._vocab
        desc = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(h, desc, len(desc))
        names = ("n_ctx_train", "n_layer", "n_embd", "n_head", "n_head_kv", "n_swa", "n_params")
        # A vocab-only load has no hyperparameters, and llama.cpp aborts on some of these queries then.
        hparams = {n: 0 if vocab_only else int(getattr(llama_cpp, f"llama_model_{n}")(h)) for n in names}
        return ModelInfo(
            path=self.path,
            arch=self.meta("general.architecture") or "unknown",
            description=desc.value.decode("utf-8", errors="replace"),
            n_vocab=self.n_vocab,
            **hparams,
            file_size=self.path.stat().st_size,
            is_recurrent=not vocab_only and bool(llama_cpp.llama_model_is_recurrent(h)),
            is_hybrid=not vocab_only and bool(llama_cpp.llama_model_is_hybrid(h)),
            vocab_type=VOCAB_TYPES.get(int(llama_cpp.llama_vocab_type(v)), "unknown"),
            bos=int(llama_cpp.llama_vocab_bos(v)),
            eos=int(llama_cpp.llama_vocab_eos(v)),
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(v)),
        )

    @property
    def handle(self):
        if self._handle is None:
            raise RuntimeError("model is closed")
        return self._handle

    def close(self) -> None:
        """Free the weights now (idempotent). A model whose remote devices were lost is abandoned instead."""
        if getattr(self, "_handle", None) is not None:
            if self.placement is None or not self.placement.lost:
                self._call(llama_cpp.llama_model_free, self._handle)
            self._handle = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as a string, or None when absent."""
        buf = ctypes.create_string_buffer(1024)
        n = llama_cpp.llama_model_meta_val_str(self.handle, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self.handle, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        """The GGUF's own `tokenizer.chat_template`, or None."""
        raw = llama_cpp.llama_model_chat_template(self.handle, None)
        return raw.decode("utf-8") if raw else None

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """Text to token ids.

        Args:
            text: any text.
            add_special: add BOS (and EOS) as the model is configured to.
            parse_special: turn markup such as `<|im_end|>` into control tokens. Keep False for user text.
        """
        if self.info.vocab_type == "none":  # llama.cpp would abort the process (GGML_ASSERT on the tokenizer)
            raise ModelFileError(f"{self.path.name} has no tokenizer to write text with: choose a GGUF that has one")
        data = text.encode("utf-8", errors="replace")  # lone surrogates become "?" (callers clean text first)
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            raise ModelFileError(f"tokenizer of {self.path.name} failed on a {len(data)}-byte text")
        return list(buf[:n])

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token renders to in generated text (control tokens render as nothing)."""
        piece = self._piece_cache.get(token)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            piece = buf.raw[:n]
            self._piece_cache[token] = piece
        return piece

    def detokenize(self, tokens: list[int]) -> str:
        """Token ids to text (replacement character for invalid UTF-8)."""
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        """The raw vocabulary entry of a token (as stored in the GGUF), for compatibility checks."""
        raw = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def control_tokens(self) -> dict[str, int]:
        """Text → id of every control token (`<|im_start|>`, `<bos>`, …): what template markup may emit."""
        if not hasattr(self, "_control"):
            attr = llama_cpp.llama_vocab_get_attr
            self._control = {
                text: t
                for t in range(self.n_vocab)
                if attr(self._vocab, t) & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL and (text := self.token_text(t))
            }
        return self._control

    def longest_token_bytes(self) -> int:
        """An upper bound on the bytes of text one token stands for (its stored text, whose space and byte markers
        are never shorter than what they stand for); computed once. A text of n bytes is at least n / this tokens."""
        if not hasattr(self, "_longest"):
            self._longest = max(1, *(len(self.token_text(t).encode()) for t in range(self.n_vocab)))
        return self._longest

    def is_padding(self, token: int) -> bool:
        """True for ids that are no real token (unused, or control with no text): a vocabulary's padding."""
        attr = llama_cpp.llama_vocab_get_attr(self._vocab, token)
        if attr & llama_cpp.LLAMA_TOKEN_ATTR_UNUSED:
            return True
        return bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL) and not self.token_text(token)

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, `<|im_end|>`, …)."""
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def eog_tokens(self) -> frozenset[int]:
        """Every end-of-generation token of the vocabulary (computed once)."""
        if not hasattr(self, "_eog"):
            self._eog = frozenset(t for t in range(self.n_vocab) if self.is_eog(t))
        return self._eog

    def token_piece_text(self, token: int, *, special: bool = True) -> str:
        """A token as text, rendering control tokens when `special` (for templates' bos/eos strings)."""
        if token < 0:
            return ""
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[: max(n, 0)].decode("utf-8", errors="replace")
