"""The sampling transform shared by the draft and the target (DESIGN §2), at a cost that ignores the vocabulary.

logits → repetition/frequency/presence penalties → temperature → softmax → top-k → top-p → min-p →
renormalise. The result is an `ArrayLaw` (core/laws.py): the exact law a token is drawn from, which speculative
verification needs for both models. Randomness comes only from an injected numpy Generator.

Nothing here sorts the vocabulary. A row of 262,144 logits is read once, as column maxima of a 64-row grid
(`_Blocks`); the columns whose maximum can reach the cut — the k-th largest value for top-k, max + T·ln(min_p) for
min-p — give a small candidate set, and only the candidates are sorted and exponentiated in float64.
The penalties touch at most `repeat_last_n` tokens, so they are applied to those alone (the candidate
set is widened by that many so it stays exact). Top-p without top-k needs the softmax mass of the whole
row, taken in float32 once and re-taken in float64 only when a cut falls within its rounding error. With
every filter off the law is one float64 softmax over the row.

Ties are broken one way everywhere: among equal values the lower token id comes first (greedy picks
it, top-k keeps it, top-p counts it first). tests/support/sampling_reference.py holds the plain full-sort
version of the same law, which the tests compare against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

from localspec.errors import NonFiniteLogitsError

from .laws import ArrayLaw
from .options import Limit, check_fields, limit, option

GREEDY_BELOW = 1e-6
"""A temperature below this is greedy: the law it asks for differs from the argmax only between logits closer than
about 1e-5, and dividing by it overflows float32 (llama.cpp's chain, our float32 mass) well before 1e-38."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How tokens are chosen. temperature 0 means greedy (argmax)."""

    temperature: float = field(
        default=0.8,
        metadata=option(
            "0 = greedy (so is anything below 1e-6)",
            pair=True,
            form="temperature (0 = greedy)",
            limit=Limit(0, 100, note="0 = greedy"),
        ),
    )
    top_k: int = field(
        default=40,
        metadata=option(
            "keep the k most likely tokens; 0 = off",
            pair=True,
            form="top-k (0 = off)",
            limit=Limit(0, 2**31 - 1, note="0 = off"),
        ),
    )
    top_p: float = field(
        default=0.95,
        metadata=option(
            "keep the fewest tokens whose probability reaches p; 1 = off",
            pair=True,
            form="top-p",
            limit=Limit(0, 1, low_open=True, note="1 = off"),
        ),
    )
    min_p: float = field(
        default=0.05,
        metadata=option(
            "drop tokens under p × the best one's probability; 0 = off",
            pair=True,
            form="min-p",
            limit=Limit(0, 1, note="0 = off"),
        ),
    )
    repeat_penalty: float = field(
        default=1.0,
        metadata=option(
            "penalty for recently seen tokens; 1 = off", limit=Limit(0, 100, low_open=True, note="1 = off")
        ),
    )
    repeat_last_n: int = field(default=64, metadata=limit(0))
    frequency_penalty: float = field(default=0.0, metadata=limit(note="0 = off"))  # any finite number
    presence_penalty: float = field(default=0.0, metadata=limit(note="0 = off"))
    seed: int | None = field(
        default=None, metadata=option("same seed + same settings = same output", kind=int, limit=Limit(0, 2**64 - 1))
    )

    def __post_init__(self) -> None:
        check_fields(self, "sampling")
        if self.temperature < GREEDY_BELOW:  # logits / T would overflow float32 long before T reaches 0
            object.__setattr__(self, "temperature", 0.0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalised(self) -> bool:
        return (
            self.repeat_penalty != 1.0 or self.frequency_penalty or self.presence_penalty
        ) and self.repeat_last_n > 0


def _check_finite(best: float) -> None:
    """Raise `NonFiniteLogitsError` unless a row's maximum (or its argmax's value) is finite. numpy's max propagates
    NaN and its argmax returns the first NaN, so a value already computed tells whether any entry is NaN or +inf,
    at no second pass over the row."""
    if not math.isfinite(best):
        raise NonFiniteLogitsError()


def penalty_window(history: list[int], params: SamplingParams) -> list[int]:
    """The tail of `history` the penalties look at ([] when no penalty is on, so callers skip the copy)."""
    return history[-params.repeat_last_n :] if params.penalised else []


_ROWS = 64  # most rows of the grid a logits row is seen as (`_Blocks`): 4,096 column maxima at 262,144 tokens
_GROUPS = 64  # fewest groups `_kth_largest` narrows a selection with
_NO_IDS = np.zeros(0, dtype=np.int64)
_NO_VALUES = np.zeros(0, dtype=np.float32)
_CUT_MARGIN = 1e-4  # logits: a candidate threshold is lowered by this, so float rounding never loses a survivor
_MASS_TOLERANCE = 1e-6  # relative: a top-p cut this close to the float32 mass is decided again in float64
_WINDOWS = (7.0, 14.0, 28.0)  # top-p without top-k or min-p: candidates within this many T·nats of the max


class _Blocks:
    """One logits row seen as a grid of `rows` × n_cols (row-major, as it lies in memory) and its column maxima.

    A "block" is a column: the entries j, j + n_cols, j + 2·n_cols, …. Its maxima are one reduction across the
    grid's rows (elementwise, numpy's fast direction: faster than maxima of 1,024-entry runs, docs/benchmarks.md
    "Sampling cost per row"), and a column that can reach a cut gathers only its `rows` entries.
    """

    __slots__ = ("row", "grid", "tail", "maxima")

    def __init__(self, row: np.ndarray, need: int = 1) -> None:
        # At least 4·need columns, so the `need` best values hit few of them; at most _ROWS rows.
        rows = max(1, min(_ROWS, row.shape[0] // (4 * need)))
        n_cols = row.shape[0] // rows
        self.row = row
        self.grid = row[: rows * n_cols].reshape(rows, n_cols)  # a view
        self.tail = row[rows * n_cols :]  # (< rows,) the rest
        maxima = self.grid.max(axis=0)
        self.maxima = np.append(maxima, self.tail.max()) if self.tail.size else maxima
        _check_finite(self.maxima.max())  # (n_cols,): a NaN anywhere in the row is in its column's maximum

    def lower_bound(self, need: int) -> float:
        """A value t with at least `need` entries ≥ t: the need-th largest column maximum (or, past the number
        of columns, the exact need-th largest value)."""
        if need <= self.maxima.shape[0]:
            return _kth_largest(self.maxima, need)
        return _kth_largest(self.row, min(need, self.row.shape[0]))

    def above(self, threshold: float) -> np.ndarray:
        """Ascending ids of every entry ≥ threshold, reading only the columns whose maximum reaches it."""
        hit = np.flatnonzero(self.maxima >= threshold)
        n_cols = self.grid.shape[1]
        cols = hit[hit < n_cols]
        r, c = np.nonzero(self.grid[:, cols] >= threshold)  # row-major: by grid row, then column: ascending ids
        ids = r * n_cols + cols[c]
        if hit.size and hit[-1] == n_cols:  # the tail
            ids = np.concatenate([ids, self.grid.size + np.flatnonzero(self.tail >= threshold)])
        return ids.astype(np.int64, copy=False)


def _kth_largest(values: np.ndarray, k: int) -> float:
    """The k-th largest entry of `values` (1 ≤ k ≤ its size).

    Selecting among a few thousand values is the costly part; so when there are enough, the k-th largest of group
    maxima comes first: those are k distinct entries, so it is at most the answer, and the entries below it can
    go before the selection (about 60 of 4,096 column maxima stay for k = 40).
    """
    groups = max(_GROUPS, 2 * k)
    size = values.shape[0] // groups
    if size >= 4:
        maxima = values[: groups * size].reshape(size, groups).max(axis=0)
        values = values[values >= np.partition(maxima, groups - k)[groups - k]]
    n = values.shape[0]
    return float(np.partition(values, n - k)[n - k])


def _as_row(logits: np.ndarray) -> np.ndarray:
    return logits if logits.dtype == np.float32 else logits.astype(np.float32)


def _penalties(row: np.ndarray, history: list[int], params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """(ascending ids, penalised float32 values) of the tokens the penalties change (llama.cpp's rules)."""
    if not (params.penalised and history):
        return _NO_IDS, _NO_VALUES
    ids, n = np.unique(np.asarray(history[-params.repeat_last_n :], dtype=np.int64), return_counts=True)
    n = n.astype(np.float32)
    values = row[ids]
    values = np.where(values > 0, values / params.repeat_penalty, values * params.repeat_penalty)
    return ids, values - n * params.frequency_penalty - params.presence_penalty


def _values(
    row: np.ndarray, ids: np.ndarray, pen_ids: np.ndarray, pen_values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The candidates `ids` ∪ the penalised tokens, ascending, with their (penalised) values."""
    if pen_ids.size:
        ids = np.union1d(ids, pen_ids)
    values = row[ids]
    if pen_ids.size:
        values[np.searchsorted(ids, pen_ids)] = pen_values
    return ids, values


def greedy_token(logits: np.ndarray, history: list[int], params: SamplingParams) -> int:
    """The argmax after penalties (temperature 0); the lower id among equal values."""
    if not params.penalised and logits.dtype == np.float32:
        token = int(logits.argmax())  # every greedy step without penalties: one call on the row as it is
        _check_finite(logits[token])
        return token
    row = _as_row(logits)
    pen_ids, pen_values = _penalties(row, history, params)
    if not pen_ids.size:
        token = int(np.argmax(row))
        _check_finite(row[token])
        return token
    # The best unpenalised token is among the len(pen_ids) + 1 largest raw values.
    blocks = _Blocks(row, len(pen_ids) + 1)
    ids, values = _values(row, blocks.above(blocks.lower_bound(len(pen_ids) + 1)), pen_ids, pen_values)
    return int(ids[np.argmax(values)])


def sampling_law(logits: np.ndarray, history: list[int], params: SamplingParams) -> ArrayLaw:
    """The final sampling distribution for one row of logits.

    Args:
        logits: (n_vocab,) raw float32 logits (a view is fine; it is not modified).
        history: every token before this position (prompt + output, drafts accepted so far included).
        params: the shared transform settings; temperature 0 gives a one-hot at the argmax.

    Returns:
        The law a token at this position is drawn from.
    """
    if params.greedy:
        return ArrayLaw.one_hot(greedy_token(logits, history, params))
    row = _as_row(logits)
    pen_ids, pen_values = _penalties(row, history, params)
    n_vocab = row.shape[0]
    if 0 < params.top_k < n_vocab:
        # The top_k largest after penalties lie among the top_k + len(pen_ids) largest raw values ∪ pen_ids.
        need = min(n_vocab, params.top_k + len(pen_ids))
        blocks = _Blocks(row, need)
        ids, values = _values(row, blocks.above(blocks.lower_bound(need)), pen_ids, pen_values)
        return _top_k_law(ids, values, params)
    if params.min_p == 0 and params.top_p == 1:
        return _softmax(row, pen_ids, pen_values, params.temperature)
    blocks = _Blocks(row)
    # A lower bound of the penalised row's maximum: the best unpenalised value is among the len(pen_ids) + 1
    # largest raw values (when any token is unpenalised), and each penalised value is a candidate.
    best_raw = blocks.lower_bound(len(pen_ids) + 1) if len(pen_ids) < n_vocab else -math.inf
    if pen_ids.size:
        best_raw = max(best_raw, float(pen_values.max()))
    mass = _RowMass(row, pen_ids, pen_values, params.temperature)
    windows = (
        [-params.temperature * math.log(params.min_p)]
        if params.min_p > 0
        else [w * params.temperature for w in _WINDOWS]
    )
    for width in windows:
        threshold = best_raw - width - _CUT_MARGIN
        ids, values = _values(row, blocks.above(threshold), pen_ids, pen_values)
        # Exactly the tokens whose penalised value reaches the threshold: a prefix of the row in sorted order.
        level = values >= threshold
        ids, values = ids[level], values[level]
        order = np.argsort(-values, kind="stable")
        dist = _cut(ids[order], values[order], params, mass)
        if dist is not None:
            return dist
    return _softmax(row, pen_ids, pen_values, params.temperature, top_p=params.top_p)


def _top_k_law(ids: np.ndarray, values: np.ndarray, params: SamplingParams) -> ArrayLaw:
    """Top-k, then top-p and min-p over the top-k set (what it is normalised over), on candidates `ids` (ascending)
    and their penalised values.

    In Python floats: for a few dozen candidates that is cheaper than the dozen numpy calls `_cut` makes, each of
    which costs more right after a decode than warm (docs/benchmarks.md "Where the Python time goes").
    """
    ranked = sorted(zip(values.tolist(), ids.tolist()), key=lambda c: -c[0])[: params.top_k]  # ties: lower id first
    temperature = params.temperature
    best = ranked[0][0] / temperature
    weights = [math.exp(value / temperature - best) for value, _ in ranked]  # the best has weight 1
    keep = len(weights)
    if params.min_p > 0.0:
        keep = sum(1 for w in weights if w >= params.min_p)  # weights fall: a prefix
    if params.top_p < 1.0 and keep > 1:
        cdf = list(accumulate(weights))
        reach = params.top_p * cdf[-1]
        keep = min(keep, next((i for i, c in enumerate(cdf) if c >= reach), len(cdf) - 1) + 1)
    kept = sorted((token, w) for (_, token), w in zip(ranked[:keep], weights))
    norm = math.fsum(w for _, w in kept)
    return ArrayLaw(np.array([t for t, _ in kept], dtype=np.int64), np.array([w / norm for _, w in kept]))


class _RowMass:
    """Σ exp((v − m)/T) over the whole penalised row, m its maximum: what top-p without top-k divides by."""

    def __init__(self, row: np.ndarray, pen_ids: np.ndarray, pen_values: np.ndarray, temperature: float) -> None:
        self.row, self.pen_ids, self.pen_values, self.temperature = row, pen_ids, pen_values, temperature
        self._cache: dict[tuple[float, bool], float] = {}

    def __call__(self, best: float, *, precise: bool = False) -> float:
        key = (best, precise)
        if key not in self._cache:
            row = self.row.astype(np.float64 if precise else np.float32)  # a copy, penalised in place
            row[self.pen_ids] = self.pen_values
            total = float(np.exp((row - best) * (1.0 / self.temperature)).sum(dtype=np.float64))
            self._cache[key] = total
        return self._cache[key]


def _cut(ids: np.ndarray, values: np.ndarray, params: SamplingParams, mass: _RowMass) -> ArrayLaw | None:
    """Top-p, then min-p, without top-k, on candidates sorted best first: a prefix of the penalised row in sorted
    order, whose total `mass` gives. None when top-p reaches past them. (With top-k: `_top_k_law`.)
    """
    scaled = values.astype(np.float64) / params.temperature
    weights = np.exp(scaled - scaled[0])  # (m,) relative to the best, which has weight 1
    keep = len(weights)
    if params.min_p > 0.0:
        keep = int(np.count_nonzero(weights >= params.min_p))
    if params.top_p < 1.0 and keep > 1:
        cum = np.cumsum(weights)
        # With min-p on, every token outside the candidates fails min-p, and the row's mass is at least
        # cum[-1]: a cut past keep - 2 under that bound is no cut at all. Without min-p, look at the mass.
        if params.min_p == 0.0 or cum[keep - 2] >= params.top_p * cum[-1]:
            total = mass(float(values[0]))
            near = np.abs(cum - params.top_p * total) <= _MASS_TOLERANCE * total
            if near[:keep].any():
                total = mass(float(values[0]), precise=True)
            cut = int(np.searchsorted(cum, params.top_p * total, side="left"))
            if cut >= len(cum) and keep == len(cum) and params.min_p == 0.0:
                return None  # top-p reaches past these candidates: widen the window
            keep = min(keep, cut + 1)
    ids, weights = ids[:keep], weights[:keep]
    order = np.argsort(ids)
    return ArrayLaw(ids[order], weights[order] / weights.sum())


def _softmax(
    row: np.ndarray, pen_ids: np.ndarray, pen_values: np.ndarray, temperature: float, top_p: float = 1.0
) -> ArrayLaw:
    """The law over the whole vocabulary in float64 (no filter, or a top-p wider than every window)."""
    scaled = row.astype(np.float64)
    scaled[pen_ids] = pen_values
    scaled /= temperature
    best = scaled.max()
    _check_finite(best)
    weights = np.exp(scaled - best)
    ids = np.arange(row.shape[0], dtype=np.int64)
    if top_p < 1.0:  # the rare wide top-p: a full sort, once
        order = np.argsort(-scaled, kind="stable")
        cum = np.cumsum(weights[order])
        keep = int(np.searchsorted(cum, top_p * cum[-1], side="left")) + 1
        ids = np.sort(order[:keep])
        weights = weights[ids]
    return ArrayLaw(ids, weights / weights.sum())


def top_probability(logits: np.ndarray) -> float:
    """Softmax probability of the argmax at temperature 1 (the draft's confidence, for p_min)."""
    row = _as_row(logits)
    m = row.max()
    _check_finite(m)
    return 1.0 / float(np.exp(row - m).sum(dtype=np.float64))
