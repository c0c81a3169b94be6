"""`FixedCosts`: a shared batch's decode costs held fixed, whatever this machine measures (tests of `serve --parallel`'s
slots: what the steps do with drafts decoded in the shared batch, not when they pay)."""

from __future__ import annotations

from localspec.core.batchdraft import DecodeCosts


class FixedCosts(DecodeCosts):
    """GPU-like costs (by default a pass 10 ms, a row 0.2 ms), kept whatever this machine measures."""

    def __init__(self, per_pass: float = 0.010, per_row: float = 0.0002) -> None:
        super().__init__()
        super().observe(1, 1, per_pass + per_row)
        super().observe(1, 3, per_pass + 3 * per_row)

    def observe(self, passes: int, rows: int, seconds: float) -> None:
        pass
