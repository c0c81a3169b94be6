"""How often a stream's drafts are accepted, and what that is worth: the one estimator of α (`Acceptance`) and the one
E(k) (`expected_tokens`), for the adaptive policy of a stream alone (policy.py) and the plan of a shared batch
(batchdraft.py) alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LONG_MATCH = (
    8  # copies after a match at least this long are judged apart: they repeat far more reliably than short ones
)


def expected_tokens(alpha: float, k: int) -> float:
    """E(k) = (1 − α^(k+1)) / (1 − α): tokens a step with k drafts emits, at per-token acceptance α (the bonus or
    correction token included)."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass(slots=True)
class Acceptance:
    """α̂, a stream's per-token acceptance of its drafts: discounted counts of accepted and rejected drafts (recent steps
    weigh most), with copies after a short and a long match (`LONG_MATCH`) counted apart, and a prior.

    The prior either stays (`fades` off: a stream that stops drafting drifts back to it, so a bad stretch is re-tried)
    or starts as `weight` tokens of evidence that fade like any other (`fades` on: the engine's policy, where evidence
    alone decides once there is some).
    """

    prior: float = 0.5
    weight: float = 2.0  # the prior counts as this many verified tokens
    forget: float = 0.1  # share of the older counts forgotten at each verified step (and while not drafting)
    fades: bool = False
    counts: dict[bool, list[float]] = field(default_factory=dict)  # long match → [accepted, rejected]

    def __post_init__(self) -> None:
        if not self.counts:
            start = [self.prior * self.weight, (1 - self.prior) * self.weight] if self.fades else [0.0, 0.0]
            self.counts = {False: list(start), True: list(start)}

    @classmethod
    def measured(cls, alpha: float, evidence: float, **kwargs) -> Acceptance:
        """An estimate that has seen `evidence` tokens accepted at rate `alpha` (every kind of match)."""
        kwargs.setdefault("fades", True)
        counts = {long: [alpha * evidence, (1 - alpha) * evidence] for long in (False, True)}
        return cls(**kwargs, counts=counts)

    def evidence(self, match: int = 0) -> float:
        """Verified tokens' worth of evidence behind the estimate after a match of that length (a fading prior's
        remainder included)."""
        return sum(self.counts[match >= LONG_MATCH])

    @property
    def seen(self) -> float:
        """Evidence after both kinds of match."""
        return sum(sum(counts) for counts in self.counts.values())

    def alpha(self, match: int = 0) -> float:
        accepted, rejected = self.counts[match >= LONG_MATCH]
        if self.fades:
            return accepted / (accepted + rejected) if accepted + rejected > 0 else self.prior
        return (accepted + self.prior * self.weight) / (accepted + rejected + self.weight)

    def alpha_high(self, match: int = 0) -> float:
        """An optimistic α: α̂ plus 1.28 standard errors of its discounted evidence (a one-sided 90 % bound)."""
        alpha = self.alpha(match)
        return min(1.0, alpha + 1.28 * (alpha * (1.0 - alpha) / (self.evidence(match) + 1.0)) ** 0.5)

    def expected(self, d: int, match: int = 0) -> float:
        """Tokens expected from d drafts beyond the one a step always emits: E(d) − 1 = α̂ + α̂² + … + α̂^d."""
        return expected_tokens(self.alpha(match), d) - 1.0

    def learn(self, match: int, accepted: int, rejected: bool) -> None:
        """A step verified this stream's drafts after a match of that length (0: not a copy): `accepted` taken, and
        whether one was rejected (else all were)."""
        counts = self.counts[match >= LONG_MATCH]
        counts[0] = counts[0] * (1 - self.forget) + accepted
        counts[1] = counts[1] * (1 - self.forget) + rejected

    def idle(self, match: int) -> None:
        """A tick in which this stream could have drafted and did not: its counts fade toward the prior."""
        counts = self.counts[match >= LONG_MATCH]
        counts[0] *= 1 - self.forget
        counts[1] *= 1 - self.forget
