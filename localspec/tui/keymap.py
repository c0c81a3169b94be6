"""The user's keys: a `[keys]` table in `chat.toml` of localspec's config folder, binding id = "keys".

Every binding of the chat has an id; Textual 8.2 puts the keys of a keymap (`App.set_keymap`) in place of a binding's
own, by id. This module reads the table and checks it against the ids the app binds, so that a bad entry — an
unknown id, a value that is not keys, a key Textual has no name for — is one warning line and is skipped, and a file
that cannot be read is one line and changes no key; nothing here can stop the chat from starting.
"""

from __future__ import annotations

import logging
import tomllib
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path

from textual.binding import Binding
from textual.keys import Keys

log = logging.getLogger(__name__)

KEYS_FILE = "chat.toml"  # in the config folder (`Paths.config_dir`), beside models.toml
MODIFIERS = frozenset({"ctrl", "shift", "alt", "meta", "super", "hyper"})
_NAMED = frozenset(key.value.rsplit("+", 1)[-1] for key in Keys) | {"space", "enter", "tab", "backspace"}


def bound_ids(groups: Iterable[Iterable[Binding]]) -> list[dict[str, str]]:
    """Each group's (a class's BINDINGS) ids with their default keys; bindings without an id are left out."""
    return [{b.id: b.key for b in group if isinstance(b, Binding) and b.id} for group in groups]


def _known_key(key: str) -> bool:
    """Whether Textual can name `key` ("ctrl+f", "f9", "question_mark", "?")."""
    *modifiers, base = key.split("+")
    if not base or any(m not in MODIFIERS for m in modifiers):
        return False
    if len(base) == 1 or base in _NAMED:
        return True
    try:  # Textual names a printable key by its Unicode name: "question_mark", "full_stop"
        unicodedata.lookup(base.replace("_", " ").upper())
    except KeyError:
        return False
    return True


def _keys_of(value: object) -> str | None:
    """The keys of one entry as Textual's comma-separated string, or None when it is not keys."""
    if isinstance(value, str):
        keys = [k.strip() for k in value.split(",")]
    elif isinstance(value, list) and all(isinstance(k, str) for k in value):
        keys = [k.strip() for k in value]
    else:
        return None
    if not keys or not all(keys) or not all(_known_key(k) for k in keys):
        return None
    return ",".join(keys)


def load_keymap(path: Path, groups: list[dict[str, str]]) -> tuple[dict[str, str], list[str]]:
    """Read the `[keys]` table of `path` (a missing file is no keymap).

    Args:
        path: the user's chat.toml.
        groups: the ids the app binds with their default keys, one dict per class (see `bound_ids`).

    Returns:
        (the keymap to hand to `App.set_keymap`, one warning line per entry left out or key taken).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, []
    except (OSError, UnicodeDecodeError) as e:
        return {}, [f"{path}: cannot be read ({e}); the chat uses its own keys"]
    try:
        table = tomllib.loads(text).get("keys", {})
    except tomllib.TOMLDecodeError as e:
        return {}, [f"{path} is not valid TOML ({e}); the chat uses its own keys"]
    if not isinstance(table, dict):
        return {}, [f'{path}: [keys] must be a table of binding id = "keys"; the chat uses its own keys']
    known = {name: keys for group in groups for name, keys in group.items()}
    keymap: dict[str, str] = {}
    warnings: list[str] = []
    for name, value in table.items():
        keys = _keys_of(value)
        if name not in known:
            warnings.append(f"{path}: no binding has the id {name!r} (ids: {', '.join(sorted(known))}); skipped")
        elif keys is None:
            warnings.append(f'{path}: {name} = {value!r} is not keys like "ctrl+f" or "f9,ctrl+b"; keeps {known[name]}')
        else:
            keymap[name] = keys
    warnings += _taken(keymap, groups, path)
    for line in warnings:
        log.warning("%s", line)
    return keymap, warnings


def _taken(keymap: Mapping[str, str], groups: list[dict[str, str]], path: Path) -> list[str]:
    """A line for each key the keymap gives a binding that another binding of the same class had (Textual gives it
    to the keymap's binding: the other loses that key)."""
    lines = []
    for group in groups:
        for name, keys in keymap.items():
            if name not in group:
                continue
            for other, default in group.items():
                if other == name or other in keymap:
                    continue
                shared = set(keys.split(",")) & {k.strip() for k in default.split(",")}
                if shared:
                    lines.append(f"{path}: {name} takes {', '.join(sorted(shared))} from {other}")
    return lines
