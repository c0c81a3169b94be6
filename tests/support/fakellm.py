"""A numpy stand-in for a llama.cpp model whose conditional laws are known exactly (pure-logic tests).

`TableContext` implements the few `llama.context.Context` calls that `KVSequence` and the engine make; its
logits are a pure function of the token prefix (`LogitTable`), so the exact law of any continuation can
be computed. `fake_engine` wires a real `Engine` (real KVSequence, drafters, loop, policy) around it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from localspec.core.drafters import ModelDrafter, make_drafter
from localspec.core.engine import Engine
from localspec.core.kv import KVSequence
from localspec.core.params import needs_draft_model


class LogitTable:
    """Logits of a model over `n_vocab` tokens: a seeded draw per prefix, optionally a noisy copy of another."""

    def __init__(
        self, n_vocab: int, seed: int, scale: float = 1.5, base: LogitTable | None = None, noise: float = 0.0
    ) -> None:
        self.n_vocab, self.seed, self.scale, self.base, self.noise = n_vocab, seed, scale, base, noise
        self.logits = lru_cache(maxsize=None)(self._logits)

    def _logits(self, prefix: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([self.seed, len(prefix), *prefix])
        draw = rng.standard_normal(self.n_vocab)  # (n_vocab,)
        out = draw * self.scale if self.base is None else self.base.logits(prefix) + self.noise * draw
        return np.asarray(out, dtype=np.float32)


@dataclass(frozen=True)
class FakeInfo:
    file_size: int
    n_swa: int = 0


class FakeModel:
    """What the engine asks of a `llama.model.Model`: a name, a size, end tokens, token bytes."""

    def __init__(self, name: str, file_size: int = 1000) -> None:
        self.path = Path(f"{name}.gguf")
        self.info = FakeInfo(file_size)

    def eog_tokens(self) -> frozenset[int]:
        return frozenset()

    def token_bytes(self, token: int) -> bytes:
        return bytes([97 + token % 26])


class TableContext:
    """A fake context: holds tokens at positions 0..n-1 and serves the table's logits for output rows (and, with
    `device_greedy`, their argmax as llama.cpp's in-graph sampler would)."""

    def __init__(self, table: LogitTable, model: FakeModel, n_ctx: int = 256, *, device_greedy: bool = False) -> None:
        self.table, self.model, self.n_ctx, self.device_greedy = table, model, n_ctx, device_greedy
        self.device_topk = False
        self.row_shared = False  # no top-k chain: a sampled draft reads the table's logits
        self.seconds_ahead = 0.0  # no decode is made ahead of the step that takes it
        self.n_batch, self.n_rs_seq = n_ctx, 0  # one batch holds anything; no recurrent snapshots
        self.seconds_decoding = 0.0  # a table lookup is not timed
        self.after_decode = None  # no draft head reads a table
        self.n_vocab = table.n_vocab
        self.tokens: list[int] = []
        self._rows: list[np.ndarray | None] = []  # batch index -> logits of the last decode

    def decode(self, tokens: list[int], n_past: int, *, outputs: int = 1) -> None:
        assert n_past == len(self.tokens) and 0 <= outputs <= len(tokens)
        self.tokens.extend(tokens)
        first = len(tokens) - outputs
        end = len(self.tokens) - len(tokens)
        self._rows = [None] * first + [
            self.table.logits(tuple(self.tokens[: end + i + 1])) for i in range(first, len(tokens))
        ]

    def logits(self, i: int) -> np.ndarray:
        row = self._rows[i]
        assert row is not None, f"no logits for batch row {i}"
        return row

    def logits_block(self, n: int, start: int = 0) -> np.ndarray:
        return np.stack(
            [self.logits(start + i) for i in range(n)]
        )  # (n, n_vocab); a negative start counts from the end

    def sampled_token(self, i: int) -> int:
        assert self.device_greedy, "a context without the in-graph sampler"
        return int(np.argmax(self.logits(i)))

    def device_law(self, top_k: int = 0, temperature: float = 0.0) -> None:
        assert self.device_greedy, "a context without the in-graph sampler"
        self.law = (top_k, temperature)

    def sampled_candidates(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The top-k rows and logits / T, as llama.cpp's top-k + temperature chain leaves them."""
        top_k, temperature = self.law
        ids = np.argsort(-self.logits(i), kind="stable")[:top_k]
        return ids.astype(np.int64), self.logits(i)[ids].astype(np.float64) / temperature

    def remove_from(self, pos: int) -> bool:
        del self.tokens[pos:]
        return True

    def room(self, n_past: int, *, need: int = 1) -> int:
        return max(0, self.n_ctx - n_past)

    def full_message(self) -> str:
        return f"the context is full ({self.n_ctx} tokens)"

    def clear(self) -> None:
        self.tokens.clear()

    def pos_range(self) -> tuple[int, int]:
        return (0, len(self.tokens) - 1) if self.tokens else (-1, -1)


def fake_engine(
    target: LogitTable, draft: LogitTable | None, drafter: str = "model", *, draft_size: int = 1000
) -> Engine:
    """A real `Engine` over fake contexts: `drafter` is one of localspec.core.params.DRAFTERS."""
    target_model = FakeModel("target")
    target_seq = KVSequence(TableContext(target, target_model), rollback="seq_rm")
    model = None
    if needs_draft_model(drafter):
        draft_seq = KVSequence(TableContext(draft, FakeModel("draft", draft_size)), rollback="seq_rm")
        model = ModelDrafter(draft_seq, size_ratio=draft_size / target_model.info.file_size)
    return Engine(target_model, target_seq, make_drafter(drafter, model))
