"""`localspec bench --agents`: agents taking turns against one server, each with its own long system prompt.

An agent and its sub-agent (or two editors) share a server: each sends its long system prompt and a short new message,
in turn, so on a server with fewer slots than agents a prompt's cells go to the other agent's, and the agent's next
turn either restores its prompt from RAM (llama-server's `--cache-ram`, on by default; localspec's prompt cache,
core/promptcache.py) or reads it all again. The servers are `bench --clients`' (`clients.started_servers`). Each round,
for each server in turn (the order rotating round by round), every agent sends one streamed greedy chat request; after
the rounds, each server reads one fresh long prompt a round (the cold prompt). The report gives per server the medians
after the first round of the seconds a request, the seconds to the first token and the prompt tokens read and reused
(the answer's `timings.prompt_n` and `cache_n`; of those reused, localspec's `prompt_restored` came from RAM); the
cold prompt's first token (the first round's prompts and the fresh ones); and localspec's times over each server's.
"""

from __future__ import annotations

import contextlib
import json
import random
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from localspec.models.flags import RunFlags
from localspec.paths import Paths

from .clients import LOCAL, machine, now, rotated, started_servers
from .peer import PeerError

SEED = 56  # the agents' prompts: agent i's system prompt is drawn from SEED + i, the cold prompts' from COLD_SEED + r
COLD_SEED = SEED + 1000
TURNS, COLD = "turns", "cold prompt"

# Plain words the prompts are drawn from (no network, no file): every tokenizer reads them as a few tokens each.
WORDS = (
    "the a an and or but if when while after before because so then also only each every other same new old first "
    "last long short small large good bad right wrong early late high low open close read write keep move take give "
    "make find show tell ask answer check change build test run stop start wait send return call name list file line "
    "word page note table row column value field record report message request reply error warning rule step task "
    "goal plan order number count size time date day week month year hour minute user team client server service "
    "system model tool agent editor project branch commit change review patch issue bug fix code function class method "
    "module package library document section example summary detail reason result output input format style tone "
    "clear brief exact careful polite direct simple plain useful safe private public local remote always never "
    "usually sometimes please must should may can will would could do not with without from into over under about "
    "between through against during within"
).split()


@dataclass(frozen=True, slots=True)
class AgentsPlan:
    """What `bench --agents` runs (checked flags)."""

    flags: RunFlags
    paths: Paths
    agents: int  # agents taking turns, each with its own system prompt
    parallel: int  # slots of each server: localspec's --parallel, llama-server's -np
    words: int  # words of each system prompt
    tokens: int  # max_tokens of each request
    rounds: int  # turns of each agent (the first is its cold prompt)
    peer: str | None  # llama-server's path or folder ("": on PATH; None: no peer)
    command: str
    serve: Callable  # runs localspec's server in the child process (`clients.LocalServer`)


@dataclass(frozen=True, slots=True)
class Turn:
    """One streamed request as the client saw it and the server counted it."""

    seconds: float  # send to the whole answer
    first_token: float  # send to the first chunk with text
    prompt_n: int  # prompt tokens the server read (`timings.prompt_n`)
    cache_n: int  # prompt tokens it reused, from its slot or its prompt cache (`timings.cache_n`)
    restored: int | None  # of those, the ones restored from RAM (localspec's `prompt_restored`; None: not said)


@dataclass(frozen=True, slots=True)
class AgentsRow:
    workload: str  # TURNS (the turns after the first round) or COLD (a fresh system prompt's request)
    server: str
    requests: int  # the requests the medians are over
    seconds: float  # send to the whole answer, median
    first_token: float  # send to the first token, median
    prompt_n: float  # prompt tokens read, median
    cache_n: float  # prompt tokens reused, median
    restored: float | None  # of those, restored from RAM, median (None: the server does not say)
    ratio: float | None  # localspec's seconds over this server's (None: localspec's row)
    first_token_ratio: float | None  # the same for the first token


@dataclass(slots=True)
class AgentsReport:
    command: str
    machine: str
    date: str
    agents: int
    parallel: int
    words: int
    tokens: int
    rounds: int
    rows: list[AgentsRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def system_prompt(seed: int, words: int) -> str:
    """A system prompt of `words` words drawn from `seed` alone: the same seed, the same prompt; another, another."""
    rng = random.Random(seed)
    out = f"You are agent {seed}. Follow these standing instructions on every turn.".split()
    while len(out) < words:
        sentence = rng.choices(WORDS, k=rng.randint(6, 14))
        out += [sentence[0].capitalize(), *sentence[1:-1], sentence[-1] + "."]
    return " ".join(out[:words])


def user_message(seed: int, turn: int) -> str:
    """A short message (about a dozen tokens), different each turn."""
    words = random.Random(seed * 7919 + turn).choices(WORDS, k=6)
    return f"Step {turn + 1}: {' '.join(words)}?"


def conversation(agent: int, turn: int, words: int) -> list[dict]:
    """Agent `agent`'s request at its turn `turn`: its own system prompt, then the turn's message."""
    return _messages(SEED + agent, turn, words)


def cold_conversation(r: int, words: int) -> list[dict]:
    """A request whose system prompt no agent has sent (round r's cold prompt)."""
    return _messages(COLD_SEED + r, 0, words)


def _messages(seed: int, turn: int, words: int) -> list[dict]:
    system = {"role": "system", "content": system_prompt(seed, words)}
    return [system, {"role": "user", "content": user_message(seed, turn)}]


def ask_streamed(port: int, model: str, messages: Sequence[dict], tokens: int) -> Turn:
    """One greedy streamed chat request: its times and the server's prompt counts (the last chunk's `timings`).

    Raises:
        PeerError: no answer, an error in the stream, or an answer without `timings`.
    """
    body = {"model": model, "messages": list(messages), "max_tokens": tokens, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    first, timings, ours = None, None, {}
    try:
        with urllib.request.urlopen(request, timeout=1800) as r:
            for raw in r:  # server-sent events: `data: {...}` lines, then `data: [DONE]`
                line = raw.strip()
                if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    raise PeerError(f"the server's stream ended on an error: {json.dumps(chunk['error'])[:200]}")
                if first is None and any(_text(choice) for choice in chunk.get("choices") or ()):
                    first = time.perf_counter() - t0
                timings = chunk.get("timings") or timings
                ours = chunk.get("localspec") or ours
    except urllib.error.HTTPError as e:  # e.g. a prompt longer than the context: the server's own words
        said = e.read().decode(errors="replace").strip()
        with contextlib.suppress(ValueError, KeyError, TypeError):  # OpenAI's error object, else the body as it is
            said = str(json.loads(said)["error"]["message"])
        raise PeerError(f"the server refused a chat request ({e.code}): {said[:300]}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise PeerError(f"the server did not answer a chat request: {e}") from e
    seconds = time.perf_counter() - t0
    try:
        prompt_n, cache_n = int(timings["prompt_n"]), int(timings["cache_n"])
    except (KeyError, TypeError, ValueError):
        raise PeerError("the server's streamed answer has no timings.prompt_n and cache_n") from None
    restored = ours.get("prompt_restored")
    return Turn(seconds, seconds if first is None else first, prompt_n, cache_n, restored)


def _text(choice: dict) -> bool:
    delta = choice.get("delta") or {}
    return bool(delta.get("content") or delta.get("reasoning_content"))


def run_agents(plan: AgentsPlan, show: Callable[[str], None] = lambda _: None) -> AgentsReport:
    """Start the servers, let the agents take their turns round by round, then the cold prompts; stop them.

    Raises:
        LocalspecError: localspec's server did not start, or a server did not answer (llama-server's failures to start
            are notes in the report).
    """
    report = AgentsReport(
        plan.command, machine(plan.flags), now(), plan.agents, plan.parallel, plan.words, plan.tokens, plan.rounds
    )
    turns: dict[tuple[str, str], list[Turn]] = {}
    with started_servers(plan.serve, plan.flags, plan.paths, plan.parallel, plan.peer, report.notes, show) as servers:
        names = list(servers)
        for name, server in servers.items():  # warm-up: a short request, not measured
            show(f"warming {name}")
            ask_streamed(server.port, server.model, [{"role": "user", "content": "Hello."}], 2)
        for r in range(plan.rounds):
            for name in rotated(names, r):
                show(f"round {r + 1}/{plan.rounds}: {plan.agents} agents on {name}")
                for agent in range(plan.agents):
                    turn = ask_streamed(servers[name].port, servers[name].model, conversation(agent, r, plan.words),
                                        plan.tokens)  # fmt: skip
                    turns.setdefault((COLD if r == 0 else TURNS, name), []).append(turn)
        for r in range(plan.rounds):
            for name in rotated(names, r):
                show(f"cold prompt {r + 1}/{plan.rounds} on {name}")
                cold = ask_streamed(servers[name].port, servers[name].model, cold_conversation(r, plan.words),
                                    plan.tokens)  # fmt: skip
                turns[(COLD, name)].append(cold)
    local = LOCAL.format(n=plan.parallel)
    report.rows = [
        _row(workload, name, turns[(workload, name)], turns[(workload, local)])
        for workload in (TURNS, COLD)
        for name in names
    ]
    return report


def _row(workload: str, name: str, runs: list[Turn], ours: list[Turn]) -> AgentsRow:
    """One server's medians on one workload, and localspec's times (`ours`) over its."""
    seconds, first = statistics.median(t.seconds for t in runs), statistics.median(t.first_token for t in runs)
    ours_seconds, ours_first = (
        statistics.median(t.seconds for t in ours),
        statistics.median(t.first_token for t in ours),
    )
    restored = [t.restored for t in runs]
    return AgentsRow(
        workload,
        name,
        len(runs),
        seconds,
        first,
        statistics.median(t.prompt_n for t in runs),
        statistics.median(t.cache_n for t in runs),
        None if None in restored else statistics.median(restored),
        None if runs is ours else ours_seconds / seconds,
        None if runs is ours else ours_first / first,
    )


def render_agents(report: AgentsReport) -> list[str]:
    """The report as text: what ran, then one row per workload and server."""
    rounds = f"{report.rounds} round{'s' * (report.rounds > 1)}"
    lines = [
        f"localspec bench --agents — {report.date} — {report.machine}",
        f"{report.command}",
        f"{report.agents} agents take turns, each with its own system prompt of {report.words:,} words and a new short "
        f"message a turn; greedy, streamed, up to {report.tokens} tokens an answer; {rounds}, servers interleaved, "
        f"{report.parallel} slot{'s' * (report.parallel > 1)} each",
        f"{TURNS}: medians over the turns after the first round; {COLD}: over the first round's and one fresh system "
        "prompt a round; read/cached: prompt tokens read and reused (restored: of those, from RAM); "
        "localspec ×: localspec's time over the row's",
        "",
        f"{'workload':<12} {'server':<26} {'s/request':>9} {'localspec ×':>11} {'first token s':>13} "
        f"{'localspec ×':>11} {'read':>7} {'cached':>7} {'restored':>8}",
    ]
    for row in report.rows:
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}"
        first_ratio = "" if row.first_token_ratio is None else f"{row.first_token_ratio:.2f}"
        restored = "–" if row.restored is None else f"{row.restored:.0f}"
        lines.append(
            f"{row.workload:<12} {row.server:<26} {row.seconds:>9.3f} {ratio:>11} {row.first_token:>13.3f} "
            f"{first_ratio:>11} {row.prompt_n:>7.0f} {row.cache_n:>7.0f} {restored:>8}"
        )
    lines += [f"note: {note}" for note in report.notes]
    return lines


def agents_json(report: AgentsReport) -> str:
    return json.dumps(asdict(report), indent=2)
