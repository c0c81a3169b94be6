"""`localspec bench` on the command line: flags in, checked into one `BenchPlan`, the table (or JSON) out.

What a bench runs (the pair loaded once, the relays, the peer, the busy rows) is `localspec.bench.suite`'s; this
module reads and checks the flags (the comma lists, the prompt file, the RPC workers), shows progress and prints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from localspec.bench.report import render, to_json
from localspec.bench.run import DEFAULT_PROMPTS
from localspec.errors import InvalidParamsError
from localspec.paths import Paths
from localspec.progress import StatusLine

from .flags import add_model_args
from .textinput import replaced_notice, to_text

TOKENS, ROUNDS = 64, 2  # the bench's and --clients' defaults
AGENT_TOKENS, AGENT_ROUNDS, AGENT_WORDS = 4, 3, 1200  # --agents': short answers after long prompts


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="measure plain vs speculative speed side by side (and llama-server)",
        description="Measure plain and speculative decoding side by side, interleaved (and llama-server with --peer). "
        "Docs: docs/benchmarks.md.",
    )
    add_model_args(p)
    p.add_argument(
        "--k", dest="ks", default="2,4,8", help="fixed draft lengths to run (comma-separated; default 2,4,8)"
    )
    p.add_argument("--temperature", dest="temperatures", default="0,0.8", help="temperatures (default 0,0.8)")
    p.add_argument("--verify", dest="verifies", default="pq,match", help="verifications at T > 0 (default pq,match)")
    p.add_argument(
        "--drafters",
        help="drafters to run side by side, e.g. model,model+ngram (comma-separated; default: the one --drafter or "
        "the pair loads)",
    )
    p.add_argument("--prompts", help="a text file, one prompt per line (default: four built-in chat prompts)")
    p.add_argument(
        "--image",
        dest="images",
        action="append",
        metavar="PATH",
        help="also run every prompt with this image before its text, as its own table (repeatable; needs --mmproj "
        "or a pair with a projector)",
    )
    p.add_argument("--tokens", type=int, help="tokens generated per run (default 64; --agents: 4)")
    p.add_argument("--rounds", type=int, help="rounds over every prompt and setting (default 2; --agents: 3)")
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
        "--structured",
        action="store_true",
        help="also run every setting with the answer constrained to a JSON schema (tok/s, tokens per pass, the mask)",
    )
    p.add_argument(
        "--rtt",
        dest="rtts",
        default="0,2,5,10",
        help="with --rpc: round trips (ms) that a relay on 127.0.0.1, started here, adds in front of the workers "
        "(default 0,2,5,10)",
    )
    p.add_argument(
        "--clients",
        help="instead: several clients at once against `localspec serve --parallel N` (and llama-server -np N with "
        "--peer), e.g. 1,2,4,8 (comma-separated client counts; --tokens, --rounds, --prompts and --peer apply)",
    )
    p.add_argument(
        "--agents",
        type=int,
        help="instead: N agents take turns against `localspec serve` (and llama-server with --peer), each with its own "
        "long system prompt and a new short message a turn: seconds a request and to the first token, prompt tokens "
        "read and reused (--tokens, --rounds, --parallel, --prompt-words and --peer apply)",
    )
    p.add_argument(
        "--prompt-words",
        type=int,
        help=f"with --agents: words of each agent's system prompt (default {AGENT_WORDS:,})",
    )
    p.add_argument(
        "--parallel",
        type=int,
        help="with --clients or --agents: the servers' slots (default: the most clients asked for; --agents: 1)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace, paths: Paths) -> int:
    """Check the flags, say what will run, run it (`bench.suite`), print the report."""
    from localspec.bench.suite import run_suite

    if args.images and (args.agents is not None or args.clients is not None):
        raise InvalidParamsError("--image goes with the bench's own runs: drop --agents or --clients")
    if args.agents is not None or args.prompt_words is not None:
        return _bench_agents(args, paths)
    if args.clients is not None or args.parallel is not None:
        return _bench_clients(args, paths)
    plan = _plan(args, paths)
    groups = len(plan.rtts) if plan.params.rpc else 1
    turns = 2 if plan.images else 1
    runs = plan.rounds * groups * len(plan.texts) * len(plan.settings) * turns
    line = _runs_line(runs, len(plan.texts), len(plan.settings), plan.rounds, groups, turns)
    print(f"localspec: note: {line}", file=sys.stderr)
    report = run_suite(plan, _progress())
    print(to_json(report) if args.json else "\n".join(render(report)))
    return 0


def _bench_clients(args: argparse.Namespace, paths: Paths) -> int:
    """`bench --clients`: the concurrent workload (`localspec.bench.clients`)."""
    from localspec.bench.clients import ClientsPlan, clients_json, render_clients, run_clients

    from .checks import check_run_args
    from .serve import serve_in_child

    if args.clients is None:
        raise InvalidParamsError("--parallel goes with --clients or --agents (e.g. --clients 1,2,4,8 --parallel 4)")
    clients = _parse_list(args.clients, int, "clients")
    if any(not 1 <= c <= 64 for c in clients):
        raise InvalidParamsError(f"--clients {args.clients}: each client count must be 1 to 64")
    parallel = args.parallel if args.parallel is not None else max(clients)
    if not 1 <= parallel <= 64:
        raise InvalidParamsError(f"--parallel {parallel} is out of range: use 1 to 64")
    tokens, rounds = _tokens_and_rounds(args, TOKENS, ROUNDS)
    plan = ClientsPlan(
        flags=check_run_args(args),
        paths=paths,
        clients=tuple(dict.fromkeys(clients)),
        parallel=parallel,
        prompts=tuple(_read_prompts(args.prompts)),
        tokens=tokens,
        rounds=rounds,
        peer=args.peer,
        command="localspec " + " ".join(sys.argv[1:]),
        serve=serve_in_child,
        structured=args.structured,
    )
    rounds = plan.rounds * len(plan.clients)
    print(f"localspec: note: bench --clients: {rounds} workloads per server, {parallel} slots", file=sys.stderr)
    report = run_clients(plan, _progress())
    print(clients_json(report) if args.json else "\n".join(render_clients(report)))
    return 0


def _bench_agents(args: argparse.Namespace, paths: Paths) -> int:
    """`bench --agents`: agents taking turns with long system prompts (`localspec.bench.agents`)."""
    from localspec.bench.agents import AgentsPlan, agents_json, render_agents, run_agents

    from .checks import check_run_args
    from .serve import serve_in_child

    if args.agents is None:
        raise InvalidParamsError("--prompt-words goes with --agents (e.g. --agents 2 --prompt-words 1200)")
    if args.clients is not None or args.prompts is not None:
        raise InvalidParamsError("--agents writes its own prompts and runs alone: drop --clients and --prompts")
    if not 1 <= args.agents <= 16:
        raise InvalidParamsError(f"--agents {args.agents} is out of range: use 1 to 16")
    parallel = args.parallel if args.parallel is not None else 1
    if not 1 <= parallel <= 64:
        raise InvalidParamsError(f"--parallel {parallel} is out of range: use 1 to 64")
    words = args.prompt_words if args.prompt_words is not None else AGENT_WORDS
    if not 10 <= words <= 20_000:
        raise InvalidParamsError(f"--prompt-words {words} is out of range: use 10 to 20000")
    tokens, rounds = _tokens_and_rounds(args, AGENT_TOKENS, AGENT_ROUNDS)
    if rounds < 2:
        raise InvalidParamsError("--agents needs --rounds ≥ 2: the turns after the first round are what it measures")
    plan = AgentsPlan(
        flags=check_run_args(args),
        paths=paths,
        agents=args.agents,
        parallel=parallel,
        words=words,
        tokens=tokens,
        rounds=rounds,
        peer=args.peer,
        command="localspec " + " ".join(sys.argv[1:]),
        serve=serve_in_child,
    )
    requests = plan.rounds * (plan.agents + 1)
    print(f"localspec: note: bench --agents: {requests} requests per server, {parallel} slot(s)", file=sys.stderr)
    report = run_agents(plan, _progress())
    print(agents_json(report) if args.json else "\n".join(render_agents(report)))
    return 0


def _tokens_and_rounds(args: argparse.Namespace, tokens: int, rounds: int) -> tuple[int, int]:
    """--tokens and --rounds, or these defaults; checked."""
    tokens = args.tokens if args.tokens is not None else tokens
    rounds = args.rounds if args.rounds is not None else rounds
    if tokens < 2 or rounds < 1:
        raise InvalidParamsError("--tokens must be ≥ 2 and --rounds ≥ 1")
    return tokens, rounds


def _plan(args: argparse.Namespace, paths: Paths):
    """The bench's plan from its flags, every one checked before anything loads (what it runs: `plan_bench`).

    Raises:
        LocalspecError: a flag out of range, no draft, a --prompts file that cannot be read.
    """
    from localspec.bench.suite import plan_bench
    from localspec.core.options import limits_of
    from localspec.core.params import DRAFTERS, VERIFY_RULES, SpeculativeParams
    from localspec.core.sampling import SamplingParams

    from .checks import check_run_args, read_images

    run = check_run_args(args)  # the model and thread flags, as generate and chat check them (before any loading)
    ks = _parse_list(args.ks, int, "k")
    temperatures = _parse_list(args.temperatures, float, "temperature")
    verifies = _parse_list(args.verifies, str, "verify")
    drafters = _parse_list(args.drafters, str, "drafters") if args.drafters is not None else []
    if any(d not in DRAFTERS for d in drafters):
        raise InvalidParamsError(f"--drafters takes {', '.join(DRAFTERS)} (comma-separated)")
    limits = limits_of(SamplingParams, SpeculativeParams)  # the option table's, as generate and chat check them
    k_max, temperature = limits["draft_max"].high, limits["temperature"]
    if any(k < 1 or k > k_max for k in ks) or not all(temperature.admits(t) for t in temperatures):
        raise InvalidParamsError(f"--k values must be 1..{k_max} and temperatures {temperature.describe()}")
    if any(v not in VERIFY_RULES for v in verifies):
        raise InvalidParamsError(f"--verify takes {' and/or '.join(VERIFY_RULES)}")
    tokens, rounds = _tokens_and_rounds(args, TOKENS, ROUNDS)
    rtts = _parse_list(args.rtts, float, "rtt")  # used with RPC workers (the flag's or the pair's)
    if any(not 0 <= r <= 1000 for r in rtts):
        raise InvalidParamsError("--rtt values are milliseconds from 0 to 1000")
    return plan_bench(
        run,
        paths,
        texts=_read_prompts(args.prompts),
        ks=ks,
        temperatures=temperatures,
        verifies=verifies,
        drafters=list(dict.fromkeys(drafters)),
        tokens=tokens,
        rounds=rounds,
        rtts=rtts,
        peer=args.peer,
        busy=args.busy,
        command="localspec " + " ".join(sys.argv[1:]),
        structured=args.structured,
        images=read_images(args.images or []),
    )


PROGRESS_EVERY = 30.0  # seconds between the progress lines a log or a pipe gets


def _progress():
    """The bench's progress line on stderr ("" erases it); not on a terminal, a line every PROGRESS_EVERY s."""
    line = StatusLine("bench: ", every=PROGRESS_EVERY)
    return lambda text: line.show(text) if text else line.clear()


def _runs_line(runs: int, prompts: int, settings: int, rounds: int, groups: int, turns: int = 1) -> str:
    """What the bench is about to do, said before loading (a long --prompts file can take hours)."""

    def n(count: int, what: str) -> str:
        return f"{count:,} {what}{'' if count == 1 else 's'}"

    parts = [n(prompts, "prompt"), n(settings, "setting"), n(rounds, "round")]
    if groups > 1:
        parts.append(n(groups, "round trip"))
    if turns > 1:
        parts.append(f"{turns} turns (text, image)")
    return f"bench: {n(runs, 'run')} ({' × '.join(parts)})"


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
        return list(DEFAULT_PROMPTS)
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
