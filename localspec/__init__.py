"""localspec: local chat with exact speculative decoding on llama.cpp.

Layers, each a folder that says what it owns: `llama` (every native call) ← `core` (the engine) ← `models`
(pairs on disk) ← `bench` (speed measured side by side), `tui` (the chat app), `server` (the OpenAI-compatible
HTTP API) ← `cli` ← `__main__`; `errors`, `paths` and `progress` (the stderr progress line) are leaves.

The public Python API is these names (`__all__`; docs/python-api.md shows them at work): `load` a pair of
models.toml as an `Engine` (or `Engine.load` two files), talk to it through a `ChatSession` of `Message`s, steer it
with `LoadParams`, `SamplingParams` and `SpeculativeParams`, and catch `LocalspecError`, the one family of errors a
user can see. Each is imported on first use, so importing the package does no work and loads neither llama.cpp nor
numpy; the package top imports only `core`, `models` and `errors`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # the same names as _API below (a test holds them equal), for type checkers and the layer rules
    from localspec.core.engine import Engine
    from localspec.core.params import LoadParams, SpeculativeParams
    from localspec.core.sampling import SamplingParams
    from localspec.core.session import ChatSession, Message
    from localspec.errors import LocalspecError
    from localspec.models.loading import load_pair as load

_API: dict[str, tuple[str, str]] = {  # public name → (module, its name there)
    "ChatSession": ("localspec.core.session", "ChatSession"),
    "Engine": ("localspec.core.engine", "Engine"),
    "LoadParams": ("localspec.core.params", "LoadParams"),
    "LocalspecError": ("localspec.errors", "LocalspecError"),
    "Message": ("localspec.core.session", "Message"),
    "SamplingParams": ("localspec.core.sampling", "SamplingParams"),
    "SpeculativeParams": ("localspec.core.params", "SpeculativeParams"),
    "load": ("localspec.models.loading", "load_pair"),
}

__all__ = [  # _API's names, written out so that linters and readers see them (a test holds them equal)
    "ChatSession",
    "Engine",
    "LoadParams",
    "LocalspecError",
    "Message",
    "SamplingParams",
    "SpeculativeParams",
    "load",
]


def __getattr__(name: str) -> Any:
    """Import a public name on its first use (PEP 562), then keep it as a plain attribute."""
    if name not in _API:
        raise AttributeError(f"module 'localspec' has no attribute {name!r}")
    module, attribute = _API[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
