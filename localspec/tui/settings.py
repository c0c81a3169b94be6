"""What the chat app was asked to load, and the generation settings a user can change while chatting.

`ChatOptions` is built once from the command line (or by a test) and names the models and the files the
app uses. `ChatSettings` holds the sampling, speculation and drafter choices and the chat's thinking switch; the
settings screen edits it and the app applies it from the next message. Neither knows about Textual.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from localspec.core.options import options_of
from localspec.core.params import DEFAULT_MAX_TOKENS, DRAFTERS, PairDefaults, SpeculativeParams
from localspec.core.sampling import SamplingParams
from localspec.errors import InvalidParamsError
from localspec.models.flags import RunFlags
from localspec.models.loading import sampling_params, speculative_params
from localspec.paths import Paths, get_paths

from .mcp_client import McpConfig

__all__ = ["DRAFTERS", "FORM_FIELDS", "THINK_CHOICES", "ChatOptions", "ChatSettings"]

THINK_CHOICES = {"default": None, "on": True, "off": False}  # the settings form's thinking values

# The settings form's text fields: the option table's form fields (sampling, then speculation), and max tokens.
_SAMPLING_FORM = tuple(o for o in options_of(SamplingParams) if o.form)
_SPECULATIVE_FORM = tuple(o for o in options_of(SpeculativeParams) if o.form)
FORM_FIELDS = (
    *((o.name, o.form) for o in _SAMPLING_FORM),
    ("max_tokens", "max tokens"),
    *((o.name, o.form) for o in _SPECULATIVE_FORM),
)


@dataclass(frozen=True)
class ChatOptions(RunFlags):
    """Everything `localspec chat` was told: the run flags (which models, which settings to override) and what the
    app alone sets (where files go, test knobs)."""

    paths: Paths = field(default_factory=get_paths)  # localspec's folders (the CLI passes main's)
    bundled_config: Path | None = None  # another bundled models.toml (tests); None: the package's
    db_path: Path | None = None  # None: paths.db_path
    export_dir: Path | None = None  # None: the current directory
    cursor_blink: bool = True  # tests and snapshots turn it off
    stats_interval: float = 0.5  # seconds between stats panel refreshes while generating
    # the shortest time between streamed text updates (the worker batches tokens; the screen's `FrameBudget` spaces
    # them further on a CPU where drawing would take too much from the models)
    stream_interval: float = 1 / 30
    mcp: McpConfig | None = None  # the MCP servers (mcp.toml and --mcp; `mcp_config`): None, none


@dataclass(frozen=True)
class ChatSettings:
    """How answers are generated; a new value applies from the next message."""

    sampling: SamplingParams = SamplingParams()
    spec: SpeculativeParams = SpeculativeParams()
    drafter: str = "model"  # one of DRAFTERS; "model" and "model+ngram" need a draft file
    max_tokens: int = DEFAULT_MAX_TOKENS
    think: bool | None = None  # this chat's thinking switch; None: the pair's (or --think), else the model's own

    @classmethod
    def initial(cls, options: ChatOptions, defaults: PairDefaults, drafter: str) -> ChatSettings:
        """Command-line flags over the pair's defaults over the engine's defaults."""
        return cls(
            sampling=sampling_params(options.overrides, defaults),
            spec=speculative_params(options.overrides, defaults),
            drafter=drafter,
            max_tokens=options.max_tokens,
        )

    def with_values(self, values: Mapping[str, str]) -> ChatSettings:
        """A copy with fields set from the settings form's text values.

        Raises:
            InvalidParamsError: a value is not a number, or out of range (one line naming the field).
        """
        sampling = dataclasses.replace(
            self.sampling, **{o.name: _number(values, o.name, o.kind) for o in _SAMPLING_FORM}
        )
        spec = dataclasses.replace(
            self.spec,
            **{o.name: _number(values, o.name, o.kind) for o in _SPECULATIVE_FORM},
            verify=values["verify"],
            adaptive=values["adaptive"] == "on",
        )
        drafter = values["drafter"]
        if drafter not in DRAFTERS:
            raise InvalidParamsError(f"unknown drafter {drafter!r}: use {' or '.join(DRAFTERS)}")
        max_tokens = _number(values, "max_tokens", int)
        if max_tokens < 1:
            raise InvalidParamsError("invalid setting: max tokens must be at least 1")
        think = self.think  # a model whose template cannot switch has no such field in the form
        if "think" in values:
            if values["think"] not in THINK_CHOICES:
                raise InvalidParamsError(f"invalid setting: thinking must be one of {', '.join(THINK_CHOICES)}")
            think = THINK_CHOICES[values["think"]]
        return ChatSettings(sampling=sampling, spec=spec, drafter=drafter, max_tokens=max_tokens, think=think)

    def form_values(self) -> dict[str, str]:
        """The fields the settings form shows, as text."""
        numbers = [(o, getattr(self.sampling, o.name)) for o in _SAMPLING_FORM]
        numbers += [(o, getattr(self.spec, o.name)) for o in _SPECULATIVE_FORM]
        return {
            **{o.name: f"{value:g}" if o.kind is float else str(value) for o, value in numbers},
            "verify": self.spec.verify,
            "adaptive": "on" if self.spec.adaptive else "off",
            "drafter": self.drafter,
            "max_tokens": str(self.max_tokens),
            "think": next(name for name, value in THINK_CHOICES.items() if value is self.think),
        }


def _number(values: Mapping[str, str], name: str, kind: type):
    text = values[name].strip()
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise InvalidParamsError(f"invalid setting: {name.replace('_', '-')} must be {what}, not {text!r}") from None
