"""Ctrl+C at every moment of a generation leaves both caches consistent (issue #9), in this process.

A KeyboardInterrupt is raised at the N-th call of any llama.cpp-facing operation (decode, tail removal,
logits read, state save/restore, the drafter's propose), once before the real call and once after it (the
worst moment: llama.cpp's cache has changed, our token list not yet). For every N the interrupt must come
out as KeyboardInterrupt (not the invariant's AssertionError), `check_invariants()` must hold, and the
next generation must equal one from an untouched engine (up to near-ties, as in test_engine).
"""

from __future__ import annotations

import pytest
from support import GREEDY, divergence, run_to_end

from localspec.core.engine import Engine
from localspec.core.params import SpeculativeParams
from localspec.core.sampling import SamplingParams
from localspec.llama.context import Context

SAMPLED = SamplingParams(temperature=0.9, seed=5)
FIXED4 = SpeculativeParams(draft_max=4, adaptive=False)
PROMPT = "the man said that the water was hot and"
OPERATIONS = ("decode", "remove_from", "logits", "save_state", "load_state", "clear")
N_TOKENS = 16


class Tripwire:
    """Counts calls of the wrapped operations and raises KeyboardInterrupt at call number `at`."""

    def __init__(self, at: int, after: bool) -> None:
        self.at, self.after, self.calls, self.fired = at, after, 0, False

    def wrap(self, fn):
        def wrapped(*args, **kwargs):
            self.calls += 1
            hit = self.calls == self.at
            if hit and not self.after:
                self._fire()
            result = fn(*args, **kwargs)
            if hit and self.after:
                self._fire()
            return result

        return wrapped

    def _fire(self) -> None:
        self.fired = True
        raise KeyboardInterrupt


def run(engine: Engine, prompt: list[int], sampling: SamplingParams):
    return run_to_end(engine, prompt, sampling=sampling, spec=FIXED4, max_tokens=N_TOKENS)


def armed_run(engine: Engine, prompt, sampling, monkeypatch, wire: Tripwire) -> None:
    with monkeypatch.context() as patch:
        for name in OPERATIONS:
            patch.setattr(Context, name, wire.wrap(getattr(Context, name)))
        patch.setattr(engine.drafter, "propose", wire.wrap(engine.drafter.propose))
        try:
            run(engine, prompt, sampling)
        except KeyboardInterrupt:
            assert wire.fired
        else:
            assert not wire.fired


def call_points(total: int) -> list[int]:
    """Every one of the first 40 calls (prefill, first steps), then about 25 spread over the rest."""
    return sorted(set(range(1, min(total, 40) + 1)) | set(range(40, total + 1, max(1, (total - 40) // 25))))


@pytest.mark.slow
@pytest.mark.parametrize(
    "rollback, sampling, draft, bridge",
    [
        ("auto", GREEDY, "draft_noisy", "auto"),
        ("auto", SAMPLED, "draft_noisy", "auto"),
        ("checkpoint", GREEDY, "draft_noisy", "auto"),
        ("refill", GREEDY, "draft_noisy", "auto"),
        ("auto", SAMPLED, "vocab_shuffled", "shared"),  # another vocabulary: the bridge's history and drafts
        ("auto", GREEDY, "vocab_shuffled", "text"),
    ],
    ids=["greedy", "sampled", "checkpoint", "refill", "bridged-shared", "bridged-text"],
)
def test_interrupt_anywhere_leaves_caches_consistent(tiny_models, monkeypatch, rollback, sampling, draft, bridge):
    # One thread: on shared cores OpenMP threads spin and wait (DESIGN §7); this test runs ~1,000 generations.
    draft_path = getattr(tiny_models, draft)
    params = {"n_ctx": 256, "rollback": rollback, "n_threads": 1, "bridge": bridge}
    with Engine.load(tiny_models.target, draft_path, **params) as engine:
        prompt = engine.tokenize(PROMPT)
        reference = run(engine, prompt, sampling).tokens
        counter = Tripwire(at=0, after=False)
        armed_run(engine, prompt, sampling, monkeypatch, counter)
        assert counter.calls > 20  # the prefill, drafting, verification and rollbacks of 16 tokens
        fired = 0
        for at in call_points(counter.calls):
            for after in (False, True):
                wire = Tripwire(at, after)
                armed_run(engine, prompt, sampling, monkeypatch, wire)
                engine.check_invariants()
                fired += wire.fired
                again = run(engine, prompt, sampling).tokens
                if sampling.greedy:
                    divergence(tiny_models.target, prompt, reference, again)
                else:
                    assert again == reference
        assert fired >= len(call_points(counter.calls))
