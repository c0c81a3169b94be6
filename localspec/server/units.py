"""Durations and memory sizes as `serve`'s flags and a request's `keep_alive` write them (Ollama's forms)."""

from __future__ import annotations

import math
import re

from localspec.errors import InvalidParamsError

FOREVER = math.inf
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "ms": 0.001}
_SIZES = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_duration(value: object) -> float:
    """Ollama's keep_alive: seconds as a number, or "30s", "5m", "1h", "1h30m"; negative: forever; 0: at once.

    Raises:
        InvalidParamsError: not a duration, or not a finite one (NaN, an infinity, a number too large for a float).
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidParamsError(f"keep-alive {_shown(value)} is not a duration: use seconds, or e.g. 30s, 5m, 1h")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an integer past a float's range (10**400)
            seconds = math.nan
    else:
        text = value.strip().lower()
        parts = re.findall(r"(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|d|)", text)
        if not text or "".join(n + u for n, u in parts) != text.replace(" ", ""):
            raise InvalidParamsError(f"keep-alive {_shown(value)} is not a duration: use seconds, or e.g. 30s, 5m, 1h")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(seconds):
        raise InvalidParamsError(
            f"keep-alive {_shown(value)} is not a finite number of seconds: use e.g. 300 or 5m, or -1 to stay loaded"
        )
    return FOREVER if seconds < 0 else seconds


def _shown(value: object) -> str:
    """`value` as a message quotes it: its repr, cut short (a client may send a number of 400 digits)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


def parse_size(text: str) -> int:
    """A memory size: "8G", "512MiB", "1.5g", or bytes.

    Raises:
        InvalidParamsError: not a size.
    """
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)(?:i?b)?\s*", text.lower())
    if found is None or float(found[1]) <= 0:
        raise InvalidParamsError(f"--max-memory {text!r} is not a size: use e.g. 8G, 512M, 24GiB")
    return int(float(found[1]) * _SIZES[found[2]])


def keep_alive_value(value: object) -> float:
    """A request's `keep_alive`, for pydantic: `parse_duration`, its refusal a ValueError."""
    try:
        return parse_duration(value)
    except InvalidParamsError as e:
        raise ValueError(str(e).replace("keep-alive", "keep_alive")) from None
