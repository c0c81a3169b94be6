"""A streamed answer split into thinking and answer (DESIGN §10), and each part's own speculation numbers.

`ThinkingSplit` follows one generation's `TokenEvent`s: `MarkerScanner` sends the text to the part it belongs to
with the markers taken out (a marker split across tokens or held back by a stop string is waited for), and each
token, draft and target pass is counted for its part (`PartStats`). A model without markers is unaffected:
everything is answer, text unchanged. Which markers a model has is core/thinking_support.py's.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import asdict, dataclass

from .engine import TokenEvent
from .stats import Stats
from .textstream import prefix_held
from .thinking_support import Markers

THINKING, ANSWER = "thinking", "answer"
PARTS = (THINKING, ANSWER)
UNDECIDED = "?"  # a token before the answer's first text: whitespace, or part of a start marker
Piece = tuple[str, str, bool]  # (part: THINKING or ANSWER, text, came from the draft)


def opened_by(markers: Markers | None, prompt_tail: str) -> bool:
    """Whether a generation prompt leaves thinking open: its last start marker comes after its last end marker."""
    if markers is None:
        return False
    return prompt_tail.rfind(markers.start) > prompt_tail.rfind(markers.end)


class MarkerScanner:
    """Text in, (part, text, tag) pieces out, the markers taken out; what could still be a marker is held back.

    States: "before" (only whitespace so far: a start marker may open thinking), THINKING (until the end marker),
    ANSWER (everything after; markers there are ordinary text). Text is pushed in tagged runs, and each piece keeps
    the tag of the run it came from (whether the draft proposed it).
    """

    def __init__(self, markers: Markers, *, thinking: bool) -> None:
        self.markers = markers
        self.state = THINKING if thinking else "before"
        self.thought = thinking  # a thinking span was opened (by the prompt or by a start marker)
        self._held: list[tuple[str, bool]] = []  # text not yet released, in tagged runs

    def push(self, text: str, tag: bool = False) -> list[Piece]:
        """Add text; return what can be released now."""
        if text and self._held and self._held[-1][1] == tag:
            self._held[-1] = (self._held[-1][0] + text, tag)
        elif text:
            self._held.append((text, tag))
        out: list[Piece] = []
        while self._held:
            held = "".join(t for t, _ in self._held)
            if self.state == ANSWER:
                out += self._take(len(held), ANSWER)
            elif self.state == "before":
                body = held.lstrip()
                if body.startswith(self.markers.start):
                    self._drop(len(held) - len(body) + len(self.markers.start))
                    self.state, self.thought = THINKING, True
                elif self.markers.start.startswith(body):  # whitespace, or a start marker still arriving
                    break
                else:
                    self.state = ANSWER
            else:
                cut = held.find(self.markers.end)
                if cut < 0:
                    out += self._take(len(held) - prefix_held(held, (self.markers.end,)), THINKING)
                    break
                out += self._take(cut, THINKING)
                self._drop(len(self.markers.end))
                self.state = ANSWER
        return out

    def flush(self) -> list[Piece]:
        """Release everything held (the generation ended): a partial marker is text of the part it was in."""
        part = THINKING if self.state == THINKING else ANSWER
        n = sum(len(t) for t, _ in self._held)
        return self._take(n, part)

    def _take(self, n: int, part: str) -> list[Piece]:
        out: list[Piece] = []
        while n > 0 and self._held:
            text, tag = self._held[0]
            if len(text) <= n:
                self._held.pop(0)
            else:
                text, self._held[0] = text[:n], (text[n:], tag)
            out.append((part, text, tag))
            n -= len(text)
        return out

    def _drop(self, n: int) -> None:
        self._take(n, "")


@dataclass(slots=True)
class PartStats:
    """The speculation numbers of one part of an answer (DESIGN §5, per part; DESIGN §10 for the attribution)."""

    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    passes: float = 0.0  # target passes, a pass shared between the parts by the tokens it emitted for each

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.passes if self.passes else 0.0

    def add(self, other: PartStats) -> None:
        """Sum another part's counts into this one (session totals)."""
        self.tokens += other.tokens
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.passes += other.passes

    def to_dict(self) -> dict:
        return {**asdict(self), "acceptance_rate": self.acceptance_rate, "tokens_per_pass": self.tokens_per_pass}


class ThinkingSplit:
    """One generation's events split into thinking and answer as they stream; `feed` each event in order.

    Args:
        markers: the model's markers, or None (everything is answer, the text unchanged).
        opened: the prompt left thinking open (the template wrote the start marker).
        token_bytes: a token's bytes (`Model.token_bytes`), to place each token on the token boundaries.
    """

    def __init__(self, markers: Markers | None, *, opened: bool, token_bytes: Callable[[int], bytes]) -> None:
        self.markers = markers
        self._text = MarkerScanner(markers, thinking=opened) if markers else None
        self._tokens = MarkerScanner(markers, thinking=opened) if markers else None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._token_bytes = token_bytes
        self._reasoning: list[str] = []
        self._answer: list[str] = []
        self._begun: set[str] = set()  # the parts whose text has begun (leading whitespace is dropped before)
        self._closed = {part: PartStats() for part in PARTS}  # steps that ended
        self._step: tuple[int, int, list[str]] | None = None  # (drafted, accepted, parts of its tokens so far)
        # Ended steps with tokens not placed yet: leading whitespace or a start marker still arriving (UNDECIDED).
        self._waiting: list[tuple[int, int, list[str]]] = []
        self._seen = (0, 0, 0)  # stats.target_passes, drafted, accepted at the last event

    @property
    def reasoning(self) -> str:
        """The thinking text so far, markers out, surrounding whitespace stripped."""
        return "".join(self._reasoning).strip()

    @property
    def answer(self) -> str:
        """The answer text so far (a reasoning model's without its leading whitespace; otherwise unchanged)."""
        return "".join(self._answer)

    @property
    def thought(self) -> bool:
        """Whether a thinking span was opened (by the prompt or the model), even an empty one."""
        return self._text is not None and self._text.thought

    @property
    def thinking(self) -> bool:
        """Whether the text is inside the thinking span now."""
        return self._text is not None and self._text.state == THINKING

    def feed(self, event: TokenEvent, stats: Stats) -> list[Piece]:
        """Take the next event of the generation whose live `stats` are given; return its text as pieces."""
        self._count(event, stats)
        if self._text is None:
            pieces = [(ANSWER, event.text, event.from_draft)] if event.text else []
        else:
            pieces = self._text.push(event.text, event.from_draft)
            if event.finish_reason is not None:
                pieces += self._text.flush()
            pieces = self._trim(pieces)
        for part, text, _ in pieces:
            (self._reasoning if part == THINKING else self._answer).append(text)
        if event.finish_reason is not None:
            self._close_step()
            self._place(ANSWER)  # only whitespace came, or the start of a marker that never came whole
        return pieces

    def _trim(self, pieces: list[Piece]) -> list[Piece]:
        """Each part's text without its leading whitespace (a reasoning model writes a line break after `<think>`,
        two after `</think>`)."""
        out: list[Piece] = []
        for part, text, tag in pieces:
            if part not in self._begun:
                text = text.lstrip()
            if text:
                out.append((part, text, tag))
                self._begun.add(part)
        return out

    def parts(self) -> dict[str, PartStats]:
        """Each part's numbers so far (the step under way counted with the tokens it has emitted; tokens not placed
        yet as answer)."""
        out = {part: PartStats(**asdict(stats)) for part, stats in self._closed.items()}
        for step in [*self._waiting, *([self._step] if self._step is not None else [])]:
            for part, stats in _attribute(*step, undecided=ANSWER).items():
                out[part].add(stats)
        return out

    def _count(self, event: TokenEvent, stats: Stats) -> None:
        passes, drafted, accepted = stats.target_passes, stats.drafted, stats.accepted
        if passes != self._seen[0]:  # this event is the first of a new step
            self._close_step()
            self._step = (drafted - self._seen[1], accepted - self._seen[2], [])
            self._seen = (passes, drafted, accepted)
        if event.token is not None and self._step is not None:
            self._step[2].append(self._token_part(event.token))

    def _token_part(self, token: int) -> str:
        """The part of the token just emitted: THINKING for the markers and what lies between, UNDECIDED while
        only whitespace or part of a start marker has come."""
        if self._tokens is None:
            return ANSWER
        before = self._tokens.state
        self._tokens.push(self._decoder.decode(self._token_bytes(token)))
        after = self._tokens.state
        if before == "before" and after != "before":
            self._place(THINKING if self._tokens.thought else ANSWER)
        if after == "before":
            return UNDECIDED
        return THINKING if THINKING in (before, after) else ANSWER

    def _place(self, part: str) -> None:
        """Give the tokens that waited for the start of the answer their part."""
        for step in [*self._waiting, *([self._step] if self._step is not None else [])]:
            step[2][:] = [part if p == UNDECIDED else p for p in step[2]]
        waiting, self._waiting = self._waiting, []
        for step in waiting:
            self._add(step)

    def _close_step(self) -> None:
        if self._step is not None:
            if UNDECIDED in self._step[2]:
                self._waiting.append(self._step)
            else:
                self._add(self._step)
            self._step = None

    def _add(self, step: tuple[int, int, list[str]]) -> None:
        for part, stats in _attribute(*step).items():
            self._closed[part].add(stats)


def _attribute(drafted: int, accepted: int, parts: list[str], undecided: str = "") -> dict[str, PartStats]:
    """One step's numbers per part: each token to its part, each accepted draft to its token's part, the rejected
    draft (and any drafted past it) to the part of the target's token there, the pass shared by tokens.
    `undecided`: the part of the tokens not placed yet."""
    out = {part: PartStats() for part in PARTS}
    parts = [undecided if p == UNDECIDED else p for p in parts] if undecided else parts
    if not parts:
        return out
    for part in parts:
        out[part].tokens += 1
        out[part].passes += 1 / len(parts)
    for i in range(drafted):
        part = parts[min(i, accepted, len(parts) - 1)]
        out[part].drafted += 1
        out[part].accepted += i < accepted
    return out


def split_text(markers: Markers | None, text: str, *, opened: bool = False) -> tuple[str, str]:
    """(reasoning, answer) of a whole answer's text, as `ThinkingSplit` would stream it."""
    if markers is None:
        return "", text
    scanner = MarkerScanner(markers, thinking=opened)
    pieces = scanner.push(text) + scanner.flush()
    reasoning = "".join(t for part, t, _ in pieces if part == THINKING)
    answer = "".join(t for part, t, _ in pieces if part == ANSWER)
    return reasoning.strip(), answer.lstrip()
