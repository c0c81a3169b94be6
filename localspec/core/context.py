"""What a `KVSequence` (core/kv.py) works over: `Context`, the protocol of one model context (llama/context.py's
llama.cpp one, or the pure-logic tests' numpy fakes), the `Media` and `StateCache` it is handed, and the token
history it holds — compared (`common_prefix`) and cut without splitting an image (`media_run`, `whole_images`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from localspec.llama.model import Model


@runtime_checkable
class Context(Protocol):
    """What `KVSequence` and the generation loop ask of one model context (sequence 0 of its memory)."""

    model: Model  # the weights it runs (`path` and `info` are read)
    n_ctx: int
    n_batch: int  # most tokens per llama_decode (longer inputs are split)
    swa_full: bool  # a full-size sliding-window cache (it keeps every cell a rollback needs)
    device_greedy: bool  # each output row's argmax is taken in the graph (`sampled_token`)
    device_topk: bool  # a draft at T > 0 may take its law from the graph (`device_law`, `sampled_candidates`)
    n_rs_seq: int  # recurrent-state rollback snapshots llama.cpp keeps per sequence (0: none)

    @property
    def seconds_decoding(self) -> float:
        """Time spent inside decode so far."""
        ...

    @property
    def row_shared(self) -> bool:
        """The last decode's row came from a batch shared with other sequences (`serve --parallel`): it cost no time
        of its own, so the step that read it says nothing of what a step costs."""
        ...

    @property
    def seconds_ahead(self) -> float:
        """Seconds of the last decode where it was made ahead of the step that took its rows, alone in its batch (a
        shared tick of one stream, `serve --parallel`): the step's own decode, timed early; 0.0 otherwise."""
        ...

    # Told (tokens, n_past) after each decode: a draft head that reads the rows (installed by `Engine.use_drafter`).
    after_decode: Callable[[list[int], int], None] | None

    def decode(self, tokens: list[int], n_past: int, *, outputs: int = 1) -> None:
        """Decode `tokens` at positions n_past.. ; logits for the last `outputs` rows."""
        ...

    def logits(self, i: int) -> np.ndarray:
        """Row i of the last decode (negative from the end): a (n_vocab,) view."""
        ...

    def logits_block(self, n: int) -> np.ndarray:
        """The first n output rows of the last decode: a (n, n_vocab) view."""
        ...

    def sampled_token(self, i: int) -> int:
        """Row i's argmax as the graph took it (only with `device_greedy`)."""
        ...

    def device_law(self, top_k: int = 0, temperature: float = 0.0) -> None:
        """Sample in the graph with top-k and temperature from the next decode on (0: greedy again)."""
        ...

    def sampled_candidates(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Row i's top-k candidates and their logits / temperature, from the graph's top-k chain."""
        ...

    def remove_from(self, pos: int) -> bool:
        """Drop positions pos.. ; False when the memory cannot drop a partial tail."""
        ...

    def room(self, n_past: int, *, need: int = 1) -> int:
        """Rows a decode at n_past can place now: the positions left, within a shared pool's free cells."""
        ...

    def full_message(self) -> str:
        """What the user is told when no cell is left: one line, with what to change."""
        ...

    def remove_span(self, start: int, end: int) -> bool:
        """Drop positions start..end-1; False when the memory cannot."""
        ...

    def can_shift(self) -> bool:
        """Whether `shift` can move positions."""
        ...

    def shift(self, start: int, delta: int) -> None:
        """Move positions start.. by delta."""
        ...

    def clear(self) -> None:
        """Empty the memory."""
        ...

    def pos_range(self) -> tuple[int, int]:
        """(lowest, highest) position held; (-1, -1) when empty."""
        ...

    def save_state(self, *, partial: bool = False) -> bytes:
        """The sequence's state, for `load_state`; `partial`: only a hybrid memory's recurrent part."""
        ...

    def load_state(self, state: bytes, *, partial: bool = False) -> None:
        """Restore a `save_state` result; ContextError when the memory cannot."""
        ...


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists.

    The usual case — one holds the other (a cache and the history that continues it) — is one comparison in C,
    without copying the shorter one; otherwise the first difference is narrowed by halving with comparisons in C (a
    draft cache holding the history and a few stale drafts: a loop in Python over thousands of tokens per step).
    """
    n = min(len(a), len(b))
    if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], and they differ before hi: halve with comparisons in C, then step
    while hi - lo > 32:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while a[lo] == b[lo]:
        lo += 1
    return lo


MEDIA_STRIDE = 1 << 24  # ids an image may take: image h's position i is -(h·MEDIA_STRIDE + i) - 1 (core/media.py)


def media_run(tokens: Sequence[int], start: int) -> int:
    """How many ids from `tokens[start]` on are positions of the image whose id is there (0: a token there)."""
    first = tokens[start]
    if first >= 0:
        return 0
    end = start + 1  # an image's ids count down from its first: the same image twice in a row is two runs
    while end < len(tokens) and tokens[end] == tokens[end - 1] - 1 and (-tokens[end] - 1) % MEDIA_STRIDE:
        end += 1
    return end - start


def inside_image(tokens: Sequence[int], n: int) -> bool:
    """Whether a cut of `tokens` at n would fall inside an image (tokens[n] is an image's id but not its first)."""
    return 0 < n < len(tokens) and tokens[n] < 0 and (-tokens[n] - 1) % MEDIA_STRIDE != 0


def whole_images(tokens: Sequence[int], n: int) -> int:
    """`n`, or past the end of the image it would cut (a chunk of a prompt never ends inside an image)."""
    while inside_image(tokens, n):
        n += 1
    return n


class Media(Protocol):
    """How a sequence reads the images in its history (core/media.py: the target's `MediaStore`, a draft's
    `Filler`): each image is a run of negative ids, one per position it takes (DESIGN §11)."""

    def decode(self, ctx: Context, run: Sequence[int], n_past: int) -> None:
        """Decode the image whose whole run is `run` into `ctx` at positions n_past.. (no logits)."""
        ...


class StateCache(Protocol):
    """What `KVSequence` asks of a prompt cache (core/promptcache.py's `PromptCache`): keep a sequence's state under
    the tokens it holds, and find the one to restore before reading others."""

    def save(self, namespace: str, tokens: list[int], state: bytes, *, trims: bool) -> None: ...

    def best(self, namespace: str, tokens: list[int], held: int, *, trims: bool) -> tuple[Any, int] | None:
        """(an entry with `.tokens` and `.state`, how many of `tokens` it gives), or None."""
        ...

    def peek(self, namespace: str, tokens: list[int], held: int, *, trims: bool) -> int:
        """How many of `tokens` `best` would give (`held` where none), changing nothing."""
        ...
