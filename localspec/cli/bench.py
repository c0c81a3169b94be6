"""`localspec bench` on the command line: flags in, the engine loaded once, the table (or JSON) out.

The measuring is in `localspec.bench`; this module reads the flags (the comma lists, the prompt file), loads,
shows progress and prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from localspec.bench import run as bench
from localspec.bench.report import BenchReport, machine_line, now, render, to_json
from localspec.errors import InvalidParamsError, LocalspecError
from localspec.paths import Paths
from localspec.progress import StatusLine

from .flags import add_model_args
from .textinput import replaced_notice, to_text


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="measure plain vs speculative speed side by side (and llama-server)")
    add_model_args(p)
    p.add_argument(
        "--k", dest="ks", default="2,4,8", help="fixed draft lengths to run (comma-separated; default 2,4,8)"
    )
    p.add_argument("--temperature", dest="temperatures", default="0,0.8", help="temperatures (default 0,0.8)")
    p.add_argument("--verify", dest="verifies", default="pq,match", help="verifications at T > 0 (default pq,match)")
    p.add_argument("--prompts", help="a text file, one prompt per line (default: four built-in chat prompts)")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per run (default 64)")
    p.add_argument("--rounds", type=int, default=2, help="rounds over every prompt and setting (default 2)")
    p.add_argument(
        "--peer",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="also run llama-server (PATH, or its folder; alone: the one on PATH)",
    )
    p.add_argument("--busy", action="store_true", help="also run plain and adaptive with one core kept busy")
    p.add_argument(
        "--rtt",
        dest="rtts",
        default="0,2,5,10",
        help="with --rpc: round trips (ms) that a relay on 127.0.0.1, started here, adds in front of the workers "
        "(default 0,2,5,10)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace, paths: Paths) -> int:
    from localspec.core.options import limits_of
    from localspec.core.params import VERIFY_RULES, SpeculativeParams
    from localspec.core.sampling import SamplingParams
    from localspec.core.session import ChatFormat, Message
    from localspec.models.loading import load_engine, load_params, resolve_models, weights_progress

    from .checks import check_run_args

    run = check_run_args(args)  # the model and thread flags, as generate and chat check them (before any loading)
    ks = _parse_list(args.ks, int, "k")
    temperatures = _parse_list(args.temperatures, float, "temperature")
    verifies = _parse_list(args.verifies, str, "verify")
    limits = limits_of(SamplingParams, SpeculativeParams)  # the option table's, as generate and chat check them
    k_max, temperature = limits["draft_max"].high, limits["temperature"]
    if any(k < 1 or k > k_max for k in ks) or not all(temperature.admits(t) for t in temperatures):
        raise InvalidParamsError(f"--k values must be 1..{k_max} and temperatures {temperature.describe()}")
    if any(v not in VERIFY_RULES for v in verifies):
        raise InvalidParamsError(f"--verify takes {' and/or '.join(VERIFY_RULES)}")
    if args.tokens < 2 or args.rounds < 1:
        raise InvalidParamsError("--tokens must be ≥ 2 and --rounds ≥ 1")
    texts = _read_prompts(args.prompts)
    binary = None
    notes = []
    if args.peer is not None:
        from localspec.bench.peer import PeerError, find_llama_server

        try:
            binary = find_llama_server(args.peer or None)
        except PeerError as e:
            notes.append(f"llama-server not run: {e}")
    resolved = resolve_models(run, paths)
    if resolved.draft is None:
        raise InvalidParamsError("bench compares speculative with plain decoding: it needs a draft (--draft or --pair)")
    target, draft, defaults = str(resolved.target), str(resolved.draft), resolved.defaults
    params = load_params(run, defaults, has_draft=True)
    busy = args.busy
    relays = []
    if params.rpc:  # a relay on 127.0.0.1 in front of each worker adds the round trip (--rtt)
        from localspec.bench.relay import DelayRelay
        from localspec.llama.rpc import Endpoint, probe

        rtts = _parse_list(args.rtts, float, "rtt")
        if any(not 0 <= r <= 1000 for r in rtts):
            raise InvalidParamsError("--rtt values are milliseconds from 0 to 1000")
        for e in params.rpc:  # the user's own address in any error, not the relay's that stands in front of it
            probe(Endpoint.parse(e))
        lifetime = 600.0 + 60.0 * args.rounds * len(rtts)  # bounded: the relays end with the run, or after this
        relays = [DelayRelay(Endpoint.parse(e), max_connections=16, lifetime=lifetime) for e in params.rpc]
        params = dataclasses.replace(params, rpc=tuple(str(r.endpoint) for r in relays))
        if args.peer is not None or busy:
            notes.append("--peer and --busy are not run with --rpc")
            binary, busy = None, False
    chosen = bench.settings_for(ks, temperatures, verifies)
    groups = len(rtts) if relays else 1
    runs = args.rounds * groups * len(texts) * len(chosen)
    print(f"localspec: note: {_runs_line(runs, len(texts), len(chosen), args.rounds, groups)}", file=sys.stderr)
    show = _progress()
    try:
        engine = load_engine(target, draft, params, weights_progress(params, show))
    except BaseException:
        for relay in relays:
            relay.close()
        raise
    try:
        threads = engine.target.ctx.n_threads  # at the start (it follows the free cores unless --threads)
        try:
            fmt = ChatFormat(engine.target_model, run.chat_template or defaults.chat_template)
            prompts = _tokenize(texts, lambda t: fmt.tokens([Message("user", t)]), show)
        except LocalspecError:
            prompts = _tokenize(texts, engine.tokenize, show)  # a base model: the plain text
            notes.append("the target has no chat template: prompts are plain text")
        report = BenchReport(
            machine=machine_line(threads),
            command="localspec " + " ".join(sys.argv[1:]),
            date=now(),
            target=target,
            draft=draft,
            threads=threads,
            notes=notes,
        )
        if relays:
            report.rpc = bench.run_rpc_bench(
                engine, prompts, chosen, relays, rtts, tokens=args.tokens, rounds=args.rounds, progress=show
            )
        else:
            tallies = bench.run_bench(engine, prompts, chosen, tokens=args.tokens, rounds=args.rounds, progress=show)
            report.rows = bench.rows_from(engine, prompts, tallies)
            report.logit_noise = bench.logit_noise(engine, prompts)
            report.sampling = bench.sampling_costs(engine, prompts[0], temperatures)
        if binary is not None:
            from localspec.bench.peer import PeerError, has_draft_sampling

            try:
                draft_sampling = has_draft_sampling(binary)
                peer_chosen = bench.peer_settings(chosen, draft_sampling=draft_sampling)
                if len(peer_chosen) < len(bench.peer_settings(chosen)):
                    report.notes.append(
                        "this llama-server has no --spec-draft-sampling (an older build): it verifies by sampling "
                        "the target and keeping an equal draft, so it has no pq rows"
                    )
                peer = bench.run_peer(
                    binary,
                    target,
                    draft,
                    prompts,
                    peer_chosen,
                    tokens=args.tokens,
                    rounds=args.rounds,
                    threads=threads,
                    n_ctx=engine.n_ctx,
                    n_gpu_layers=run.n_gpu_layers,
                    progress=show,
                    draft_sampling=draft_sampling,
                )
                by_name = {(s.name, s.temperature): v for s, v in peer.items()}
                report.rows = [
                    dataclasses.replace(
                        r,
                        peer_tokens_per_second=by_name[(r.setting, r.temperature)][0],
                        peer_acceptance=by_name[(r.setting, r.temperature)][1],
                    )
                    if (r.setting, r.temperature) in by_name
                    else r
                    for r in report.rows
                ]
            except PeerError as e:
                report.notes.append(f"llama-server failed: {e}")
        if busy:
            pair = [s for s in chosen if s.temperature == temperatures[0] and (s.k == 0 or s.k is None)]
            report.busy = bench.busy_rows(engine, prompts, pair, args.tokens, show)
    finally:
        engine.close()
        for relay in relays:
            relay.close()
        show("")
    print(to_json(report) if args.json else "\n".join(render(report)))
    return 0


PROGRESS_EVERY = 30.0  # seconds between the progress lines a log or a pipe gets


def _progress():
    """The bench's progress line on stderr ("" erases it); not on a terminal, a line every PROGRESS_EVERY s."""
    line = StatusLine("bench: ", every=PROGRESS_EVERY)
    return lambda text: line.show(text) if text else line.clear()


def _runs_line(runs: int, prompts: int, settings: int, rounds: int, groups: int) -> str:
    """What the bench is about to do, said before loading (a long --prompts file can take hours)."""

    def n(count: int, what: str) -> str:
        return f"{count:,} {what}{'' if count == 1 else 's'}"

    parts = [n(prompts, "prompt"), n(settings, "setting"), n(rounds, "round")]
    if groups > 1:
        parts.append(n(groups, "round trip"))
    return f"bench: {n(runs, 'run')} ({' × '.join(parts)})"


def _tokenize(texts: list[str], tokenize, show) -> list[list[int]]:
    """The prompts' tokens, with progress (a --prompts file may hold many thousands)."""
    prompts = []
    for i, text in enumerate(texts, 1):
        prompts.append(tokenize(text))
        if i % 1000 == 0:
            show(f"preparing the prompts: {i:,}/{len(texts):,}")
    return prompts


def _parse_list(text: str, kind: type, name: str) -> list:
    """A comma-separated flag's values (`--k 2,4,8`); one line naming `--name` when it does not parse or is empty."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise InvalidParamsError(f"--{name} is empty")
    if not all(items):
        raise InvalidParamsError(f"--{name} {text!r} has an empty value: separate the values with single commas")
    try:
        return [kind(x) for x in items]
    except ValueError:
        raise InvalidParamsError(f"--{name} takes a comma-separated list, e.g. 2,4,8 (got {text!r})") from None


def _read_prompts(path: str | None) -> list[str]:
    """The --prompts file's non-empty lines, or the bench's built-in prompts."""
    if path is None:
        return list(bench.DEFAULT_PROMPTS)
    try:
        text, replaced = to_text(Path(path).read_bytes())
    except OSError as e:
        raise InvalidParamsError(f"cannot read --prompts {path}: {e.strerror}") from None
    if replaced:
        print(f"localspec: note: {replaced_notice(replaced, f'--prompts {path}')}", file=sys.stderr)
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise InvalidParamsError(f"--prompts {path} has no prompt (one per line)")
    return prompts
