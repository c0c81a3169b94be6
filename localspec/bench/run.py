"""`localspec bench`'s runs: the settings, the order they run in, and what each setting's runs add up to.

Settings (plain, each fixed k, adaptive; per temperature and, at T > 0, per verification) run in the order
`interleaved` gives — for each round, for each prompt, every setting in a rotating order — so the machine's noise
hits all alike. `run_bench` measures them; `run_rpc_bench` does it behind relays that add a round trip,
`busy_rows` with one core kept busy (llama-server's runs are peer_runs.py's). `rows_from` turns the tallies into the
report's rows: the measured costs c and v(k), the speed-up E(k)/(k·c + v(k)) they predict, the Python time outside
llama_decode and, greedy, where the output left plain decoding (exactness.py). The sampling yardstick is
yardstick.py's, the whole bench suite.py's, the report report.py's; the flags are the CLI's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from localspec.core.acceptance import expected_tokens
from localspec.core.drafters import make_drafter
from localspec.core.engine import Engine, Generation
from localspec.core.grammar import Grammar
from localspec.core.params import SpeculativeParams, needs_draft_model
from localspec.core.policy import DraftPolicy
from localspec.core.sampling import SamplingParams
from localspec.core.stats import Stats
from localspec.errors import InvalidParamsError

from .exactness import divergences
from .report import BusyRow, Divergence, Row, RpcRow

DEFAULT_PROMPTS = (
    "Write a short story about a robot who learns to paint.",
    "Explain how photosynthesis works, step by step.",
    "List ten tips for writing clean Python code.",
    "Describe the water cycle to a ten-year-old.",
)


@dataclass(frozen=True, slots=True)
class Setting:
    """One way of decoding: plain (k 0), a fixed k, or adaptive (k None, up to `limit`), with the drafter the pair
    loaded ("") or another one (`--drafters`)."""

    temperature: float
    k: int | None
    verify: str = "pq"
    limit: int = 8
    schema: bool = False  # the structured workload: the answer constrained to STRUCTURED
    drafter: str = ""  # a name in DRAFTERS; "": the drafter the engine was loaded with

    @property
    def name(self) -> str:
        if self.k == 0:
            return "plain" + (" schema" if self.schema else "")
        kind = f"adaptive≤{self.limit}" if self.k is None else f"k={self.k}"
        kind += " schema" if self.schema else ""
        kind = kind if self.temperature == 0 else f"{kind} {self.verify}"
        return f"{kind} {self.drafter}" if self.drafter else kind

    @property
    def spec(self) -> SpeculativeParams:
        if self.k is None:
            return SpeculativeParams(draft_max=self.limit, verify=self.verify, adaptive=True)
        return SpeculativeParams(draft_max=self.k, verify=self.verify, adaptive=False)

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature)  # the built-in top-k 40, top-p 0.95, min-p 0.05


# The structured workload (`bench --structured`): a JSON schema every built-in prompt can be answered in.
STRUCTURED_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 80},
        "points": {"type": "array", "items": {"type": "string", "maxLength": 160}, "minItems": 1, "maxItems": 8},
        "difficulty": {"enum": ["easy", "medium", "hard"]},
    },
    "required": ["title", "points", "difficulty"],
    "additionalProperties": False,
}
STRUCTURED = Grammar.json_schema(STRUCTURED_SCHEMA)


def settings_for(
    ks: Sequence[int],
    temperatures: Sequence[float],
    verifies: Sequence[str],
    drafters: Sequence[str] = ("",),
    structured: bool = False,
) -> list[Setting]:
    """Plain, and each k and adaptive with each drafter ("": the loaded one), at every temperature; at T > 0, each
    verification mode; with `structured`, each of them again with the answer constrained to STRUCTURED."""
    out = []
    limit = max(ks)
    for t in temperatures:
        out.append(Setting(t, 0))
        for verify in ["pq"] if t == 0 else list(verifies):
            for d in drafters:
                out += [Setting(t, k, verify, limit, drafter=d) for k in ks] + [
                    Setting(t, None, verify, limit, drafter=d)
                ]
    return out + [dataclasses.replace(s, schema=True) for s in out] if structured else out


class Drafters:
    """The drafters a bench switches between (`--drafters`): the loaded one, and others built around the same draft
    model (they share its cache, as the server's per-request drafters do); each keeps its own draft-length policy.

    Raises:
        InvalidParamsError: a drafter this engine cannot build (a model drafter without a draft model, an MTP head
            that was not loaded).
    """

    def __init__(self, engine: Engine, kinds: Sequence[str]) -> None:
        self.engine = engine
        self.loaded = engine.drafter.kind
        self._kept = {self.loaded: (engine.drafter, engine.policy)}
        self._current = self.loaded
        for kind in kinds:
            if not kind or kind in self._kept:
                continue
            if kind == "mtp":
                raise InvalidParamsError("--drafters mtp: load the pair with --drafter mtp to bench its MTP head")
            if kind == "assistant":
                raise InvalidParamsError("--drafters assistant: give the target's Gemma 4 assistant as --draft")
            model = engine.model_drafter if needs_draft_model(kind) else None
            if needs_draft_model(kind) and model is None:
                raise InvalidParamsError(f"--drafters {kind} drafts with a draft model: give the bench a draft")
            drafter = make_drafter(kind, model)
            self._kept[kind] = (drafter, DraftPolicy(draft_size_ratio=drafter.size_ratio))

    def use(self, kind: str) -> None:
        """Draft with `kind` ("": the loaded drafter) from the next generation on."""
        kind = kind or self.loaded
        if kind != self._current:
            self._kept[self._current] = (self.engine.drafter, self.engine.policy)
            self.engine.use_drafter(*self._kept[kind])
            self._current = kind


@dataclass(slots=True)
class Tally:
    """Everything one setting's runs added up."""

    stats: Stats = field(default_factory=Stats)
    seconds_outside_decode: float = 0.0
    tokens: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (round, prompt) -> output
    seconds_mask: float = 0.0  # the grammar's masks (the structured workload)
    masks: int = 0
    prompts: dict[int, Stats] = field(default_factory=dict)  # each prompt's runs added up, by its index


def _run_one(engine: Engine, prompt: list[int], setting: Setting, tokens: int) -> tuple[Generation, float]:
    decode_before = engine.seconds_decoding()
    grammar = STRUCTURED if setting.schema else None
    gen = engine.generate(prompt, sampling=setting.sampling, spec=setting.spec, max_tokens=tokens, grammar=grammar)
    for _ in gen:
        pass
    decoded = engine.seconds_decoding() - decode_before
    # Python time while generating: generating time minus the llama_decode time spent after the prefill (the
    # prefill itself is almost all llama_decode).
    python = max(gen.stats.seconds_generating - (decoded - gen.stats.seconds_prefill), 0.0)
    return gen, python


def _row(setting: Setting, tally: Tally, plain: Tally | None, divergences: tuple[Divergence, ...]) -> Row:
    s = tally.stats
    rate = s.tokens_per_second
    plain_stats = plain.stats if plain else None
    plain_rate = plain_stats.tokens_per_second if plain_stats else 0.0
    plain_step = (
        (plain_stats.seconds_verify + plain_stats.seconds_sampling) / max(plain_stats.target_passes, 1)
        if plain_stats
        else 0.0
    )
    mean_k = s.drafted / s.target_passes if s.target_passes else 0.0
    c = (s.seconds_draft / s.drafted) / plain_step if s.drafted and plain_step else 0.0
    v = (
        ((s.seconds_verify + s.seconds_sampling) / s.target_passes) / plain_step
        if s.target_passes and plain_step
        else 0.0
    )
    if setting.k == 0 or not mean_k:
        predicted = 1.0  # plain, or an adaptive run that never drafted
    else:
        predicted = _expected(s.alpha, mean_k) / (mean_k * c + v) if v else 0.0
    ratio = rate / plain_rate if plain_rate else 0.0
    return Row(
        setting=setting.name,
        temperature=setting.temperature,
        k=setting.k,
        verify=setting.verify,
        tokens_per_second=rate,
        ratio=ratio,
        acceptance=s.acceptance_rate,
        alpha=s.alpha,
        tokens_per_pass=s.mean_tokens_per_pass,
        draft_cost=c,
        verify_cost=v,
        mean_k=mean_k,
        predicted=predicted,
        efficiency=ratio / predicted if predicted else 0.0,
        python_ms_per_step=1e3 * tally.seconds_outside_decode / max(s.target_passes, 1),
        python_us_per_draft_token=1e6 * s.python_per_drafted_token,
        python_us_per_verify_step=1e6 * s.python_per_verify_step,
        python_us_per_row=1e6 * s.python_per_verified_row,
        bridge_us_per_draft_token=1e6 * s.bridging_per_drafted_token,
        divergences=divergences,
        mask_us_per_row=1e6 * tally.seconds_mask / tally.masks if tally.masks else 0.0,
        drafter=setting.drafter,
        schema=setting.schema,
        per_prompt=tuple(tally.prompts[p].tokens_per_second for p in sorted(tally.prompts)),
    )


def _expected(alpha: float, k: float) -> float:
    """E(k) for a fractional mean k (interpolated between the integers around it)."""
    lo = int(k)
    return expected_tokens(alpha, lo) + (k - lo) * (expected_tokens(alpha, lo + 1) - expected_tokens(alpha, lo))


class BusyCore:
    """A busy-loop process holding one core while the `with` block runs (stopped however the block ends)."""

    def __enter__(self) -> BusyCore:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "import time\nend = time.time() + 3600\nwhile time.time() < end: pass"]
        )
        return self

    def __exit__(self, *exc) -> None:
        self._proc.kill()
        self._proc.wait()


T = TypeVar("T")
G = TypeVar("G")


def rotated(items: Sequence[T], shift: int) -> list[T]:
    """`items` starting at index `shift` (mod its length) and wrapping around."""
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


def interleaved(
    settings: Sequence[T], n_prompts: int, rounds: range, groups: Sequence[G] = (None,)
) -> Iterator[tuple[int, G, int, T]]:
    """Every run of a side-by-side measurement as (round, group, prompt, setting), in the order that spreads
    machine noise evenly: each round visits every group (rotated by one per round; e.g. the RPC bench's added
    round trips), each prompt, and every setting in an order rotated by one per prompt, so no setting always
    runs first, or always right after the same other one. `rounds`: which (one alone where other work runs between
    rounds: the peer's)."""
    for round_ in rounds:
        for group in rotated(groups, round_):
            for p in range(n_prompts):
                for setting in rotated(settings, round_ * n_prompts + p):
                    yield round_, group, p, setting


def run_bench(
    engine: Engine,
    prompts: list[list[int]],
    settings: list[Setting],
    *,
    tokens: int,
    rounds: range,
    tallies: dict[Setting, Tally] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[Setting, Tally]:
    """Run every setting on every prompt, interleaved, in each of `rounds`; returns what each setting added up,
    added to `tallies` where given (the rounds before)."""
    tallies = {} if tallies is None else tallies
    for s in settings:  # in the settings' order (the report's rows)
        tallies.setdefault(s, Tally())
    total = len(rounds) * len(prompts) * len(settings)
    drafters = Drafters(engine, [s.drafter for s in settings])
    for done, (round_, _, p, setting) in enumerate(interleaved(settings, len(prompts), rounds), 1):
        drafters.use(setting.drafter)
        gen, python = _run_one(engine, prompts[p], setting, tokens)
        tally = tallies[setting]
        tally.stats.merge(gen.stats)
        tally.prompts.setdefault(p, Stats()).merge(gen.stats)
        tally.seconds_outside_decode += python
        tally.tokens[(round_, p)] = list(gen.tokens)
        if gen.constraint is not None:
            tally.seconds_mask += gen.constraint.seconds_mask
            tally.masks += gen.constraint.n_masks
        progress(f"{bar(done, total)} {setting.name}, round {round_ + 1}, prompt {p + 1}")
    return tallies


def run_rpc_bench(
    engine: Engine,
    prompts: list[list[int]],
    settings: list[Setting],
    relays: Sequence,
    rtts: Sequence[float],
    *,
    tokens: int,
    rounds: int,
    progress: Callable[[str], None] = lambda _: None,
) -> list[RpcRow]:
    """Every setting at every added round trip, interleaved: for each round, for each round trip (rotating),
    for each prompt, every setting (rotating). The relays (`relay.DelayRelay`) stand between the target and its
    workers; their delay is changed between runs, so one loaded engine serves every round trip."""
    tallies = {(rtt, s): Tally() for rtt in rtts for s in settings}
    turns = dict.fromkeys(tallies, 0)
    decodes = dict.fromkeys(tallies, 0)
    total = rounds * len(rtts) * len(prompts) * len(settings)
    drafters = Drafters(engine, [s.drafter for s in settings])
    for done, (round_, rtt, p, setting) in enumerate(interleaved(settings, len(prompts), range(rounds), rtts), 1):
        drafters.use(setting.drafter)
        for relay in relays:
            relay.rtt_ms = rtt
        before, decoded = sum(r.turns for r in relays), engine.target.ctx.decodes
        gen, _ = _run_one(engine, prompts[p], setting, tokens)
        turns[(rtt, setting)] += sum(r.turns for r in relays) - before
        decodes[(rtt, setting)] += engine.target.ctx.decodes - decoded
        tallies[(rtt, setting)].stats.merge(gen.stats)
        progress(f"{bar(done, total)} {setting.name} at +{rtt:g} ms, round {round_ + 1}")
    rows = []
    for (rtt, setting), tally in tallies.items():
        plain = next(
            t for (r, s), t in tallies.items() if r == rtt and s.k == 0 and s.temperature == setting.temperature
        )
        rate, plain_rate = tally.stats.tokens_per_second, plain.stats.tokens_per_second
        rows.append(
            RpcRow(
                rtt_ms=rtt,
                setting=setting.name,
                temperature=setting.temperature,
                tokens_per_second=rate,
                ratio=rate / plain_rate if plain_rate else 0.0,
                tokens_per_pass=tally.stats.mean_tokens_per_pass,
                round_trips_per_pass=turns[(rtt, setting)] / max(decodes[(rtt, setting)], 1),
            )
        )
    return rows


def bar(done: int, total: int, width: int = 24) -> str:
    filled = round(width * done / total) if total else width
    return f"[{'█' * filled}{'·' * (width - filled)}] {done}/{total}"


def rows_from(engine: Engine, prompts: list[list[int]], tallies: dict[Setting, Tally]) -> list[Row]:
    rows = []
    plain_by_t = {(s.temperature, s.schema): t for s, t in tallies.items() if s.k == 0}
    for setting, tally in tallies.items():
        plain = plain_by_t.get((setting.temperature, setting.schema))  # a schema's runs against its plain runs
        div = ()
        if setting.temperature == 0 and setting.k != 0 and plain is not None:
            div = divergences(engine, prompts, plain.tokens, tally.tokens)
        rows.append(_row(setting, tally, plain, div))
    return rows


def busy_rows(
    engine: Engine, prompts: list[list[int]], settings: list[Setting], tokens: int, progress: Callable[[str], None]
) -> list[BusyRow]:
    """Each setting quiet and with one busy core, interleaved like the main runs."""
    tallies = {(s, busy): Tally() for s in settings for busy in (False, True)}
    drafters = Drafters(engine, [s.drafter for s in settings])
    for done, (_, _, p, (setting, busy)) in enumerate(interleaved(list(tallies), len(prompts), range(1)), 1):
        drafters.use(setting.drafter)
        with BusyCore() if busy else contextlib.nullcontext():
            if busy:
                time.sleep(0.2)  # the busy loop is running before the timed run starts
            gen, _ = _run_one(engine, prompts[p], setting, tokens)
        tallies[(setting, busy)].stats.merge(gen.stats)
        progress(f"{bar(done, len(tallies) * len(prompts))} one busy core: {setting.name}")
    rate = {key: tally.stats.tokens_per_second for key, tally in tallies.items()}
    return [BusyRow(s.name, rate[(s, False)], rate[(s, True)]) for s in settings]
