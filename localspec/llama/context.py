"""`Context`: one llama.cpp context (KV cache or recurrent state) on one sequence, with explicit positions.

It decodes batches, hands out logits rows as numpy views and edits the cache; the token history belongs to
`core.kv.KVSequence`. Which native calls go through the model's placement (`self._call`, the RPC worker's own
thread, where a lost worker cannot abort the process): every call that may run work on a device or move
tensor data — decode, synchronize, logits reads, state save/restore, clear, init and free. The calls that skip
it (`remove_from`, `remove_span`, `can_shift`, `shift`, `pos_range`, `set_threads`) only read or edit
llama.cpp's host-side bookkeeping — cache cell metadata, positions, a thread count — and send nothing to a
device: a shift is applied by the next decode, which does go through the placement.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from collections.abc import Callable

import llama_cpp
import numpy as np

from localspec.errors import ContextError, NoRoomError

from .log import llama_error
from .memory import full_message, kv_bytes_estimate, memory_bytes
from .model import Model
from .threads import physical_cores

log = logging.getLogger(__name__)

# `llama_get_logits_ith` again, answering the row's address as a plain int: llama_cpp's binding answers a ctypes
# pointer object, and casting it back costs as much again. Used for contexts whose model runs on this machine.
_logits_address = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(
    ctypes.cast(llama_cpp.llama_get_logits_ith, ctypes.c_void_p).value
)


class Context:
    """One llama.cpp context (its KV cache or recurrent state) on one sequence (seq 0).

    Positions are explicit: callers own the token history and pass `n_past`.
    """

    row_shared = False  # its decodes are its own (a shared batch's rows: llama/slots.py)
    seconds_ahead = 0.0  # none of its decodes was made ahead of the step that takes it (llama/slots.py)

    def __init__(
        self,
        model: Model,
        *,
        n_ctx: int,
        n_batch: int = 512,
        n_threads: int | None = None,
        swa_full: bool = False,
        n_rs_seq: int = 0,
        device_greedy: bool = False,
        device_topk: bool = False,
        n_seq: int = 1,
    ) -> None:
        """Create a context.

        Args:
            model: the loaded model.
            n_ctx: context length in tokens (≤ the model's training context).
            n_batch: most tokens per `llama_decode` (longer inputs are split).
            n_threads: CPU threads; None = physical cores.
            swa_full: full-size cache for sliding-window layers, so long rollbacks stay valid.
            n_rs_seq: recurrent-state rollback snapshots per sequence (hybrid models whose architecture llama.cpp
                supports for it, Qwen3.5 among them; clamped to 0 elsewhere — `self.n_rs_seq` is what it kept):
                a tail of up to that many tokens of the last decode can then be removed.
            device_greedy: attach llama.cpp's greedy sampler to the graph, so every output row's argmax is taken
                where the logits are computed (`sampled_token`); the logits are still delivered. `device_law`
                swaps in a top-k chain instead (only k candidates leave the graph).
            device_topk: drafting at T > 0 may use `device_law` (set by `--device-sampling on` only: measured
                slower than the host on a CPU and on an H100, docs/benchmarks.md "Where sampling runs").
            n_seq: sequences sharing one pool of n_ctx cells (`kv_unified`; `serve --parallel`, llama/slots.py), each
                at positions up to n_ctx while cells are free (`room`); the methods act on sequence 0 unless given
                `seq`.

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
        if n_seq > 1 and device_greedy:
            raise ContextError("device sampling keeps one sampler for sequence 0: turn it off for several sequences")
        need, have = kv_bytes_estimate(info, n_ctx), memory_bytes()  # one pool, however many sequences
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
        params.n_seq_max = n_seq
        # Several sequences share one pool of cells (llama-server's default): four slots in the memory of one n_ctx.
        # Flash attention stays llama.cpp's `auto`: off it would change which placement of a sequence's cells rounds
        # its logits, not whether, and cost 1.1-1.9x a shared decode (DESIGN §8, "One pool").
        params.kv_unified = n_seq > 1
        threads = n_threads or physical_cores()
        params.n_threads = threads
        params.n_threads_batch = threads
        params.swa_full = swa_full
        params.n_rs_seq = n_rs_seq
        params.no_perf = True
        self._configure(params)
        self._sampler = None
        if device_greedy:
            # A sampler chain in the graph; llama.cpp refuses more outputs per sequence than it was told to expect.
            self._sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
            llama_cpp.llama_sampler_chain_add(self._sampler, llama_cpp.llama_sampler_init_greedy())
            self._sampler_config = (llama_cpp.llama_sampler_seq_config * 1)()
            self._sampler_config[0].seq_id = 0
            self._sampler_config[0].sampler = ctypes.cast(self._sampler, ctypes.c_void_p)
            params.samplers = self._sampler_config
            params.n_samplers = 1
            params.n_outputs_max_per_seq = self.n_batch
        self.device_greedy = device_greedy
        self.device_topk = device_greedy and device_topk
        self._retired: list = []  # chains swapped out by `device_law`, freed with the context
        self._law: tuple[int, float] = (0, 0.0)  # the chain attached now: (top_k, temperature); (0, 0.0) is greedy
        self._call = model._call  # a remote model's contexts make their native calls where it does
        handle = self._call(llama_cpp.llama_init_from_model, model.handle, params)
        if not handle:
            self._free_sampler()
            raise ContextError(
                f"could not create a context of {n_ctx} tokens for {model.path.name}{llama_error()}: "
                "use a smaller --n-ctx"
            )
        self._handle = handle
        self.n_threads = threads
        self.seconds_decoding = 0.0  # time spent inside llama_decode (benchmarks: Python time is the rest)
        self.decodes = 0  # llama_decode calls (benchmarks: round trips per decode over RPC)
        self.decoding_thread: int | None = None  # the thread that decoded last (DESIGN §7: one per process)
        self.n_seq = n_seq
        self.n_ctx = int(llama_cpp.llama_n_ctx(handle))  # cells, and the positions any one sequence may reach
        # Asked to free at least n cells of the pool for a decode that found too few (`serve --parallel`: the slots
        # evict idle slots' caches, core/slots.py); answers how many it freed.
        self.reclaim: Callable[[int], int] | None = None
        self._seq = 0  # the sequence the decode in progress is for
        self._row_seqs = [0] * self.n_batch  # the sequence each batch row is written for (several: llama/slots.py)
        self.n_rs_seq = int(self._call(llama_cpp.llama_n_rs_seq, handle))  # 0 where the model has no such rollback
        self._mem = llama_cpp.llama_get_memory(handle)
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        n = self.n_batch
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(n,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n,))
        self._out = np.ctypeslib.as_array(self._batch.logits, shape=(n,))
        self._positions = np.arange(self.n_ctx + n, dtype=self._pos.dtype)  # copied from, never built per decode
        # One-token decodes (every drafted token, every plain step) write the batch through these pointers: three
        # item writes cost a fifth of three numpy slice assignments right after a decode, with the caches cold.
        self._token0, self._pos0, self._out0 = self._batch.token, self._batch.pos, self._batch.logits
        self._local = model.placement is None  # native calls made here, not on an RPC placement's thread
        self.after_decode: Callable[[list[int], int], None] | None = None  # told (tokens, n_past) after each decode
        self._views: dict = {}  # logits row address -> (n_vocab,) view; (address, n) -> (n, n_vocab) block view
        for i in range(n):
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0

    def _configure(self, params) -> None:
        """Last changes to the native context params before the context is made (a subclass's kind)."""

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
            self._free_sampler()

    def _free_sampler(self) -> None:
        if getattr(self, "_sampler", None) is not None:  # after the context that used it
            llama_cpp.llama_sampler_free(self._sampler)
            self._sampler = None
        for chain in getattr(self, "_retired", ()):
            llama_cpp.llama_sampler_free(chain)
        self._retired = []

    @property
    def host_chains(self) -> bool:
        """Whether llama.cpp's sampler chains can sample this context's rows on the host (`sampler.ChainLawBuilder`):
        no sampler in its graph (llama.cpp would hand back the graph's token) and its native calls made on this
        thread (not an RPC placement's)."""
        return not self.device_greedy and self._local

    def device_law(self, top_k: int = 0, temperature: float = 0.0) -> None:
        """From the next decode on, sample in the graph with top-k then temperature (`sampled_candidates`), or with
        the greedy chain again (top_k 0). Only for a context made with `device_greedy`. While a top-k chain is
        attached the full logits stay in the graph: `logits` refuses to read them."""
        assert self.device_greedy
        law = (top_k, float(temperature)) if top_k else (0, 0.0)
        if law == self._law:
            return
        # llama.cpp sets a chain up in the graph once: each switch attaches a new chain (a few per session), and
        # the one it replaces may still be referenced until the next decode, so it is freed with the context.
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        if top_k:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(top_k))
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(float(temperature)))
        else:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        if not self._call(llama_cpp.llama_set_sampler, self.handle, 0, chain):
            llama_cpp.llama_sampler_free(chain)
            raise ContextError(f"llama.cpp could not attach a sampler to {self.model.path.name}'s context")
        self._retired.append(self._sampler)
        self._sampler, self._law = chain, law

    def sampled_candidates(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Row `i`'s top-k candidates and their logits divided by the temperature, as the graph's top-k chain left
        them (see `device_law`): ((k,) int64 ids, (k,) float64)."""
        n = self._call(llama_cpp.llama_get_sampled_candidates_count_ith, self.handle, i)
        if not n:
            raise ContextError(f"no sampled candidates for row {i}: no top-k chain, or the row was not requested")
        ids = np.ctypeslib.as_array(self._call(llama_cpp.llama_get_sampled_candidates_ith, self.handle, i), (n,))
        logits = np.ctypeslib.as_array(self._call(llama_cpp.llama_get_sampled_logits_ith, self.handle, i), (n,))
        return ids.astype(np.int64), logits.astype(np.float64)

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def decode(self, tokens: list[int], n_past: int, *, outputs: int = 1, seq: int = 0) -> None:
        """Append `tokens` at positions n_past… and compute logits for the last `outputs` rows.

        Inputs longer than n_batch are split; the output rows must fit in the last chunk. Read the rows
        with `logits(i)`, i counted from the start of that last chunk, or negative from its end.

        Raises:
            NoRoomError: too few free cells (nothing of `tokens` was kept).
            ContextError: the context is full, or llama.cpp failed.
        """
        n = len(tokens)
        assert 0 <= outputs <= n <= self.n_ctx
        if n_past + n > self.n_ctx:
            raise ContextError(f"context full ({self.n_ctx} tokens): start a new chat or raise --n-ctx")
        self._seq = seq  # the sequence `_submit` writes the rows for
        if n <= self.n_batch:  # the usual case (every generation step): one batch, no slicing
            self._submit(tokens, n_past, n - outputs)
            return
        for start in range(0, n, self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            first_out = n - outputs - start  # rows of this chunk from which logits are wanted
            assert start + len(chunk) == n or first_out >= len(chunk), "output rows must fit in one batch"
            try:
                self._submit(chunk, n_past + start, first_out)
            except NoRoomError:
                self.remove_from(n_past, seq)  # the chunks before: a decode with no room leaves nothing behind
                raise

    def _submit(self, tokens: list[int], n_past: int, first_out: int) -> None:
        """One `llama_decode` of at most n_batch tokens (for sequence `_seq`); logits for rows first_out.. of them."""
        n = len(tokens)
        if self.n_seq > 1:
            self._write_seqs([self._seq] * n)
        if n == 1:
            self._token0[0], self._pos0[0], self._out0[0] = tokens[0], n_past, first_out <= 0
        else:
            self._tok[:n] = tokens
            self._pos[:n] = self._positions[n_past : n_past + n]
            first_out = min(max(first_out, 0), n)
            self._out[:first_out] = 0
            self._out[first_out:n] = 1
        self._run_batch(n, tokens, n_past)

    def decode_rows(self, rows: list[tuple[int, int, int]], outputs: list[bool] | None = None) -> None:
        """ONE `llama_decode` of rows of several sequences: `rows` are (seq, token, n_past), and row i's logits are
        `logits(i)` where `outputs[i]` (default: every row) (`serve --parallel`: each active stream's next rows,
        llama/slots.py)."""
        n = len(rows)
        assert 0 < n <= self.n_batch and self.n_seq > 1
        self._write_seqs([seq for seq, _, _ in rows])
        self._tok[:n] = [token for _, token, _ in rows]
        self._pos[:n] = [n_past for _, _, n_past in rows]
        self._out[:n] = 1 if outputs is None else [int(o) for o in outputs]
        self._run_batch(n, None, 0)

    def _write_seqs(self, seqs: list[int]) -> None:
        """Tag batch rows 0..len(seqs)-1 with these sequences (rows whose tag already fits are left alone)."""
        tags = self._row_seqs
        for i, seq in enumerate(seqs):
            if tags[i] != seq:
                self._batch.seq_id[i][0] = tags[i] = seq

    def _run_batch(self, n: int, tokens: list[int] | None, n_past: int) -> None:
        """`llama_decode` of the batch's first n rows, timed; a head that reads the rows is told (one sequence)."""
        self._batch.n_tokens = n
        thread = threading.get_ident()
        if thread != self.decoding_thread:
            if self.decoding_thread is not None:
                log.warning(
                    "%s: decoding on another thread than before: llama.cpp keeps a pool of threads per calling "
                    "thread, and two pools fight for the cores (DESIGN §7): decode on one thread",
                    self.model.path.name,
                )
            self.decoding_thread = thread
        t0 = time.perf_counter()
        rc = self._call(llama_cpp.llama_decode, self.handle, self._batch)
        if rc == 1 and self.reclaim is not None and self.reclaim(n - self._free_cells()) > 0:
            rc = self._call(llama_cpp.llama_decode, self.handle, self._batch)  # idle slots' cells were freed
        if rc == 0:
            # GPU and RPC backends return before the work is done; wait here so the time is the decode's
            # (stats, the policy's costs, bench) and not the first logits read's.
            self._call(llama_cpp.llama_synchronize, self.handle)
        self.seconds_decoding += time.perf_counter() - t0
        self.decodes += 1
        if rc != 0:
            if rc == 1:  # llama.cpp found too few free cells before decoding anything: the cache is unchanged
                raise NoRoomError(self.full_message())
            raise ContextError(f"llama_decode failed with code {rc}{llama_error()}")
        if self.after_decode is not None and tokens is not None:  # a draft head reads the hidden rows (llama/mtp.py)
            self.after_decode(tokens, n_past)

    def full_message(self) -> str:
        """What a user is told when this context has no free cell left: one line, with what to change."""
        return full_message(self.n_ctx, self.n_seq)

    def free_cells(self, need: int = 0) -> int:
        """Cells no sequence holds (a sequence holds positions 0..its largest, as `core.kv.KVSequence` keeps it);
        fewer than `need`: `reclaim` is asked to free cells first."""
        free = self._free_cells()
        if free < need and self.reclaim is not None and self.reclaim(need - free):
            free = self._free_cells()
        return free

    def _free_cells(self) -> int:
        used = sum(int(llama_cpp.llama_memory_seq_pos_max(self._mem, seq)) + 1 for seq in range(self.n_seq))
        return max(0, self.n_ctx - used)

    def room(self, n_past: int, seq: int = 0, *, need: int = 1) -> int:
        """How many rows a decode for `seq` at n_past can place now: positions up to n_ctx, and in a pool of several
        sequences the free cells and those `seq` holds from n_past on (which the decode replaces). Where fewer than
        `need` are left, `reclaim` is asked to free cells first."""
        room = self.n_ctx - n_past
        if self.n_seq == 1 or room <= 0:
            return max(0, room)
        held = max(0, int(llama_cpp.llama_memory_seq_pos_max(self._mem, seq)) + 1 - n_past)
        return min(room, held + self.free_cells(min(need, room) - held))

    def outputs_last(self) -> int:
        """How many rows of the last batch decoded had their outputs computed (in a one-sequence decode, its last
        rows): the rows whose logits, and hidden rows where asked for, can be read."""
        return int(np.count_nonzero(self._out[: self._batch.n_tokens]))

    @property
    def seq_decoding(self) -> int:
        """The sequence the decode in progress (or the last one-sequence decode) was for: whom `after_decode` tells."""
        return self._seq

    def rows_start(self, n: int) -> int:
        """Where the last n rows of the last decode start among its batch rows (a sequence of a shared batch:
        llama/slots.py): here 0, the batch being the last decode's own rows."""
        return 0

    def output_span(self) -> tuple[int, int]:
        """(first, count) of the last decode's output rows that are this context's (all of them here)."""
        return 0, self.outputs_last()

    def logits(self, i: int) -> np.ndarray:
        """Row `i` of the last decode's logits as a float32 view of shape (n_vocab,).

        The view is valid until this context's next `decode`; copy it to keep it.
        """
        assert not self._law[0], "the logits stay in the graph while a top-k chain is attached (device_law)"
        address = self._native(_logits_address, i)
        view = self._views.get(address)
        if view is None:
            if not address:
                raise ContextError(f"no logits for row {i}: it was not requested in the last decode")
            view = self._view(address, address, (self.n_vocab,))
        return view

    def _native(self, fn, *args):
        """`fn(handle, *args)`: called right here when the model runs on this machine (the hot path's calls),
        else on its RPC placement's thread."""
        if self._local and self._handle is not None:
            return fn(self._handle, *args)
        return self._call(fn, self.handle, *args)

    def _view(self, key: object, address: int, shape: tuple[int, ...]) -> np.ndarray:
        """A float32 view of `shape` over the logits at `address`, kept under `key`: llama.cpp reuses its output
        buffer, so the same few addresses come back, and each gets one view, not one per call."""
        if len(self._views) >= 256:  # the buffer moved (it grew): forget the old addresses
            self._views.clear()
        array = (ctypes.c_float * math.prod(shape)).from_address(address)
        view = self._views[key] = np.frombuffer(array, np.float32).reshape(shape)
        return view

    def sampled_token(self, i: int) -> int:
        """The argmax of row `i` of the last decode, taken in the graph (a context made with `device_greedy`)."""
        token = self._native(llama_cpp.llama_get_sampled_token_ith, i)
        if token < 0:
            raise ContextError(f"no sampled token for row {i}: it was not requested in the last decode")
        return int(token)

    def set_threads(self, n: int) -> None:
        """Use n CPU threads from the next decode on (the results do not depend on it)."""
        llama_cpp.llama_set_n_threads(self.handle, n, n)
        self.n_threads = n

    def logits_block(self, n: int, start: int = 0) -> np.ndarray:
        """Rows start..start+n-1 of the last decode's logits as one float32 view of shape (n, n_vocab) (a negative
        `start` counts the decode's output rows from the end, as llama.cpp does: -n is the first of the last n).

        llama.cpp keeps the output rows of a one-sequence batch contiguous and in order; where it does not,
        the rows are copied into one array.
        """
        first, last = self._native(_logits_address, start), self._native(_logits_address, start + n - 1)
        if not first or not last:
            raise ContextError(
                f"no logits for rows {start}..{start + n - 1}: they were not requested in the last decode"
            )
        if last - first == (n - 1) * self.n_vocab * ctypes.sizeof(ctypes.c_float):
            view = self._views.get((first, n))
            return self._view((first, n), first, (n, self.n_vocab)) if view is None else view
        return np.stack([self.logits(start + i) for i in range(n)])

    def remove_from(self, pos: int, seq: int = 0) -> bool:
        """Remove every cell at position ≥ pos; False when the memory cannot drop a partial tail."""
        return bool(llama_cpp.llama_memory_seq_rm(self._mem, seq, pos, -1))

    def remove_span(self, start: int, end: int, seq: int = 0) -> bool:
        """Remove the cells at positions start..end-1; False when the memory cannot (it is then unchanged)."""
        return bool(llama_cpp.llama_memory_seq_rm(self._mem, seq, start, end))

    def can_shift(self) -> bool:
        """True when this memory can move cells to other positions (`llama_memory_can_shift`).

        False for sliding-window caches smaller than n_ctx and for some position encodings. Recurrent
        memory says True, yet it cannot remove a span from the middle: check `remove_span` too.
        """
        return bool(llama_cpp.llama_memory_can_shift(self._mem))

    def shift(self, start: int, delta: int, seq: int = 0) -> None:
        """Add `delta` to the position of every cell at position ≥ start (`llama_memory_seq_add`).

        The keys are re-rotated lazily, by the next `decode`.
        """
        llama_cpp.llama_memory_seq_add(self._mem, seq, start, -1, delta)

    def clear(self, seq: int | None = None) -> None:
        """Empty the cache (always possible, for every kind of memory); with `seq`, that sequence's cells only."""
        if seq is None:
            self._call(llama_cpp.llama_memory_clear, self._mem, True)
        else:
            self._call(llama_cpp.llama_memory_seq_rm, self._mem, seq, -1, -1)

    def pos_range(self, seq: int = 0) -> tuple[int, int]:
        """(smallest, largest) position held for the sequence; (-1, -1) when empty."""
        return (
            int(llama_cpp.llama_memory_seq_pos_min(self._mem, seq)),
            int(llama_cpp.llama_memory_seq_pos_max(self._mem, seq)),
        )

    def save_state(self, *, partial: bool = False, seq: int = 0) -> bytes:
        """A copy of the sequence's state (KV cells or recurrent state): one copy out of llama.cpp's buffer (slicing
        a ctypes byte array would build a Python int per byte: 0.4 s for a 12 MiB cache). `partial`: only the
        recurrent part of a hybrid memory (its size does not grow with the context)."""
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        size = llama_cpp.llama_state_seq_get_size_ext(self.handle, seq, flags)
        buf = (ctypes.c_uint8 * size)()
        written = self._call(llama_cpp.llama_state_seq_get_data_ext, self.handle, buf, size, seq, flags)
        if written == 0 and size:
            raise ContextError("llama.cpp could not save the sequence state")
        return ctypes.string_at(buf, written)

    def load_state(self, state: bytes, *, partial: bool = False, seq: int = 0) -> None:
        """Replace the sequence's state with one from `save_state` (read in place, not copied); `partial` as there
        (the attention cells stay: remove the tail after it)."""
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        data = ctypes.cast(ctypes.c_char_p(state), ctypes.POINTER(ctypes.c_uint8))
        if self._call(llama_cpp.llama_state_seq_set_data_ext, self.handle, data, len(state), seq, flags) == 0:
            raise ContextError(f"llama.cpp could not restore the sequence state{llama_error()}")
