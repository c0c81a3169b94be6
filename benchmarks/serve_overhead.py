"""What `localspec serve` costs over `localspec generate`: the same pair, greedy, the same prompts and token counts.

Starts the server once (a subprocess, as a user would), then for each round and prompt, interleaved: `localspec
generate --chat --json` (a subprocess; its own tok/s, prefill excluded) and one streamed `chat.completions` request
with the `openai` client (tok/s seen by the client: completion tokens over the time from sending the request to the
last chunk, less the server's `prompt_ms`). The ratio of the medians is the server's overhead; ≥ 0.95 is the goal.

    python benchmarks/serve_overhead.py [--pair demo] [--tokens 128] [--rounds 3] [--draft-max 8]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "Write a Python function that adds two numbers, with a short explanation.",
    "Explain in a few sentences why the sky is blue.",
    "List five fruits and one fact about each.",
    "Write a short poem about the sea.",
]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _generate(pair: str, prompt: str, tokens: int, extra: list[str]) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "localspec", "generate", prompt, "--chat", "--pair", pair, "--temperature", "0",
           "--max-tokens", str(tokens), "--json", *extra]  # fmt: skip
    out = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, check=True).stdout
    result = json.loads(out.splitlines()[-1])
    return result["stats"]["tokens_per_second"], len(result["tokens"])


def _serve_once(client, prompt: str, tokens: int, body: dict) -> tuple[float, float, int]:
    start = time.perf_counter()
    stream = client.chat.completions.create(
        model=body["model"],
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=body.get("extra") or None,
    )
    chunks = list(stream)
    end = time.perf_counter()
    last = chunks[-1]
    timings = last.model_extra["timings"]
    n = last.usage.completion_tokens
    client_rate = n / (end - start - timings["prompt_ms"] / 1000)
    return client_rate, timings["predicted_per_second"], n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", default="demo")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--draft-max", type=int, help="fixed k (with --no-adaptive) instead of the adaptive policy")
    args = p.parse_args()
    import openai

    extra_flags = ["--draft-max", str(args.draft_max), "--no-adaptive"] if args.draft_max is not None else []
    extra_body = {"draft_max": args.draft_max, "adaptive": False} if args.draft_max is not None else {}
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "localspec", "serve", "--pair", args.pair, "--port", str(port)],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the server did not start: {server.stderr.read()}") from None
                time.sleep(0.2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
        body = {"model": args.pair, "extra": extra_body}
        _serve_once(client, PROMPTS[0], 8, body)  # warm the server's first request
        gen_rates, client_rates, server_rates = [], [], []
        for r in range(args.rounds):
            for i, prompt in enumerate(PROMPTS):
                order = (0, 1) if (r + i) % 2 == 0 else (1, 0)  # alternate who goes first
                for who in order:
                    if who == 0:
                        rate, n = _generate(args.pair, prompt, args.tokens, extra_flags)
                        gen_rates.append(rate)
                        print(f"round {r} prompt {i}: generate {rate:6.1f} tok/s ({n} tokens)", flush=True)
                    else:
                        c_rate, s_rate, n = _serve_once(client, prompt, args.tokens, body)
                        client_rates.append(c_rate)
                        server_rates.append(s_rate)
                        print(f"round {r} prompt {i}: serve    {c_rate:6.1f} tok/s at the client, "
                              f"{s_rate:6.1f} in the server ({n} tokens)", flush=True)  # fmt: skip
        g, c, s = (statistics.median(x) for x in (gen_rates, client_rates, server_rates))
        print(f"\nmedian tok/s: generate {g:.1f}, serve (client) {c:.1f}, serve (server's own) {s:.1f}")
        print(f"serve / generate: {c / g:.3f} at the client, {s / g:.3f} in the server")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
