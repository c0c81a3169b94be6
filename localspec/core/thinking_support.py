"""What a reasoning model does about thinking (DESIGN §10), and which choice of the switch wins.

`detect` reads a model's thinking markers (one vocabulary token each, as Qwen3's `<think>`, or the chat template's
text) and the switch its template offers (`enable_thinking`): a `ThinkingSupport`. A thinking choice can be made in
several places — an API request, `serve --think`, `--think`, a pair's `thinking` — and `THINK_SOURCES` is the one
table of their precedence and of how the user wrote each; `choose_thinking` applies it and refuses, in the user's
words, a choice the model cannot follow. Splitting a streamed answer into its parts is core/thinking.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from localspec.errors import InvalidParamsError
from localspec.llama.model import Model
from localspec.llama.templates import template_variables


@dataclass(frozen=True, slots=True)
class Markers:
    """The text that opens and closes a thinking span."""

    start: str
    end: str


# Qwen3, DeepSeek-R1 and their fine-tunes, Granite; Magistral; Seed-OSS; Kimi.
KNOWN_MARKERS = (
    Markers("<think>", "</think>"),
    Markers("[THINK]", "[/THINK]"),
    Markers("<seed:think>", "</seed:think>"),
    Markers("\u25c1think\u25b7", "\u25c1/think\u25b7"),
)
# Template variables that turn thinking on or off: Qwen3, SmolLM3, GLM (`enable_thinking`); DeepSeek V3.1 (`thinking`).
SWITCHES = ("enable_thinking", "thinking")


@dataclass(frozen=True, slots=True)
class ThinkingSupport:
    """What a loaded model does about thinking: its markers (None: it does not think) and its template's switch."""

    markers: Markers | None = None
    switch: str | None = None  # the template variable that turns thinking on and off, or None
    reasoning_field: bool = False  # the template reads an assistant message's `reasoning_content`
    found_in: str = ""  # "vocabulary" or "template": where the markers were found

    @property
    def thinks(self) -> bool:
        return self.markers is not None

    @property
    def can_switch(self) -> bool:
        return self.switch is not None

    def describe(self) -> str:
        """A few words for the settings screen: what this model's thinking does and whether it can be switched."""
        if self.can_switch:
            return f"on or off ({self.switch})"
        if self.thinks:
            return "always on (no switch in its template)"
        return "none (this model does not think)"

    def check(self, think: bool | None, model: str, setting: str = "") -> None:
        """Refuse a thinking choice the model cannot follow.

        Args:
            think: True, False, or None (the model's default: always fine).
            model: the model's name, for the message.
            setting: how the user asked for it, for the message (default "--think on" / "--think off").

        Raises:
            InvalidParamsError: "off" for a template without a switch; "on" for a model that does not think ("off"
                is what that model does anyway: accepted).
        """
        if think is None or self.can_switch:
            return
        setting = setting or f"--think {'on' if think else 'off'}"
        if not think and self.thinks:
            raise InvalidParamsError(
                f"{model} always thinks: its chat template has no thinking switch ({SWITCHES[0]}), "
                f"so {setting} cannot be followed; remove it"
            )
        if think and not self.thinks:  # "off" is what such a model does anyway (clients send it to every model)
            raise InvalidParamsError(
                f"{model} does not think (no <think> markers in its vocabulary or chat template), "
                f"so {setting} cannot be followed; remove it"
            )

    def variables(self, think: bool | None) -> dict[str, bool]:
        """The template variables that carry `think` (none for the model's default or a template without a switch)."""
        return {self.switch: think} if think is not None and self.switch is not None else {}


# Where a thinking choice can be made, most specific first (the order `choose_thinking` applies), and how the user
# wrote it there: {on_off} is "on" or "off", {true_false} "true" or "false", {pair} the pair's name.
THINK_SOURCES = {
    "request": "chat_template_kwargs.enable_thinking = {true_false}",
    "serve": "serve --think {on_off}",
    "flag": "--think {on_off}",
    "pair": "`thinking = {true_false}` of pair {pair!r} in models.toml",
}


@dataclass(frozen=True, slots=True)
class ThinkChoice:
    """A thinking choice, where it was made (one of THINK_SOURCES) and how, in the user's words ("--think off")."""

    think: bool
    source: str
    setting: str


def thinking_choice(think: bool | None, source: str, pair: str = "") -> ThinkChoice | None:
    """`think` as chosen through `source` (one of THINK_SOURCES; `pair` names the pair for "pair"), or None when
    nothing was chosen there."""
    if think is None:
        return None
    on_off, true_false = ("on" if think else "off"), str(think).lower()
    return ThinkChoice(think, source, THINK_SOURCES[source].format(on_off=on_off, true_false=true_false, pair=pair))


def choose_thinking(support: ThinkingSupport, model: str, *choices: ThinkChoice | None) -> bool | None:
    """The thinking switch of one answer: of the choices made, the one whose source comes first in THINK_SOURCES (an
    API request's or the chat's own, then --think or serve --think, then the pair's `thinking`); None (the model
    decides) when none was.

    Raises:
        InvalidParamsError: the model cannot follow that choice (the message names the setting it came from).
    """
    made = [c for c in choices if c is not None]
    if not made:
        return None
    order = list(THINK_SOURCES)
    choice = min(made, key=lambda c: order.index(c.source))
    support.check(choice.think, model, choice.setting)
    return choice.think


def detect(model: Model, template: str | None) -> ThinkingSupport:
    """Find a model's thinking markers and its template's switch.

    Args:
        model: the loaded target (its vocabulary is searched for the markers as single tokens).
        template: its Jinja chat template, or None (a built-in template by name: no switch).
    """
    variables = template_variables(template) if template else frozenset()
    switch = next((name for name in SWITCHES if name in variables), None)
    markers, found_in = None, ""
    for pair in KNOWN_MARKERS:
        if _one_token(model, pair.start) and _one_token(model, pair.end):
            markers, found_in = pair, "vocabulary"
            break
    else:
        for pair in KNOWN_MARKERS:
            if template and pair.start in template and pair.end in template:
                markers, found_in = pair, "template"
                break
    reasoning_field = bool(template) and "reasoning_content" in (template or "")
    return ThinkingSupport(markers, switch, reasoning_field, found_in)


def _one_token(model: Model, text: str) -> bool:
    tokens = model.tokenize(text, parse_special=True)
    return len(tokens) == 1 and model.token_text(tokens[0]) == text
