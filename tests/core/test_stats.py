"""`Stats`: a session total is the sum of its generations, field by field, whatever fields it grows."""

from __future__ import annotations

from dataclasses import fields

from localspec.core.stats import Decision, Stats


def filled(seed: int) -> Stats:
    """A Stats whose every field holds a value of its own, different per field and per `seed`."""
    stats = Stats()
    for i, f in enumerate(fields(Stats), start=1):
        value = getattr(stats, f.name)
        if isinstance(value, list):
            setattr(stats, f.name, [seed * 100 + i, seed * 100 + i + 1][: 1 + seed % 2])
        elif isinstance(value, Decision):
            setattr(stats, f.name, Decision(alpha=seed / 10))
        elif isinstance(value, str):
            setattr(stats, f.name, f"reason {seed}")
        else:
            setattr(stats, f.name, type(value)(seed * 100 + i))
    return stats


def test_merge_adds_every_count_and_time_and_keeps_the_latest_choice():
    total, first, second = filled(1), filled(1), filled(2)
    total.merge(second)
    for f in fields(Stats):
        mine, a, b = getattr(total, f.name), getattr(first, f.name), getattr(second, f.name)
        if f.name in ("drafter", "draft_length", "speculation_off", "decision"):  # what the latest step chose
            assert mine == b, f.name
        elif isinstance(a, list):  # position by position, the shorter list padded with zeros
            assert (
                mine == [x + y for x, y in zip(a + [0] * len(b), b + [0] * len(a), strict=False)][: max(len(a), len(b))]
            ), f.name
        else:
            assert mine == a + b, f.name


def test_the_json_has_every_counter_and_every_derived_rate():
    stats = filled(1)
    out = stats.to_dict()
    rates = [name for name, value in vars(Stats).items() if isinstance(value, property)]
    assert {"acceptance_rate", "alpha", "tokens_per_second", "python_per_verify_step"} <= set(rates)
    assert set(out) == {f.name for f in fields(Stats)} | set(rates)
    assert all(out[name] == getattr(stats, name) for name in rates) and out["decision"]["alpha"] == 0.1
