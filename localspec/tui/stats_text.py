"""The stats panel's text: this answer's numbers, its time split, acceptance by draft position, the session.

`render_stats` draws a `StatsView` (live.py) as one Rich `Text`; the panel (widgets.StatsPanel) shows it without a
layout, so a redraw costs only the panel. The draft tokens' colour is here too, for the legend and the answers.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text

from localspec.core.stats import Stats
from localspec.core.thinking import ANSWER, THINKING, PartStats

from .live import Chunk, StatsView

BAR_WIDTH = 12
DRAFT_STYLE = "bold green"  # tokens the draft proposed and the target accepted
TARGET_STYLE = ""  # tokens the target produced itself


def stats_view(chat, live: Chunk | None, *, provenance: bool) -> StatsView:
    """What the panel shows of `chat` (a `Conversation`): the answer being generated (its last chunk, `live`) or
    else the last answer, and the session."""
    turn = live.stats if live else chat.last_turn
    return StatsView(
        turn=turn,
        session=chat.session_stats,
        turns=chat.answers,
        tokens_per_second_now=live.tokens_per_second_now if live else 0.0,
        tokens_per_second_turn=(live.tokens_per_second_turn if live else turn.tokens_per_second if turn else 0.0),
        generating=live is not None,
        drafter=chat.settings.drafter,
        drafts=chat.loaded.engine.drafter.drafts if chat.loaded else True,
        draft_max=chat.settings.spec.draft_max,
        adaptive=chat.settings.spec.adaptive,
        provenance=provenance,
        drafting_note=chat.loaded.engine.drafting_note if chat.loaded else "",
        parts=live.parts if live else chat.last_parts,
    )


def _bar(fraction: float, width: int = BAR_WIDTH) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * filled + "░" * (width - filled)


def _usual_draft_length(turn: Stats) -> int:
    """The draft length most steps used (k ≥ 1), else the longest one drafted."""
    counts = [(n, k) for k, n in enumerate(turn.steps_by_draft_length) if k >= 1 and n]
    return max(counts)[1] if counts else len(turn.drafted_by_position) or turn.draft_length


def _speculation_line(view: StatsView) -> tuple[str, str, str]:
    """(verdict, why it is off or "", style) for the speculation row."""
    turn = view.turn
    if not view.drafts:
        return "off", "no drafter", "yellow"
    if turn is not None and turn.target_passes:
        if turn.speculation_off:
            return "off", turn.speculation_off, "yellow"
        k = turn.draft_length if view.generating else _usual_draft_length(turn)
        return f"on, draft length {k}", "", "green"
    if view.draft_max == 0:
        return "off", "draft max is 0", "yellow"
    return f"on, draft length ≤ {view.draft_max}", "", "green"


def _row(text: Text, label: str, value: str, style: str = "") -> None:
    text.append(label + " " * max(1, 14 - cell_len(label)), "dim")
    text.append(value + "\n", style)


def render_stats(view: StatsView) -> Text:
    """The stats panel: this answer's numbers, time split, acceptance by draft position, the session."""
    text = Text()
    text.append("this answer" + (" (live)" if view.generating else "") + "\n", "bold")
    verdict, why, style = _speculation_line(view)
    if len(why) > 20:  # a long reason (the adaptive policy explains itself) goes on its own line
        _row(text, "speculation", verdict, style)
        text.append(f"  {why}\n", "dim")
    else:
        _row(text, "speculation", f"{verdict} ({why})" if why else verdict, style)
    _row(text, "drafter", view.drafter)  # "model+ngram" and a max on one row wrapped in the panel's width
    _row(text, "draft length", (f"adaptive ≤ {view.draft_max}" if view.adaptive else f"fixed {view.draft_max}"))
    if view.drafting_note and view.drafts:
        text.append(f"  {view.drafting_note}\n", "dim")
    turn = view.turn or Stats()
    if turn.drafted:
        _row(text, "acceptance", f"{turn.acceptance_rate:.0%} ({turn.accepted}/{turn.drafted})", "bold")
    else:
        _row(text, "acceptance", "–")
    _row(text, "α per token", f"{turn.alpha:.2f}" if turn.drafted else "–")
    _row(text, "tokens/pass", f"{turn.mean_tokens_per_pass:.2f}" if turn.target_passes else "–")
    _row(text, "tok/s now", f"{view.tokens_per_second_now:.1f}" if view.generating else "–")
    _row(text, "tok/s turn", f"{view.tokens_per_second_turn:.1f}" if turn.emitted else "–")
    _row(text, "tokens", f"{turn.emitted} in {turn.target_passes} passes")
    _parts_lines(text, view.parts)
    decision = turn.decision
    if view.adaptive and decision.predicted_speedup > 0:  # what the adaptive policy decides from
        _row(text, "c · v(k) · α̂", f"{decision.draft_cost:.2f} · {decision.verify_cost:.2f} · {decision.alpha:.2f}")
        measured = f"{decision.measured_speedup:.2f}×" if decision.measured_speedup else "–"
        _row(text, "speed-up", f"{decision.predicted_speedup:.2f}× pred, {measured} real")
    _time_split(text, turn)
    text.append("\nacceptance by draft position\n", "bold")
    rates = turn.acceptance_by_position
    if not rates:
        text.append("  nothing drafted yet\n", "dim")
    for i, rate in enumerate(rates, start=1):
        text.append(f"{i:>3} ")
        text.append(_bar(rate), "green")
        text.append(f" {rate:>4.0%}\n")
    _session_lines(text, view)
    if view.provenance:
        text.append("\n■ draft token", DRAFT_STYLE)
        text.append("  ■ target token\n")
    return text


def _parts_lines(text: Text, parts: dict[str, PartStats] | None) -> None:
    """Thinking and answer side by side, for an answer that thought (DESIGN §10)."""
    if not parts or not parts[THINKING].tokens:
        return
    thinking, answer = parts[THINKING], parts[ANSWER]

    def both(value) -> str:
        return f"{value(thinking):>8} {value(answer):>8}"

    text.append("\n" + " " * 14 + f"{'thinking':>8} {'answer':>8}\n", "bold")
    _row(text, "tokens", both(lambda p: str(p.tokens)))
    _row(text, "acceptance", both(lambda p: f"{p.acceptance_rate:.0%}" if p.drafted else "–"))
    _row(text, "tokens/pass", both(lambda p: f"{p.tokens_per_pass:.2f}" if p.passes else "–"))


def _time_split(text: Text, turn: Stats) -> None:
    parts = {
        "draft": turn.seconds_draft,
        "verify": turn.seconds_verify,
        "sample": turn.seconds_sampling,
        "other": turn.seconds_other,
    }
    total = sum(parts.values())
    text.append("\ntime split\n", "bold")
    if total <= 0:
        text.append("  nothing timed yet\n", "dim")
        return
    for name, seconds in parts.items():
        text.append(f"  {name:<7}")
        text.append(_bar(seconds / total), "cyan")
        text.append(f" {seconds / total:>4.0%}\n")


def _session_lines(text: Text, view: StatsView) -> None:
    session = view.session
    text.append("\nsession\n", "bold")
    if not view.turns:
        text.append("  no answers yet\n", "dim")
        return
    _row(text, "answers", str(view.turns))
    _row(text, "acceptance", f"{session.acceptance_rate:.0%}" if session.drafted else "–")
    _row(text, "tokens/pass", f"{session.mean_tokens_per_pass:.2f}" if session.target_passes else "–")
    _row(text, "tok/s", f"{session.tokens_per_second:.1f}")
