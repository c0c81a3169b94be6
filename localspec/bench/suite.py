"""One whole `localspec bench`: what it runs (`plan_bench`: the pair and its drafter, the settings, the peer, the
relays' round trips), then the run itself — load the pair once, run every setting interleaved, round by round with
llama-server's round as the peer after each of localspec's, the exactness checks and the sampling yardstick, the
busy-core rows — and the report. With `--image`, a round of image turns (images.py) beside each round of text turns,
the peer's too. The CLI (`localspec.cli.bench`) reads and checks the flags and prints the report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from localspec.core.engine import Engine
from localspec.core.params import LoadParams, needs_draft_model
from localspec.core.session import ChatFormat, Message
from localspec.errors import InvalidParamsError, LocalspecError
from localspec.llama.assistant import is_assistant
from localspec.llama.footprint import read_header
from localspec.llama.pictures import Image
from localspec.llama.rpc import Endpoint, probe
from localspec.models.flags import RunFlags
from localspec.models.loading import load_engine, load_params, resolve_models, weights_progress
from localspec.paths import Paths

from . import peer_runs
from . import run as bench
from .exactness import logit_noise
from .images import image_prompts, peer_prompts
from .report import BenchReport, BestPeer, PeerRow, Row, machine_line, now
from .run import Setting, settings_for
from .yardstick import sampling_costs


@dataclass(frozen=True, slots=True)
class BenchPlan:
    """What one bench runs: the pair, how it loads, the prompts and the settings, and what else to measure."""

    target: str
    draft: str
    params: LoadParams
    chat_template: str | None
    texts: list[str]  # the prompts, as text
    settings: list[Setting]
    temperatures: list[float]
    tokens: int  # per run
    rounds: int
    command: str  # the command line, for the report
    rtts: list[float] = field(default_factory=list)  # with RPC workers: the round trips (ms) a relay adds
    headline: tuple[str, str] = ("", "localspec default")  # the drafter whose adaptive rows the peer's best meets
    # ("": the loaded one) and what the headline calls them
    peer: Path | None = None  # llama-server's binary, to run as the peer (None: no peer)
    busy: bool = False  # add the rows with one core kept busy
    notes: list[str] = field(default_factory=list)  # what the report must say up front
    images: tuple[tuple[str, Image], ...] = ()  # `--image`: (the path as given, the image), shown in image turns


def plan_bench(
    run: RunFlags,
    paths: Paths,
    *,
    texts: list[str],
    ks: list[int],
    temperatures: list[float],
    verifies: list[str],
    tokens: int,
    rounds: int,
    rtts: list[float],
    peer: str | None,
    drafters: list[str] = (),
    busy: bool,
    command: str,
    structured: bool = False,
    images: Sequence[tuple[str, Image]] = (),
) -> BenchPlan:
    """What a bench of these checked flags runs: the pair (a models.toml pair with no draft drafts with its target's
    MTP head), how it loads, the settings, llama-server as the peer where it can run, the round trips with RPC.

    Args:
        run: the model and thread flags, checked (`check_run_args`).
        paths: localspec's folders.
        texts, ks, temperatures, verifies, tokens, rounds, rtts, busy, command: the bench's checked flags.
        structured: also run every setting with the answer constrained to a JSON schema (run.py STRUCTURED).
        peer: llama-server's path or folder ("": the one on PATH; None: no peer).
        drafters: the drafters to run side by side (empty: the one the pair loads, unnamed in the rows).
        images: `--image`'s checked images, by the path given: also run every prompt with them before its text.

    Raises:
        LocalspecError: nothing to compare with plain decoding (no draft, no head), images for a pair without a
            projector, an RPC worker that does not answer.
    """
    notes, binary, given = [], None, run.drafter
    if peer is not None:
        from .peer import PeerError, find_llama_server

        try:
            binary = find_llama_server(peer or None)
        except PeerError as e:
            notes.append(f"llama-server not run: {e}")
    resolved = resolve_models(run, paths)
    if resolved.draft is None and resolved.name is not None and not run.drafter:
        from localspec.llama.footprint import read_footprint

        if not read_footprint(resolved.target).nextn_layers:
            raise InvalidParamsError(
                f"pair {resolved.name!r} has no draft and its target {resolved.target.name} no MTP head: bench has "
                "nothing to compare with plain decoding (give the pair a draft)"
            )
        run = dataclasses.replace(run, drafter="mtp")  # a models.toml pair with no draft: its target's own head
    head = run.drafter == "mtp"  # the target's own MTP head drafts: no draft file
    if resolved.draft is None and not head:
        raise InvalidParamsError(
            "bench compares speculative with plain decoding: it needs a draft (--draft or --pair), or --drafter mtp "
            "for a target with an MTP head"
        )
    if head and binary is not None:
        notes.append("llama-server not run: --drafter mtp has no draft file to give it")
        binary = None
    binary = _sidecar_checks(resolved.draft, drafters, binary, notes)
    params = load_params(run, resolved.defaults, has_draft=True)
    headline = ("", "localspec default" if given is None else f"localspec --drafter {given}")
    if drafters:
        default = load_params(dataclasses.replace(run, drafter=None), resolved.defaults, has_draft=not head).drafter
        headline = (default, "localspec default") if default in drafters else (drafters[0], f"localspec {drafters[0]}")
    models = [d for d in drafters if needs_draft_model(d)]
    if head and (models or set(drafters) - {"mtp", "ngram", "none"}):
        raise InvalidParamsError("--drafters: this bench drafts with the target's MTP head and has no draft model")
    if "mtp" in drafters and not head:
        raise InvalidParamsError("--drafters mtp: bench the MTP head with --drafter mtp (it loads with the target)")
    if models and not needs_draft_model(params.drafter):  # the draft model loads only for a model drafter
        params = dataclasses.replace(params, drafter=models[0])
    if images and params.mmproj is None:
        raise InvalidParamsError(
            f"{resolved.target.name} reads no images: give bench --image its projector with --mmproj PATH (or a pair "
            "with mmproj in models.toml)"
        )
    if images and params.rpc:
        raise InvalidParamsError("bench --image runs on this machine: drop --rpc (or the pair's rpc workers)")
    for e in params.rpc:  # the user's own address in any error, not the relay's that stands in front of it
        probe(Endpoint.parse(e))
    return BenchPlan(
        target=str(resolved.target),
        draft="" if head else str(resolved.draft),  # "": the target's own head
        params=params,
        chat_template=run.chat_template or resolved.defaults.chat_template,
        texts=texts,
        settings=settings_for(ks, temperatures, verifies, drafters or [""], structured=structured),
        headline=headline,
        temperatures=temperatures,
        tokens=tokens,
        rounds=rounds,
        command=command,
        rtts=rtts if params.rpc else [],
        peer=binary,
        busy=busy,
        notes=notes,
        images=tuple(images),
    )


def run_suite(plan: BenchPlan, show: Callable[[str], None]) -> BenchReport:
    """Run `plan` (progress through `show`; "" erases it) and return its report.

    Raises:
        LocalspecError: a model that does not load (`plan_bench` has checked that each RPC worker answers).
    """
    params, notes, busy, binary = plan.params, list(plan.notes), plan.busy, plan.peer
    relays = []
    if params.rpc:  # a relay on 127.0.0.1 in front of each worker adds the round trip (--rtt)
        from .relay import DelayRelay

        lifetime = 600.0 + 60.0 * plan.rounds * len(plan.rtts)  # bounded: the relays end with the run, or after this
        relays = [DelayRelay(Endpoint.parse(e), max_connections=16, lifetime=lifetime) for e in params.rpc]
        params = dataclasses.replace(params, rpc=tuple(str(r.endpoint) for r in relays))
        if binary is not None or busy:
            notes.append("--peer and --busy are not run with --rpc")
            binary, busy = None, False
    try:
        engine = load_engine(plan.target, plan.draft, params, weights_progress(params, show))
    except BaseException:
        for relay in relays:
            relay.close()
        raise
    try:
        threads = engine.target.ctx.n_threads  # at the start (it follows the free cores unless --threads)
        try:
            fmt = ChatFormat(engine.target_model, plan.chat_template)
            prompts = _tokenize(plan.texts, lambda t: fmt.tokens([Message("user", t)]), show)
        except LocalspecError:
            prompts = _tokenize(plan.texts, engine.tokenize, show)  # a base model: the plain text
            notes.append("the target has no chat template: prompts are plain text")
        report = BenchReport(
            machine=machine_line(threads),
            command=plan.command,
            date=now(),
            target=plan.target,
            draft=f"{plan.draft} (a Gemma 4 assistant)" if engine.drafter.kind == "assistant" else plan.draft,
            threads=threads,
            notes=notes,
            placement=engine.plan.to_dict() if engine.plan else None,
        )
        chosen, tokens, rounds = plan.settings, plan.tokens, plan.rounds
        if relays:
            report.rpc = bench.run_rpc_bench(
                engine, prompts, chosen, relays, plan.rtts, tokens=tokens, rounds=rounds, progress=show
            )
        else:
            turns = {"text": prompts}
            if plan.images:  # the same prompts with the pictures before the text
                turns["image"] = image_prompts(engine, plan.chat_template, plan.texts, [i for _, i in plan.images])
                report.images = [f"{name} ({i.format} {i.width}×{i.height})" for name, i in plan.images]
            peer = _Peer(report, binary, plan, engine, prompts, threads, show) if binary is not None else None
            tallies: dict[str, dict[Setting, bench.Tally]] = {kind: {} for kind in turns}
            for r in range(rounds):  # a round of every setting on each kind of turn, then the peer's: the same minutes
                for kind in bench.rotated(list(turns), r):
                    bench.run_bench(
                        engine,
                        turns[kind],
                        chosen,
                        tokens=tokens,
                        rounds=range(r, r + 1),
                        tallies=tallies[kind],
                        progress=show if kind == "text" else lambda text: show(f"image turns {text}"),
                    )
                if peer is not None:
                    peer.run(r)
            report.rows = bench.rows_from(engine, prompts, tallies["text"])
            if "image" in turns:
                report.image_rows = bench.rows_from(engine, turns["image"], tallies["image"])
            report.logit_noise = logit_noise(engine, prompts)
            report.sampling = sampling_costs(engine, prompts[0], plan.temperatures)
            if peer is not None:
                peer.finish()
        if busy:
            pair = [s for s in chosen if s.temperature == plan.temperatures[0] and (s.k == 0 or s.k is None)]
            report.busy = bench.busy_rows(engine, prompts, pair, tokens, show)
    finally:
        engine.close()
        for relay in relays:
            relay.close()
        show("")
    return report


class _Peer:
    """llama-server as the peer: on the same prompts and settings, and with its own strong settings
    (`best_peer_settings`), a round at a time between localspec's (`run`); then (`finish`) its speed and acceptance
    join each row, with each row's ratio to the peer's fastest, and the headline compares localspec's default with
    that fastest. A peer that fails is a note, and no peer column."""

    def __init__(
        self,
        report: BenchReport,
        binary: Path,
        plan: BenchPlan,
        engine: Engine,
        prompts: list[list[int]],
        threads: int,
        show: Callable[[str], None],
    ) -> None:
        from .peer import PeerError, peer_build

        self.report, self.binary, self.plan, self.prompts, self.show = report, binary, plan, prompts, show
        self.n_ctx, self.placed, self.threads = engine.n_ctx, engine.plan, threads
        self.tally: peer_runs.PeerTally | None = peer_runs.PeerTally()
        self.images: peer_runs.PeerImages | None = None  # the image turns it runs (`bench --image`)
        try:
            build = peer_build(binary)
        except PeerError as e:
            self._failed(e)
            return
        free = [s for s in plan.settings if s.k is not None and not s.schema]  # the peer runs free text only
        same = {s: peer_runs.same_k(s, draft_sampling=build.draft_sampling) for s in free}
        self.same = {s: p for s, p in same.items() if build.draft_sampling or not peer_runs.needs_draft_sampling(s)}
        if len(self.same) < len(free):
            report.notes.append(
                "this llama-server has no --spec-draft-sampling (an older build): it verifies by sampling "
                "the target and keeping an equal draft, so it has no pq rows"
            )
        if "ngram-mod" not in build.spec_types:
            report.notes.append("this llama-server has no ngram-mod: its best is sought among its draft settings")
        # a same-k run and a strong setting that are one run: once
        strong = peer_runs.best_peer_settings(plan.temperatures, build)
        self.runs = {_runs_as(p): p for p in [*self.same.values(), *strong]}
        if plan.images and not build.mmproj:
            report.notes.append("this llama-server has no --mmproj: it runs no image turns")
        elif plan.images:
            shown = [image for _, image in plan.images]
            texts = peer_prompts(engine.target_model, plan.chat_template, plan.texts, shown)
            self.images = peer_runs.PeerImages(str(plan.params.mmproj), texts, [image.data for image in shown])

    def _failed(self, e: Exception) -> None:
        self.report.notes.append(f"llama-server failed: {e}")
        self.tally = None

    def run(self, round_: int) -> None:
        """The peer's round `round_` of every setting (nothing once it failed)."""
        from .peer import PeerError

        if self.tally is None:
            return
        plan = self.plan
        try:
            peer_runs.run_peer(
                self.binary,
                plan.target,
                plan.draft,
                self.prompts,
                list(dict.fromkeys(self.runs.values())),
                tokens=plan.tokens,
                rounds=range(round_, round_ + 1),
                threads=self.threads,
                n_ctx=self.n_ctx,
                placed=self.placed,
                progress=self.show,
                tally=self.tally,
                images=self.images,
            )
        except PeerError as e:
            self._failed(e)

    def finish(self) -> None:
        """The peer's figures into the report's rows, its own settings' table and the headline (of the text turns,
        and of the image turns where it ran them)."""
        if self.tally is None:
            return
        report, images = self.report, self.images
        report.rows, report.peer, report.best_peer = self._joined(report.rows, self.tally)
        if images is not None and images.failed:
            report.notes.append(f"llama-server ran no image turns: {images.failed}")
        elif images is not None:
            report.image_rows, report.image_peer, report.image_best_peer = self._joined(report.image_rows, images.tally)

    def _joined(self, rows: list[Row], tally: peer_runs.PeerTally) -> tuple[list[Row], list[PeerRow], list[BestPeer]]:
        """`rows` with the peer's figures beside them, its settings as they ran, and the headline."""
        ran = tally.result()
        result = {key: ran[p] for key, p in self.runs.items()}
        by_row = {(s.name, s.temperature): result[_runs_as(p)] for s, p in self.same.items()}
        peer = [
            PeerRow(p.name, p.temperature, p.spec, p.k, p.probabilistic, *ran[p])
            for p in sorted(dict.fromkeys(self.runs.values()), key=lambda p: p.temperature)
        ]
        best = {}
        for p in peer:
            if p.tokens_per_second > best.get(p.temperature, (None, 0.0))[1]:
                best[p.temperature] = (p.setting, p.tokens_per_second)
        rows = [
            dataclasses.replace(
                r,
                peer_tokens_per_second=by_row.get((r.setting, r.temperature), (None, None))[0],
                peer_acceptance=by_row.get((r.setting, r.temperature), (None, None))[1],
                best_peer_ratio=r.tokens_per_second / best[r.temperature][1]
                if r.temperature in best and not r.schema
                else None,
            )
            for r in rows
        ]
        return rows, peer, _headline(rows, best, self.plan.headline)


def _runs_as(p: peer_runs.PeerSetting) -> tuple:
    """What makes two peer settings one run (their names aside)."""
    return (p.temperature, p.spec, p.k, p.probabilistic)


def _headline(rows: list[Row], best: dict[float, tuple[str, float]], headline: tuple[str, str]) -> list[BestPeer]:
    """Per temperature, localspec's default — the adaptive row of `headline`'s drafter, pq at T > 0 — against the
    peer's fastest setting."""
    drafter, label = headline
    out = []
    for r in rows:
        default = r.k is None and r.drafter == drafter and not r.schema and (r.temperature == 0 or r.verify == "pq")
        if default and r.temperature in best:
            peer_setting, peer_rate = best[r.temperature]
            ratio = r.tokens_per_second / peer_rate if peer_rate else 0.0
            out.append(BestPeer(r.temperature, label, r.setting, r.tokens_per_second, peer_setting, peer_rate, ratio))
    return out


def _tokenize(texts: list[str], tokenize, show) -> list[list[int]]:
    """The prompts' tokens, with progress (a --prompts file may hold many thousands)."""
    prompts = []
    for i, text in enumerate(texts, 1):
        prompts.append(tokenize(text))
        if i % 1000 == 0:
            show(f"preparing the prompts: {i:,}/{len(texts):,}")
    return prompts


def _sidecar_checks(draft: Path | None, drafters: Sequence[str], binary: Path | None, notes: list[str]) -> Path | None:
    """A Gemma 4 assistant sidecar as the draft drafts as "assistant" (core/load.py), beside ngram and none only; the
    peer is not given one. Returns the peer's binary (None: not run).

    Raises:
        InvalidParamsError: --drafters that this draft cannot draft as.
    """
    if draft is None or not is_assistant(read_header(draft).arch):
        if "assistant" in drafters:
            raise InvalidParamsError(
                "--drafters assistant: give the target's Gemma 4 assistant (mtp-*.gguf) as --draft"
            )
        return binary
    if set(drafters) - {"assistant", "ngram", "none"}:
        raise InvalidParamsError(
            f"--drafters: {draft.name} is a Gemma 4 assistant: it drafts as assistant, beside ngram and none"
        )
    if binary is not None:
        notes.append("llama-server not run: bench does not hand it a Gemma 4 assistant yet")
    return None
