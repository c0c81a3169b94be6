"""Speculation statistics, defined once (DESIGN §5) and shown everywhere: CLI JSON, stderr line, TUI.

drafted / accepted / target passes / emitted are counted per step; acceptance rate = accepted /
drafted; α̂ = accepted / (accepted + rejections); mean tokens per target pass = emitted / passes.
One `Stats` per turn; `Stats.merge` sums turns into a session total.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class StepTiming:
    """Where one step's time went (`StepClock` in core/step.py measures it)."""

    seconds_draft: float = 0.0  # drafting, the draft model's catch-up included
    seconds_verify: float = 0.0  # the target's decode and rollback
    seconds_sampling: float = 0.0  # the target's sampling laws and accept/reject
    seconds_draft_decode: float = 0.0  # of seconds_draft, inside llama_decode (the rest is Python)
    seconds_verify_decode: float = 0.0  # of seconds_verify + seconds_sampling, inside llama_decode
    seconds_bridging: float = 0.0  # of seconds_draft, moving between two vocabularies (a bridged draft)

    @property
    def seconds(self) -> float:
        return self.seconds_draft + self.seconds_verify + self.seconds_sampling


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A token's log-probability under the target's own distribution (its raw logits' softmax: core/step.py
    `logprobs`), and the most likely tokens at that position with theirs, best first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Step:
    """What one step of the generation loop did: the one record `Stats` and the draft policy learn from."""

    tokens: tuple[tuple[int, bool], ...]  # (token, from_draft) emitted: the accepted drafts, then the target's
    drafted: int  # draft tokens verified
    accepted: int  # of those, accepted
    draft_decoded: int = 0  # tokens the draft model decoded (its drafts and any catch-up)
    timing: StepTiming = StepTiming()
    # Per emitted token, where asked (`DraftRequest.logprobs`): (its log-probability, the top alternatives).
    logprobs: tuple[TokenLogprob, ...] | None = None

    @property
    def emitted(self) -> int:
        return len(self.tokens)

    @property
    def rejected(self) -> bool:
        return self.accepted < self.drafted


@dataclass(frozen=True, slots=True)
class Decision:
    """The adaptive policy's inputs and verdict at its latest choice (shown by the stats panel and --json)."""

    draft_cost: float = 0.0  # c: one drafted token / one plain target step
    verify_cost: float = 0.0  # v(k): a step verifying k drafts / one plain target step, at the chosen k
    alpha: float = 0.0  # α̂, the per-token acceptance the policy expects
    predicted_speedup: float = 0.0  # E(k) / (k·c + v(k)) at the chosen (or best) k
    measured_speedup: float = 0.0  # recent speculative steps' tokens/s over recent plain steps' (0 until both)


LATEST = MappingProxyType({"merge": "latest"})  # field metadata: `Stats.merge` keeps the newer generation's value


@dataclass(slots=True)
class Stats:
    """Counters and timings of one generation (or, merged, of a session)."""

    drafter: str = field(default="", metadata=LATEST)  # the drafter's name (DRAFTERS): "mtp" for the target's own head
    prompt_tokens: int = 0
    prefill_decoded: int = 0  # prompt tokens the target really decoded (the rest came from prefix reuse)
    prefill_restored: int = 0  # of the prompt tokens not decoded, those restored from the prompt cache (promptcache.py)
    draft_prefill_decoded: int = 0  # the same for the draft model
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # steps that ended on a rejected draft token
    target_passes: int = 0
    emitted: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    draft_length: int = field(default=0, metadata=LATEST)  # k chosen for the latest step
    speculation_off: str = field(default="", metadata=LATEST)  # why the latest step decoded plainly ("" if it did not)
    steps_by_draft_length: list[int] = field(default_factory=list)  # [k] = steps that chose k drafts
    steps_off: int = 0  # steps the adaptive policy decoded plainly (see speculation_off)
    probes: int = 0  # speculative steps the adaptive policy ran while off, to re-check the draft
    seconds: float = 0.0  # wall time of the whole generation, prefill included
    seconds_prefill: float = 0.0
    seconds_draft: float = 0.0
    seconds_verify: float = 0.0
    seconds_sampling: float = 0.0
    seconds_draft_decode: float = 0.0  # inside llama_decode while drafting (the rest of seconds_draft is Python)
    seconds_verify_decode: float = 0.0  # inside llama_decode while verifying (the target's batch, any re-prefill)
    seconds_bridging: float = 0.0  # of seconds_draft, a bridged draft's own work between the two vocabularies
    decision: Decision = field(default_factory=Decision, metadata=LATEST)  # the adaptive policy's latest choice

    def record_choice(self, k: int, reason: str, *, probe: bool = False) -> None:
        """Record the draft length chosen for the next step, and why it is 0 when speculation is off."""
        self.draft_length, self.speculation_off = k, reason
        if k >= len(self.steps_by_draft_length):
            self.steps_by_draft_length.extend([0] * (k + 1 - len(self.steps_by_draft_length)))
        self.steps_by_draft_length[k] += 1
        self.steps_off += bool(reason)
        self.probes += probe

    def record_step(self, step: Step) -> None:
        """Count one target pass: its drafts, what was accepted and emitted, and where the time went."""
        k, n_accepted = step.drafted, step.accepted
        self.target_passes += 1
        self.drafted += k
        self.accepted += n_accepted
        self.emitted += step.emitted
        self.rejections += step.rejected
        timing = step.timing
        self.seconds_draft += timing.seconds_draft
        self.seconds_verify += timing.seconds_verify
        self.seconds_sampling += timing.seconds_sampling
        self.seconds_draft_decode += timing.seconds_draft_decode
        self.seconds_verify_decode += timing.seconds_verify_decode
        self.seconds_bridging += timing.seconds_bridging
        if k > len(self.drafted_by_position):
            grow = k - len(self.drafted_by_position)
            self.drafted_by_position.extend([0] * grow)
            self.accepted_by_position.extend([0] * grow)
        for i in range(k):
            self.drafted_by_position[i] += 1
            self.accepted_by_position[i] += i < n_accepted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def alpha(self) -> float:
        """α̂: the per-token acceptance estimate of the paper."""
        seen = self.accepted + self.rejections
        return self.accepted / seen if seen else 0.0

    @property
    def mean_tokens_per_pass(self) -> float:
        return self.emitted / self.target_passes if self.target_passes else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position)]

    @property
    def seconds_generating(self) -> float:
        return max(self.seconds - self.seconds_prefill, 0.0)

    @property
    def seconds_other(self) -> float:
        """Generation time outside drafting, verifying and sampling (detokenising, stops, the caller)."""
        return max(self.seconds_generating - self.seconds_draft - self.seconds_verify - self.seconds_sampling, 0.0)

    @property
    def python_per_drafted_token(self) -> float:
        """Seconds of Python (outside llama_decode) per drafted token: sampling the draft, batching its decodes."""
        return max(self.seconds_draft - self.seconds_draft_decode, 0.0) / self.drafted if self.drafted else 0.0

    @property
    def bridging_per_drafted_token(self) -> float:
        """Of `python_per_drafted_token`, the seconds a bridged draft spends between the two vocabularies."""
        return self.seconds_bridging / self.drafted if self.drafted else 0.0

    @property
    def python_per_verify_step(self) -> float:
        """Seconds of Python per target pass: the batch, the target's laws, accept/reject and the rollbacks."""
        python = self.seconds_verify + self.seconds_sampling - self.seconds_verify_decode
        return max(python, 0.0) / self.target_passes if self.target_passes else 0.0

    @property
    def python_per_verified_row(self) -> float:
        """The same Python time per row the target verified (k + 1 rows a pass)."""
        rows = self.target_passes + self.drafted
        python = self.seconds_verify + self.seconds_sampling - self.seconds_verify_decode
        return max(python, 0.0) / rows if rows else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Emitted tokens per second of generation (prefill excluded)."""
        return self.emitted / self.seconds_generating if self.seconds_generating > 0 else 0.0

    def merge(self, other: Stats) -> None:
        """Add another generation's counts and times into this one (session totals): numbers add, per-position
        lists add position by position, and the fields marked LATEST take the other's value."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.metadata.get("merge") == "latest":
                setattr(self, f.name, theirs)
            elif isinstance(mine, list):
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, v in enumerate(theirs):
                    mine[i] += v
            else:
                setattr(self, f.name, mine + theirs)

    def to_dict(self) -> dict:
        """Plain JSON-ready dict: the counters plus every derived rate (each property of `Stats`)."""
        derived = {name: getattr(self, name) for name, value in vars(Stats).items() if isinstance(value, property)}
        return {**asdict(self), **derived}

    def summary(self) -> str:
        """One human line, e.g. for stderr after `localspec generate`."""
        line = f"{self.emitted} tokens, {self.tokens_per_second:.1f} tok/s, {self.target_passes} target passes"
        if self.drafted:
            line += (
                f", acceptance {self.acceptance_rate:.0%} ({self.accepted}/{self.drafted} drafted), "
                f"{self.mean_tokens_per_pass:.2f} tokens/pass"
            )
            if self.speculation_off:
                line += f", then plain ({self.speculation_off})"
        else:
            line += ", no speculation" + (f" ({self.speculation_off})" if self.speculation_off else "")
        return line
