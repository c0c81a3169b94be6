"""The options a user sets by name, declared once on the params dataclasses' fields and read everywhere.

A field of `SamplingParams` or `SpeculativeParams` becomes a user option by carrying `option(...)` metadata:
its help, its choices or the numbers it accepts (`Limit`), whether a models.toml pair may set it, and its label in
the chat's settings form. The command-line flags and their checks, models.toml's schema checks, the server's
request fields, the settings form and the params' own checks all read `options_of` and `limits_of`, so adding an
option is one field. A field that is no user option may still carry its `limit(...)` (a request may set it).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from localspec.errors import InvalidParamsError

_KEY = "localspec.option"
_LIMIT = "localspec.limit"


@dataclass(frozen=True, slots=True)
class Limit:
    """The numbers a field accepts: finite, from `low` (excluded when `low_open`) up to `high`; None: unbounded."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    note: str = ""  # what a special value means, said with the bound ("0 = off")

    def admits(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or value <= self.high

    def problem(self, name: str, value: float) -> str | None:
        """What is wrong with `value` for the field `name`, in the one sentence every layer says ("top-p must be in
        (0, 1] (1 = off)"), or None when it is accepted."""
        return None if self.admits(value) else f"{label(name)} must be {self.describe()}"

    def describe(self) -> str:
        """The accepted values in words: "in (0, 1] (1 = off)", "≥ 0", "a number"."""
        if self.low is None and self.high is None:
            text = "a number"
        elif self.high is None:
            text = f"{'>' if self.low_open else '≥'} {self.low:g}"
        else:
            text = f"in {'(' if self.low_open else '['}{_number(self.low)}, {_number(self.high)}]"
        return text + (f" ({self.note})" if self.note else "")


def _number(value: float | None) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


@dataclass(frozen=True, slots=True)
class Option:
    """One user option: a command-line flag, maybe a models.toml pair key, maybe a settings-form field."""

    name: str  # the params field; the flag is --name-with-dashes
    kind: type  # int, float, str or bool (a bool option defaults on; its flag is --no-NAME)
    default: Any
    help: str
    choices: tuple[str, ...] = ()  # the values a user may ask for (empty: any of `kind` within `limit`)
    pair: bool = False  # a models.toml pair may set it as a default
    form: str = ""  # its label in the chat's settings form ("": not in the form)
    limit: Limit | None = None  # the numbers it accepts (None: any of `kind`)

    @property
    def flag(self) -> str:
        return ("--no-" if self.kind is bool else "--") + self.name.replace("_", "-")


def label(name: str) -> str:
    """How messages name a field: its flag's spelling without the dashes in front ("top-p")."""
    return name.replace("_", "-")


def limit(
    low: float | None = None, high: float | None = None, *, low_open: bool = False, note: str = ""
) -> dict[str, Any]:
    """Field metadata for a field that is no user option but accepts only these numbers."""
    return {_LIMIT: Limit(low, high, low_open, note)}


def option(
    help: str,
    *,
    kind: type | None = None,
    choices: tuple[str, ...] = (),
    pair: bool = False,
    form: str = "",
    limit: Limit | None = None,
) -> dict[str, Any]:
    """Field metadata that makes a params field a user option (`kind`: only where the default is None)."""
    meta = {"help": help, "kind": kind, "choices": choices, "pair": pair, "form": form, "limit": limit}
    return {_KEY: meta, **({_LIMIT: limit} if limit is not None else {})}


def options_of(*owners: type) -> tuple[Option, ...]:
    """The user options of params dataclasses, in field order."""
    found = []
    for owner in owners:
        for f in dataclasses.fields(owner):
            meta = f.metadata.get(_KEY)
            if meta is not None:
                kind = meta["kind"] or type(f.default)
                found.append(Option(f.name, kind, f.default, **{k: v for k, v in meta.items() if k != "kind"}))
    return tuple(found)


def limits_of(*owners: type) -> dict[str, Limit]:
    """Every field of these dataclasses that accepts only some numbers (user options or not), by name."""
    return {f.name: f.metadata[_LIMIT] for owner in owners for f in dataclasses.fields(owner) if _LIMIT in f.metadata}


def check_fields(params: Any, what: str) -> None:
    """Refuse a params object with a value outside its field's limit or choices.

    Raises:
        InvalidParamsError: one line, "invalid {what} setting: top-p must be in (0, 1] (1 = off)".
    """
    owner = type(params)
    for name, bound in limits_of(owner).items():
        value = getattr(params, name)
        if value is not None and (problem := bound.problem(name, value)):
            raise InvalidParamsError(f"invalid {what} setting: {problem}")
    for opt in options_of(owner):  # a choice a user may make, or the default that means none was made
        if opt.choices and getattr(params, opt.name) not in (*opt.choices, opt.default):
            raise InvalidParamsError(
                f"invalid {what} setting: {label(opt.name)} must be one of {', '.join(opt.choices)}"
            )
