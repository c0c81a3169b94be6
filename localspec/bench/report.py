"""`localspec bench`'s report: the rows it measured and how they are shown, as a table or as JSON (with `--image`, the
image turns' rows as a second table, `image_rows`).

`run.py` measures and fills a `BenchReport`; this module only presents it (no engine, no timing).
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class Divergence:
    prompt: int
    index: int  # first token where the output differs from plain's
    top2_gap: float  # the target's logit gap between its two best tokens there


@dataclass(frozen=True, slots=True)
class Row:
    setting: str
    temperature: float
    k: int | None
    verify: str
    tokens_per_second: float
    ratio: float  # tok/s / plain tok/s at the same temperature
    acceptance: float
    alpha: float
    tokens_per_pass: float
    draft_cost: float  # c
    verify_cost: float  # v(k̄) at the mean draft length used
    mean_k: float
    predicted: float  # E(k̄)/(k̄·c + v(k̄))
    efficiency: float  # ratio / predicted
    python_ms_per_step: float  # outside llama_decode, everything (the loop, detokenising and stops included)
    python_us_per_draft_token: float  # outside llama_decode while drafting, per drafted token
    python_us_per_verify_step: float  # outside llama_decode while verifying, per target pass
    python_us_per_row: float  # the same per row the target verified (k + 1 a pass)
    bridge_us_per_draft_token: float = 0.0  # of python_us_per_draft_token, a bridged draft's work between vocabularies
    divergences: tuple[Divergence, ...] = ()
    peer_tokens_per_second: float | None = None  # llama-server at the same setting (plain, or the same k)
    peer_acceptance: float | None = None
    mask_us_per_row: float = 0.0  # the structured workload: the grammar's mask, µs per row it was computed for
    best_peer_ratio: float | None = None  # tok/s / the fastest of llama-server's settings at this temperature
    drafter: str = ""  # the drafter of this row ("": the one the pair loaded)
    schema: bool = False  # the structured workload (the peer runs free text only: no peer figures on it)
    per_prompt: tuple[float, ...] = ()  # tok/s on each prompt (its runs over the rounds), in the prompts' order


@dataclass(frozen=True, slots=True)
class PeerRow:
    """One of llama-server's settings as it ran: those of localspec's rows, and its own strong ones."""

    setting: str
    temperature: float
    spec: str  # --spec-type ("": plain)
    k: int | None  # --spec-draft-n-max (None: the build's default; 0: none given)
    probabilistic: bool | None  # --spec-draft-sampling probabilistic (None: not given)
    tokens_per_second: float  # median over the runs
    acceptance: float


@dataclass(frozen=True, slots=True)
class BestPeer:
    """At one temperature: localspec's default (its adaptive row) against the fastest of llama-server's settings."""

    temperature: float
    label: str  # what localspec ran: "localspec default", or the drafter that stood in for it
    setting: str  # localspec's row
    tokens_per_second: float
    peer_setting: str
    peer_tokens_per_second: float
    ratio: float  # tokens_per_second / peer_tokens_per_second


@dataclass(frozen=True, slots=True)
class SamplingCost:
    """Sampling freshly decoded rows of the target, as a plain step does: ours against llama.cpp's own chain."""

    temperature: float
    rows: int  # rows timed for each, in rotation
    localspec_us: float  # median: a plain step's draw (llama.cpp's chain for our law, or numpy; the argmax at T 0)
    llama_cpp_us: float  # median: llama.cpp's sampler chain on the same kind of row (`llama_sampler_sample`)
    numpy_us: float | None = None  # median: numpy's law and draw (`sampling_law`), where the plain step uses the chain
    k: int = 4  # drafts per verify pass below
    verified_us: float | None = None  # median µs per row of a verify pass, read as verification reads it
    llama_cpp_verified_us: float | None = None  # median µs per row: the chain sampling each row of the pass


@dataclass(frozen=True, slots=True)
class RpcRow:
    """One setting with the target on RPC workers behind a relay that adds `rtt_ms` to every round trip."""

    rtt_ms: float
    setting: str
    temperature: float
    tokens_per_second: float
    ratio: float  # tok/s / plain tok/s at the same round trip and temperature
    tokens_per_pass: float
    round_trips_per_pass: float  # relay turns / the target's llama_decode calls (prefills included)


@dataclass(frozen=True, slots=True)
class BusyRow:
    """One setting's speed on a quiet machine and with one core kept busy by another process."""

    setting: str
    quiet: float  # tok/s
    busy: float  # tok/s


@dataclass(slots=True)
class BenchReport:
    machine: str
    command: str
    date: str
    target: str
    draft: str
    threads: int
    rows: list[Row] = field(default_factory=list)
    busy: list[BusyRow] = field(default_factory=list)
    rpc: list[RpcRow] = field(default_factory=list)
    peer: list[PeerRow] = field(default_factory=list)  # every llama-server setting that ran
    best_peer: list[BestPeer] = field(default_factory=list)  # the headline, per temperature
    logit_noise: float | None = None  # max |Δlogit|, one batched decode vs single-row decodes of the prompt rows
    sampling: list[SamplingCost] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    placement: dict[str, Any] | None = None  # where the pair went (`GpuPlan.to_dict()`; the peer gets the same split)
    images: list[str] = field(default_factory=list)  # `--image`: each image shown in the image turns (path, size)
    image_rows: list[Row] = field(default_factory=list)  # the image turns' settings, as `rows` are the text turns'
    image_peer: list[PeerRow] = field(default_factory=list)  # llama-server's settings on the image turns
    image_best_peer: list[BestPeer] = field(default_factory=list)  # their headline


def rpc_summary(rows: list[RpcRow]) -> list[str]:
    """Per speculative setting: its ratio to plain at the largest added round trip ÷ its ratio at the smallest."""
    if not rows:
        return []
    lo, hi = min(r.rtt_ms for r in rows), max(r.rtt_ms for r in rows)
    out = []
    for r in rows:
        if r.rtt_ms != hi or r.setting == "plain":
            continue
        base = next(b for b in rows if b.rtt_ms == lo and (b.setting, b.temperature) == (r.setting, r.temperature))
        if base.ratio:
            out.append(
                f"{r.setting} T{r.temperature:g}: ×plain {base.ratio:.2f} at +{lo:g} ms → {r.ratio:.2f} at "
                f"+{hi:g} ms ({r.ratio / base.ratio:.2f}×)"
            )
    return out


def machine_line(threads: int) -> str:
    load = "/".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (
        f"{platform.machine()} {platform.processor() or platform.system()}, {os.cpu_count()} CPUs, "
        f"{threads} threads, load {load}"
    )


def render(report: BenchReport) -> list[str]:
    """The report as a table (text lines)."""
    lines = [
        f"localspec bench — {report.date}",
        f"machine: {report.machine}",
        f"command: {report.command}",
        f"target: {report.target}",
        f"draft:  {report.draft or 'the target MTP head (--drafter mtp)'}",
    ]
    if report.placement:
        lines.append(f"placement: {report.placement['text']}")
    lines.append("")
    lines += _table(report.rows) + peer_lines(report.peer, report.best_peer)
    lines += _divergences(report.rows, report.logit_noise)
    lines += adaptive_by_prompt(report.rows)
    bridged = [r for r in report.rows if r.bridge_us_per_draft_token]
    if bridged:
        lines.append(
            "bridge (the draft's other vocabulary), of µs/draft: "
            + ", ".join(f"{r.setting} T{r.temperature:g} {r.bridge_us_per_draft_token:.0f}" for r in bridged)
            + " µs per drafted token"
        )
    if report.logit_noise is not None:
        lines.append(
            f"batch vs single-row logits of the target (prompt rows): max |Δ| {report.logit_noise:.4f} — greedy "
            "output may leave plain decoding where the top-2 gap is below this"
        )
    masked = [r for r in report.rows if r.mask_us_per_row]
    if masked:
        lines.append(
            "the grammar's mask (the structured workload), µs per row: "
            + ", ".join(f"{r.setting} T{r.temperature:g} {r.mask_us_per_row:.0f}" for r in masked)
        )
    if report.sampling:
        lines.append(
            "sampling freshly decoded rows of the target, median µs per row, localspec / llama.cpp: "
            + "; ".join(f"T {c.temperature:g}: {_sampling_costs(c)}" for c in report.sampling)
            + f" ({report.sampling[0].rows} rows or passes each; llama.cpp: its own sampler chain, as llama-server"
            " runs it)"
        )
    if report.image_rows:
        lines += ["", f"image turns: the same prompts with {', '.join(report.images)} before the text:"]
        lines += _table(report.image_rows) + peer_lines(report.image_peer, report.image_best_peer)
        lines += _divergences(report.image_rows, report.logit_noise)
    if report.busy:
        lines += ["", "one busy core (a busy-loop process on one core):"]
        for b in report.busy:
            lines.append(
                f"  {b.setting:<16} quiet {b.quiet:.1f} tok/s, busy {b.busy:.1f} tok/s ({b.busy / b.quiet:.2f}× quiet)"
                if b.quiet
                else f"  {b.setting}: no data"
            )
    if report.rpc:
        lines += [
            "the target on RPC workers, behind a relay on 127.0.0.1 that adds a round trip:",
            f"{'+rtt ms':>7}  {'setting':<16}{'T':>4}{'tok/s':>8}{'×plain':>8}{'tok/pass':>9}{'trips/pass':>11}",
        ]
        for r in report.rpc:
            lines.append(
                f"{r.rtt_ms:>7g}  {r.setting:<16}{r.temperature:>4g}{r.tokens_per_second:>8.1f}{r.ratio:>8.2f}"
                f"{r.tokens_per_pass:>9.2f}{r.round_trips_per_pass:>11.2f}"
            )
        lines += [f"  {line}" for line in rpc_summary(report.rpc)]
    lines += [f"note: {n}" for n in report.notes]
    return lines


def _table(rows: list[Row]) -> list[str]:
    """The settings' rows under their header (nothing without rows: a --rpc run has only the RPC table)."""
    if not rows:
        return []
    width = max([16, *(len(r.setting) + 1 for r in rows)])
    head = (
        f"{'setting':<{width}}{'T':>4}{'tok/s':>8}{'×plain':>8}{'accept':>8}{'α':>6}{'tok/pass':>9}{'c':>6}"
        f"{'v(k)':>6}{'pred':>6}{'eff':>6}{'py ms':>7}{'µs/draft':>9}{'µs/pass':>8}{'µs/row':>7}"
    )
    has_peer = any(r.peer_tokens_per_second is not None or r.best_peer_ratio is not None for r in rows)
    if has_peer:
        head += f"{'peer tok/s':>11}{'×peer':>7}{'×best peer':>11}"
    lines = [head]
    for r in rows:
        line = (
            f"{r.setting:<{width}}{r.temperature:>4g}{r.tokens_per_second:>8.1f}{r.ratio:>8.2f}"
            f"{r.acceptance:>8.0%}{r.alpha:>6.2f}{r.tokens_per_pass:>9.2f}{r.draft_cost:>6.2f}"
            f"{r.verify_cost:>6.2f}{r.predicted:>6.2f}{r.efficiency:>6.2f}{r.python_ms_per_step:>7.2f}"
            + (f"{r.python_us_per_draft_token:>9.0f}" if r.mean_k else f"{'–':>9}")
            + f"{r.python_us_per_verify_step:>8.0f}{r.python_us_per_row:>7.0f}"
        )
        if has_peer:
            if r.peer_tokens_per_second:
                line += f"{r.peer_tokens_per_second:>11.1f}{r.tokens_per_second / r.peer_tokens_per_second:>7.2f}"
            else:
                line += f"{'–':>11}{'–':>7}"
            line += f"{r.best_peer_ratio:>11.2f}" if r.best_peer_ratio else f"{'–':>11}"
        lines.append(line)
    return lines


def adaptive_by_prompt(rows: list[Row]) -> list[str]:
    """For each adaptive row, its tok/s on each prompt over the best fixed k's on that prompt (the fixed-k rows of the
    same temperature, verification, workload and drafter), and the lowest: whether the policy keeps up with the best
    draft length prompt by prompt, not only on the whole."""
    lines = []
    for a in rows:
        if a.k is not None or not a.per_prompt:
            continue
        same = (a.temperature, a.verify, a.schema, a.drafter)
        fixed = [r for r in rows if r.k and (r.temperature, r.verify, r.schema, r.drafter) == same]
        fixed = [r for r in fixed if len(r.per_prompt) == len(a.per_prompt)]
        if not fixed:
            continue
        parts = []
        for i, rate in enumerate(a.per_prompt):
            best = max(fixed, key=lambda r: r.per_prompt[i])
            parts.append((rate / best.per_prompt[i] if best.per_prompt[i] else 0.0, best.k))
        lines.append(
            f"prompt by prompt, {a.setting} T{a.temperature:g} over the best fixed k: "
            + ", ".join(f"{ratio:.2f} (k={k})" for ratio, k in parts)
            + f"; lowest {min(ratio for ratio, _ in parts):.2f}"
        )
    return lines


def _divergences(rows: list[Row], logit_noise: float | None) -> list[str]:
    """Where each greedy row left plain decoding, with the target's top-2 gap there."""
    return [
        f"  {r.setting}: prompt {d.prompt + 1} leaves plain at token {d.index} "
        f"(target top-2 gap {d.top2_gap:.4f} in plain decoding's own single-row logits"
        + (", a near-tie)" if logit_noise is not None and d.top2_gap <= logit_noise else ")")
        for r in rows
        for d in r.divergences
    ]


def peer_lines(peer: list[PeerRow], best_peer: list[BestPeer]) -> list[str]:
    """llama-server's settings as they ran (its fastest per temperature marked *), and the headline: localspec's
    default against the peer's best setting."""
    if not peer:
        return []
    fastest = {b.temperature: b.peer_setting for b in best_peer}
    width = max(len(p.setting) for p in peer) + 2
    lines = ["llama-server's own settings (* its fastest at that temperature):"]
    for p in peer:
        mark = "*" if fastest.get(p.temperature) == p.setting else " "
        accept = f"{p.acceptance:>8.0%}" if p.k != 0 or p.spec else f"{'–':>8}"
        lines.append(f" {mark}{p.setting:<{width}}T {p.temperature:<5g}{p.tokens_per_second:>7.1f} tok/s{accept}")
    if best_peer:
        lines.append(
            f"{best_peer[0].label} vs the peer's best setting: "
            + "; ".join(
                f"T {b.temperature:g}: {b.setting} {b.tokens_per_second:.1f} tok/s / {b.peer_setting} "
                f"{b.peer_tokens_per_second:.1f} tok/s = {b.ratio:.2f}×"
                for b in best_peer
            )
        )
    return lines


def _sampling_costs(c: SamplingCost) -> str:
    """One temperature's yardstick: the plain step's row and a verify pass's rows, ours / llama.cpp's (ratio)."""
    text = f"plain step {c.localspec_us:.0f} / {c.llama_cpp_us:.0f} ({c.localspec_us / c.llama_cpp_us:.2f}×)"
    if c.numpy_us is not None:
        text += f" [numpy's law {c.numpy_us:.0f}]"
    if c.verified_us is not None and c.llama_cpp_verified_us:
        ratio = c.verified_us / c.llama_cpp_verified_us
        text += f", verified row (k={c.k}) {c.verified_us:.0f} / {c.llama_cpp_verified_us:.0f} ({ratio:.2f}×)"
    return text


def to_json(report: BenchReport) -> str:
    return json.dumps(asdict(report), indent=2, default=str)


def from_json(text: str) -> BenchReport:
    """A report written by `to_json` (so one `bench --json` run can also be shown as the table)."""
    data = json.loads(text)
    parsed: dict[str, Any] = {}
    for key in ("rows", "image_rows"):
        parsed[key] = [
            Row(**{**r, "divergences": tuple(Divergence(**d) for d in r["divergences"])}) for r in data.pop(key, [])
        ]
    for key in ("peer", "image_peer"):
        parsed[key] = [PeerRow(**r) for r in data.pop(key, [])]
    for key in ("best_peer", "image_best_peer"):
        parsed[key] = [BestPeer(**b) for b in data.pop(key, [])]
    parsed["busy"] = [BusyRow(**b) for b in data.pop("busy")]
    parsed["rpc"] = [RpcRow(**r) for r in data.pop("rpc")]
    parsed["sampling"] = [SamplingCost(**c) for c in data.pop("sampling", [])]
    return BenchReport(**data, **parsed)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
