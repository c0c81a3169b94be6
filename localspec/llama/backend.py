"""The one module that talks to llama.cpp (through llama-cpp-python's low-level ctypes API).

It owns native lifetimes (model, context, batch: freed deterministically by `close()` or a `with`
block), turns return codes into `LocalspecError`s, routes llama.cpp's log lines to `logging`, and hands
out logits rows as numpy views. It keeps no token history: that belongs to `kv.KVSequence`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import llama_cpp
import numpy as np
from llama_cpp import llama_chat_format

from localspec.errors import ChatTemplateError, ContextError, ModelFileError

log = logging.getLogger("localspec.backend")
llama_log = logging.getLogger("localspec.llama")

GGUF_MAGIC = b"GGUF"
VOCAB_TYPES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2", 7: "test"}
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}  # ggml_log_level; 5 = CONT


class _LlamaLog:
    """Forwards llama.cpp's log lines to `logging` and keeps the last errors for our messages."""

    def __init__(self) -> None:
        self.recent_errors: deque[str] = deque(maxlen=4)
        self._pending = ""
        self._level = logging.DEBUG
        # Keep the ctypes callback alive as long as llama.cpp may call it.
        self.callback = llama_cpp.llama_log_callback(self._on_log)

    def _on_log(self, level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        if level in _LEVELS:
            self._level = _LEVELS[level]  # CONT lines continue the previous level
        self._pending += text.decode("utf-8", errors="replace")
        if not self._pending.endswith("\n"):
            return  # llama.cpp prints progress dots without newlines
        line, self._pending = self._pending.rstrip(), ""
        py_level = self._level
        if py_level >= logging.ERROR and line:
            self.recent_errors.append(line)
        llama_log.log(py_level, "%s", line)

    def last_error(self) -> str:
        return self.recent_errors[-1] if self.recent_errors else ""


_state: dict[str, _LlamaLog] = {}


def init() -> None:
    """Initialise llama.cpp once per process and route its logs; called by every loader."""
    if "log" not in _state:
        _state["log"] = _LlamaLog()
        llama_cpp.llama_log_set(_state["log"].callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()


def _llama_error() -> str:
    """The last error llama.cpp logged, as a suffix for our own message."""
    logger = _state.get("log")
    detail = logger.last_error() if logger else ""
    if logger:
        logger.recent_errors.clear()
    return f" (llama.cpp: {detail})" if detail else ""


def physical_cores() -> int:
    """Physical core count (llama.cpp runs best with one thread per physical core)."""
    try:
        siblings = {
            Path(p, "topology/thread_siblings_list").read_text().strip()
            for p in Path("/sys/devices/system/cpu").glob("cpu[0-9]*")
            if Path(p, "topology/thread_siblings_list").exists()
        }
        if siblings:
            return len(siblings)
    except OSError:
        pass
    return os.cpu_count() or 1


def default_threads() -> tuple[int, str]:
    """Threads per context when none is asked for, and why (for `localspec doctor`)."""
    cores = physical_cores()
    if not CoreMonitor.available():
        return cores, f"one per physical core ({cores})"
    free = CoreMonitor().free_cores(wait=0.3)
    now = max(1, min(cores, int(free + 0.3)))
    return now, (
        f"one per core that other processes leave free, re-checked while generating (now {now} of "
        f"{cores}: others use {cores - free:.1f} cores); a spinning llama.cpp thread that shares its core "
        "with another process stalls every step"
    )


class CoreMonitor:
    """How many cores other processes leave free: the machine's busy time (/proc/stat) minus this process's.

    llama.cpp's CPU threads wait for each other at every operation by spinning; one thread that shares its
    core with another process makes all of them wait for the scheduler (measured on 2 cores: 0.33× plain
    speed with one busy-loop process; one thread instead keeps ~1×). So the thread count follows the cores
    actually free. Linux only; elsewhere `available()` is False and the count stays one per physical core.
    """

    def __init__(self) -> None:
        self._last = self._sample()

    @staticmethod
    def available() -> bool:
        return Path("/proc/stat").is_file()

    @staticmethod
    def _sample() -> tuple[float, float, float]:
        """(wall seconds, busy core-seconds of the whole machine, this process's CPU seconds)."""
        with open("/proc/stat", encoding="ascii") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        ticks = os.sysconf("SC_CLK_TCK")
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
        return time.monotonic(), (sum(fields[:8]) - idle) / ticks, time.process_time()

    def free_cores(self, *, wait: float = 0.0) -> float:
        """Cores left free by other processes since the previous call (after sleeping `wait` seconds)."""
        if wait:
            time.sleep(wait)
        now = self._sample()
        wall = now[0] - self._last[0]
        others = max(0.0, (now[1] - self._last[1]) - (now[2] - self._last[2]))
        self._last = now
        cores = physical_cores()
        return cores - min(cores, others / wall) if wall > 0 else float(cores)


class ThreadTuner:
    """Keeps the contexts' thread count at the cores other processes leave free (see `CoreMonitor`).

    `check()` is cheap; it re-measures at most every `interval` seconds and changes the contexts' threads
    (`llama_set_n_threads`) when the free cores changed by a whole core.
    """

    def __init__(self, contexts: list[Context], *, interval: float = 0.5) -> None:
        self.contexts = contexts
        self.interval = interval
        self.cores = physical_cores()
        self.threads = contexts[0].n_threads if contexts else self.cores
        self._monitor = CoreMonitor() if CoreMonitor.available() else None
        self._next = time.monotonic() + interval

    def check(self) -> int:
        """Re-measure when due; returns the thread count in use."""
        if self._monitor is None or time.monotonic() < self._next:
            return self.threads
        self._next = time.monotonic() + self.interval
        free = self._monitor.free_cores()
        wanted = max(1, min(self.cores, int(free + 0.3)))  # a core 70% free is worth a thread
        if wanted != self.threads:
            log.info("threads %d -> %d (%.1f cores free)", self.threads, wanted, free)
            self.threads = wanted
            for ctx in self.contexts:
                ctx.set_threads(wanted)
        return self.threads


def system_info() -> str:
    """llama.cpp's one-line description of the build (SIMD features, backends)."""
    init()
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()


def check_gguf_file(path: Path) -> None:
    """Raise `ModelFileError` unless `path` is an existing file that starts with the GGUF magic."""
    if not path.exists():
        raise ModelFileError(f"model file not found: {path} (check the path, or run `localspec pull PAIR`)")
    if not path.is_file():
        raise ModelFileError(f"not a file: {path} (give the path of a .gguf file)")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"not a GGUF file: {path} (llama.cpp needs a .gguf model; convert or re-download it)")


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


def _direct(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class Model:
    """A loaded GGUF model (weights and vocabulary). Use as a context manager or call `close()`."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        n_gpu_layers: int | None = None,
        vocab_only: bool = False,
        placement: Placement | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        """Load `path`.

        Args:
            path: a .gguf file.
            n_gpu_layers: layers to offload; None = all when the build can offload (or the model is placed on
                remote devices), else 0.
            vocab_only: load the tokenizer and metadata only (compatibility checks; no context possible).
            placement: remote devices (RPC workers) for the layers, followed by this machine's GPUs if any.
            progress: called with the fraction loaded (0..1) while the weights load.

        Raises:
            ModelFileError: missing file, not GGUF, truncated or otherwise unloadable.
            LocalspecError: the placement's devices were lost while loading.
        """
        init()
        self.path = Path(path)
        self.placement = placement
        self._call = placement.call if placement is not None else _direct
        check_gguf_file(self.path)
        params = llama_cpp.llama_model_default_params()
        if n_gpu_layers is None:
            n_gpu_layers = -1 if placement is not None or llama_cpp.llama_supports_gpu_offload() else 0
        params.n_gpu_layers = n_gpu_layers
        params.vocab_only = vocab_only
        if placement is not None:
            local_gpus = [h for h, d in device_handles() if d.kind in ("gpu", "igpu")]
            devices = (ctypes.c_void_p * (len(placement.devices) + len(local_gpus) + 1))(
                *placement.devices, *local_gpus, None
            )
            params.devices = ctypes.cast(devices, ctypes.c_void_p)
        if progress is not None:

            def on_progress(fraction: float, _user_data: ctypes.c_void_p) -> bool:
                progress(float(fraction))
                return True  # go on loading

            callback = llama_cpp.llama_progress_callback(on_progress)
            params.progress_callback = callback
        handle = self._call(llama_cpp.llama_model_load_from_file, os.fsencode(self.path), params)
        if not handle:
            raise ModelFileError(
                f"could not load {self.path}: the file is truncated or corrupt, or its architecture is not "
                f"supported by this llama.cpp build{_llama_error()} — re-download it"
            )
        self._handle = handle
        self._vocab = llama_cpp.llama_model_get_vocab(handle)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.info = self._read_info(vocab_only)
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


def kv_bytes_estimate(info: ModelInfo, n_ctx: int) -> int:
    """Rough size of an F16 KV cache of `n_ctx` cells (for a friendly error before llama.cpp aborts)."""
    if info.is_recurrent or info.n_head == 0:
        return 0
    head_dim = info.n_embd // info.n_head
    return 2 * 2 * info.n_layer * n_ctx * info.n_head_kv * head_dim


def memory_bytes() -> int:
    """Memory the process may use: available RAM on Linux, physical RAM elsewhere."""
    for name in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            return os.sysconf(name) * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            continue
    return 1 << 62


class Context:
    """One llama.cpp context (its KV cache or recurrent state) on one sequence (seq 0).

    Positions are explicit: callers own the token history and pass `n_past`.
    """

    def __init__(
        self,
        model: Model,
        *,
        n_ctx: int,
        n_batch: int = 512,
        n_threads: int | None = None,
        swa_full: bool = False,
        n_rs_seq: int = 0,
    ) -> None:
        """Create a context.

        Args:
            model: the loaded model.
            n_ctx: context length in tokens (≤ the model's training context).
            n_batch: most tokens per `llama_decode` (longer inputs are split).
            n_threads: CPU threads; None = physical cores.
            swa_full: full-size cache for sliding-window layers, so long rollbacks stay valid.
            n_rs_seq: recurrent-state rollback snapshots per sequence (recurrent/hybrid models).

        Raises:
            ContextError: n_ctx out of range or too large for memory.
        """
        info = model.info
        if n_ctx < 16:
            raise ContextError(f"n_ctx {n_ctx} is too small: use --n-ctx 512 or more")
        if n_ctx > info.n_ctx_train:
            raise ContextError(
                f"n_ctx {n_ctx} exceeds what {model.path.name} was trained for ({info.n_ctx_train}): "
                f"use --n-ctx {info.n_ctx_train} or less"
            )
        need, have = kv_bytes_estimate(info, n_ctx), memory_bytes()
        if need > have and model.placement is None:  # a placed model's cache lives on its remote devices
            raise ContextError(
                f"n_ctx {n_ctx} needs about {need / 2**30:.1f} GiB of KV cache for {model.path.name} but only "
                f"{have / 2**30:.1f} GiB is available: use a smaller --n-ctx"
            )
        self.model = model
        self.n_vocab = model.n_vocab
        self.swa_full = swa_full
        self.n_batch = min(n_batch, n_ctx)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = self.n_batch
        params.n_ubatch = self.n_batch
        params.n_seq_max = 1
        threads = n_threads or physical_cores()
        params.n_threads = threads
        params.n_threads_batch = threads
        params.swa_full = swa_full
        params.n_rs_seq = n_rs_seq
        params.no_perf = True
        self._call = model._call  # a remote model's contexts make their native calls where it does
        handle = self._call(llama_cpp.llama_init_from_model, model.handle, params)
        if not handle:
            raise ContextError(
                f"could not create a context of {n_ctx} tokens for {model.path.name}{_llama_error()}: "
                "use a smaller --n-ctx"
            )
        self._handle = handle
        self.n_threads = threads
        self.seconds_decoding = 0.0  # time spent inside llama_decode (benchmarks: Python time is the rest)
        self.decodes = 0  # llama_decode calls (benchmarks: round trips per decode over RPC)
        self.n_ctx = int(llama_cpp.llama_n_ctx(handle))
        self._mem = llama_cpp.llama_get_memory(handle)
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        n = self.n_batch
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(n,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n,))
        self._out = np.ctypeslib.as_array(self._batch.logits, shape=(n,))
        for i in range(n):
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0

    @property
    def handle(self):
        if self._handle is None:
            raise RuntimeError("context is closed")
        return self._handle

    def close(self) -> None:
        """Free the context and its KV cache now (idempotent)."""
        if getattr(self, "_handle", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            if self.model.placement is None or not self.model.placement.lost:
                self._call(llama_cpp.llama_free, self._handle)
            self._handle = None

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def decode(self, tokens: list[int], n_past: int, *, outputs: int = 1) -> None:
        """Append `tokens` at positions n_past… and compute logits for the last `outputs` rows.

        Inputs longer than n_batch are split; the output rows must fit in the last chunk. Read the rows
        with `logits(i)`, i counted from the start of that last chunk, or negative from its end.

        Raises:
            ContextError: the context is full, or llama.cpp failed.
        """
        assert 0 <= outputs <= len(tokens) <= self.n_ctx
        if n_past + len(tokens) > self.n_ctx:
            raise ContextError(f"context full ({self.n_ctx} tokens): start a new chat or raise --n-ctx")
        start = 0
        while start < len(tokens):
            chunk = tokens[start : start + self.n_batch]
            n = len(chunk)
            first_out = len(tokens) - outputs - start  # rows of this chunk from which logits are wanted
            assert start + n == len(tokens) or first_out >= n, "output rows must fit in one batch"
            self._tok[:n] = chunk
            self._pos[:n] = np.arange(n_past + start, n_past + start + n)
            self._out[:n] = 0
            if first_out < n:
                self._out[max(first_out, 0) : n] = 1
            self._batch.n_tokens = n
            t0 = time.perf_counter()
            rc = self._call(llama_cpp.llama_decode, self.handle, self._batch)
            if rc == 0:
                # GPU and RPC backends return before the work is done; wait here so the time is the decode's
                # (stats, the policy's costs, bench) and not the first logits read's.
                self._call(llama_cpp.llama_synchronize, self.handle)
            self.seconds_decoding += time.perf_counter() - t0
            self.decodes += 1
            if rc != 0:
                if rc == 1:
                    raise ContextError(
                        f"no room in the KV cache ({self.n_ctx} tokens): start a new chat or raise --n-ctx"
                    )
                raise ContextError(f"llama_decode failed with code {rc}{_llama_error()}")
            start += n

    def logits(self, i: int) -> np.ndarray:
        """Row `i` of the last decode's logits as a float32 view of shape (n_vocab,).

        The view is valid until this context's next `decode`; copy it to keep it.
        """
        ptr = self._call(llama_cpp.llama_get_logits_ith, self.handle, i)
        if not ptr:
            raise ContextError(f"no logits for row {i}: it was not requested in the last decode")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def set_threads(self, n: int) -> None:
        """Use n CPU threads from the next decode on (the results do not depend on it)."""
        llama_cpp.llama_set_n_threads(self.handle, n, n)
        self.n_threads = n

    def logits_block(self, n: int) -> np.ndarray:
        """Rows 0..n-1 of the last decode's logits as one float32 view of shape (n, n_vocab).

        llama.cpp keeps the output rows of a one-sequence batch contiguous and in order; where it does not,
        the rows are copied into one array.
        """
        first = self._call(llama_cpp.llama_get_logits_ith, self.handle, 0)
        last = self._call(llama_cpp.llama_get_logits_ith, self.handle, n - 1)
        if not first or not last:
            raise ContextError(f"no logits for rows 0..{n - 1}: they were not requested in the last decode")
        start = ctypes.addressof(first.contents)
        if ctypes.addressof(last.contents) - start == (n - 1) * self.n_vocab * ctypes.sizeof(ctypes.c_float):
            return np.ctypeslib.as_array(first, shape=(n, self.n_vocab))
        return np.stack([self.logits(i) for i in range(n)])

    def remove_from(self, pos: int) -> bool:
        """Remove every cell at position ≥ pos; False when the memory cannot drop a partial tail."""
        return bool(llama_cpp.llama_memory_seq_rm(self._mem, 0, pos, -1))

    def remove_span(self, start: int, end: int) -> bool:
        """Remove the cells at positions start..end-1; False when the memory cannot (it is then unchanged)."""
        return bool(llama_cpp.llama_memory_seq_rm(self._mem, 0, start, end))

    def can_shift(self) -> bool:
        """True when this memory can move cells to other positions (`llama_memory_can_shift`).

        False for sliding-window caches smaller than n_ctx and for some position encodings. Recurrent
        memory says True, yet it cannot remove a span from the middle: check `remove_span` too.
        """
        return bool(llama_cpp.llama_memory_can_shift(self._mem))

    def shift(self, start: int, delta: int) -> None:
        """Add `delta` to the position of every cell at position ≥ start (`llama_memory_seq_add`).

        The keys are re-rotated lazily, by the next `decode`.
        """
        llama_cpp.llama_memory_seq_add(self._mem, 0, start, -1, delta)

    def clear(self) -> None:
        """Empty the cache (always possible, for every kind of memory)."""
        self._call(llama_cpp.llama_memory_clear, self._mem, True)

    def pos_range(self) -> tuple[int, int]:
        """(smallest, largest) position held for the sequence; (-1, -1) when empty."""
        return (
            int(llama_cpp.llama_memory_seq_pos_min(self._mem, 0)),
            int(llama_cpp.llama_memory_seq_pos_max(self._mem, 0)),
        )

    def save_state(self) -> bytes:
        """A copy of the sequence's state (KV cells or recurrent state)."""
        size = llama_cpp.llama_state_seq_get_size(self.handle, 0)
        buf = (ctypes.c_uint8 * size)()
        written = self._call(llama_cpp.llama_state_seq_get_data, self.handle, buf, size, 0)
        if written == 0 and size:
            raise ContextError("llama.cpp could not save the sequence state")
        return bytes(buf[:written])

    def load_state(self, state: bytes) -> None:
        """Replace the sequence's state with one from `save_state`."""
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if self._call(llama_cpp.llama_state_seq_set_data, self.handle, buf, len(state), 0) == 0:
            raise ContextError(f"llama.cpp could not restore the sequence state{_llama_error()}")


def render_jinja_chat(
    template: str, messages: list[dict[str, str]], *, bos: str, eos: str, add_generation_prompt: bool = True
) -> str:
    """Render a conversation with a GGUF/Hugging Face Jinja chat template.

    Raises:
        ChatTemplateError: the template does not render.
    """
    formatter = llama_chat_format.Jinja2ChatFormatter(
        template, eos_token=eos, bos_token=bos, add_generation_prompt=add_generation_prompt
    )
    try:
        return formatter(messages=messages).prompt
    except Exception as e:  # Jinja raises many types; a template bug must not crash the app
        raise ChatTemplateError(f"the chat template failed to render: {e} — pass --chat-template NAME") from e


def builtin_chat_templates() -> list[str]:
    """Names of llama.cpp's built-in chat templates (chatml, llama3, gemma, …)."""
    init()
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    arr = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(arr, n)
    return sorted(name.decode() for name in arr)


def render_builtin_chat(name: str, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
    """Render a conversation with one of llama.cpp's built-in templates by name.

    Raises:
        ChatTemplateError: unknown template name.
    """
    names = builtin_chat_templates()
    if name not in names:
        raise ChatTemplateError(f"unknown chat template {name!r}: choose one of {', '.join(names)}")
    keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
    chat = (llama_cpp.llama_chat_message * len(keep))(*[llama_cpp.llama_chat_message(r, c) for r, c in keep])
    size = 1024 + 2 * sum(len(r) + len(c) for r, c in keep)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(keep), add_generation_prompt, buf, size)
    if n > size:
        buf = ctypes.create_string_buffer(n)
        n = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(keep), add_generation_prompt, buf, n)
    if n < 0:
        raise ChatTemplateError(f"llama.cpp could not apply chat template {name!r}")
    return buf.raw[:n].decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class Device:
    """A compute device this llama.cpp build can really use."""

    name: str
    description: str
    kind: str  # "cpu", "gpu", "igpu" or "accel"
    memory_free: int
    memory_total: int


_DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}


def native() -> ctypes.CDLL:
    """ggml's C functions as the loaded libllama resolves them.

    A wheel cannot hold symlinks, so lib/ has libggml-base.so, .so.0 and .so.0.25.3 as three copies: opening
    one by name would load a second ggml with its own globals (abort hook, device registry). Looking symbols up
    through libllama's own handle finds the copies it really uses. A new CDLL object over the same handle keeps
    the argtypes set here apart from llama-cpp-python's.
    """
    init()
    lib = llama_cpp.llama_cpp._lib
    return ctypes.CDLL(lib._name, handle=lib._handle)


def device_handles() -> list[tuple[int, Device]]:
    """ggml's backend devices (Metal, CUDA, Vulkan, CPU…) with their native handles."""
    ggml = base = native()
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in (base.ggml_backend_dev_name, base.ggml_backend_dev_description):
        fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    base.ggml_backend_dev_type.restype, base.ggml_backend_dev_type.argtypes = ctypes.c_int, [ctypes.c_void_p]
    base.ggml_backend_dev_memory.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    found = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        device = Device(
            name=base.ggml_backend_dev_name(dev).decode(),
            description=base.ggml_backend_dev_description(dev).decode(errors="replace"),
            kind=_DEVICE_KINDS.get(base.ggml_backend_dev_type(dev), "unknown"),
            memory_free=free.value,
            memory_total=total.value,
        )
        found.append((dev, device))
    return found


def devices() -> list[Device]:
    """ggml's backend devices by name.

    `llama_supports_gpu_offload()` answers True even on CPU-only builds, so this is the real test.
    """
    return [device for _, device in device_handles()]
