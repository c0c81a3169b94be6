"""The options a user sets by name, declared once on the params dataclasses' fields and read everywhere.

A field of `SamplingParams` or `SpeculativeParams` becomes a user option by carrying `option(...)` metadata:
its help, whether a models.toml pair may set it, and its label in the chat's settings form. The command-line
flags, models.toml's schema checks, the settings form and the argument checks all iterate `options_of`, so
adding an option is one field. Fields without the metadata are internal.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

_KEY = "localspec.option"


@dataclass(frozen=True, slots=True)
class Option:
    """One user option: a command-line flag, maybe a models.toml pair key, maybe a settings-form field."""

    name: str  # the params field; the flag is --name-with-dashes
    kind: type  # int, float, str or bool (a bool option defaults on; its flag is --no-NAME)
    default: Any
    help: str
    choices: tuple[str, ...] = ()  # the values the command line accepts (empty: any of `kind`)
    pair: bool = False  # a models.toml pair may set it as a default
    form: str = ""  # its label in the chat's settings form ("": not in the form)

    @property
    def flag(self) -> str:
        return ("--no-" if self.kind is bool else "--") + self.name.replace("_", "-")


def option(
    help: str, *, kind: type | None = None, choices: tuple[str, ...] = (), pair: bool = False, form: str = ""
) -> dict[str, Any]:
    """Field metadata that makes a params field a user option (`kind`: only where the default is None)."""
    return {_KEY: {"help": help, "kind": kind, "choices": choices, "pair": pair, "form": form}}


def options_of(*owners: type) -> tuple[Option, ...]:
    """The user options of params dataclasses, in field order."""
    found = []
    for owner in owners:
        for f in dataclasses.fields(owner):
            meta = f.metadata.get(_KEY)
            if meta is not None:
                kind = meta["kind"] or type(f.default)
                found.append(Option(f.name, kind, f.default, meta["help"], meta["choices"], meta["pair"], meta["form"]))
    return tuple(found)
