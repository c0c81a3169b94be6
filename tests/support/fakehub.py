"""A local HTTP server that answers like the Hugging Face Hub, for tests of the real huggingface_hub client.

It serves the three calls a GGUF download makes: model info with file sizes (`/api/models/{repo}`),
HEAD and GET of `/{repo}/resolve/{revision}/{file}` with the headers huggingface_hub 2.x requires (ETag,
X-Repo-Commit, Content-Length) and byte ranges. It can gate a repository (401/403 with X-Error-Code),
cut a file's first download halfway, and records every request so tests can count GETs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RANGE_RE = re.compile(r"bytes=(\d+)-(\d*)")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class FakeHub:
    """Repositories of files, served on 127.0.0.1 at a random port while started."""

    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    gated: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    cut_once: dict[str, int] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    def add(self, repo: str, filename: str, data: bytes) -> None:
        self.repos.setdefault(repo, {})[filename] = data

    def gate(self, repo: str, status: int = 401, error_code: str | None = "GatedRepo") -> None:
        """Answer every request about `repo` with `status` (and X-Error-Code when given)."""
        self.gated[repo] = (status, error_code)

    def cut_first_download(self, filename: str, after_bytes: int) -> None:
        """Close the connection after `after_bytes` of the first GET of `filename`."""
        self.cut_once[filename] = after_bytes

    @property
    def url(self) -> str:
        assert self._server is not None, "start the hub first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeHub:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def file_gets(self, filename: str) -> list[Request]:
        """GET requests of one file (HEADs and API calls excluded)."""
        return [r for r in self.requests if r.method == "GET" and "/resolve/" in r.path and r.path.endswith(filename)]


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        def _route(self, *, head: bool) -> None:
            hub.requests.append(Request(self.command, self.path, dict(self.headers.items())))
            parts = unquote(urlsplit(self.path).path).strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                self._model_info("/".join(parts[2:4]), head)
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._resolve("/".join(parts[:2]), "/".join(parts[4:]), head)
            else:
                self._error(404, "RepoNotFound", head)

        def _error(self, status: int, code: str | None, head: bool, extra: dict[str, str] | None = None) -> None:
            body = json.dumps({"error": code or "error"}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", f"{code} (fake hub)")
            for key, value in (extra or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _known(self, repo: str, head: bool) -> bool:
            if repo in hub.gated:
                status, code = hub.gated[repo]
                self._error(status, code, head)
                return False
            if repo not in hub.repos:
                self._error(401, "RepoNotFound", head)
                return False
            return True

        def _model_info(self, repo: str, head: bool) -> None:
            if not self._known(repo, head):
                return
            siblings = [{"rfilename": name, "size": len(data)} for name, data in hub.repos[repo].items()]
            body = json.dumps(
                {"id": repo, "modelId": repo, "sha": COMMIT, "private": False, "siblings": siblings}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _resolve(self, repo: str, filename: str, head: bool) -> None:
            if not self._known(repo, head):
                return
            data = hub.repos[repo].get(filename)
            if data is None:
                self._error(404, "EntryNotFound", head, {"X-Repo-Commit": COMMIT})
                return
            start, status = 0, 200
            match = _RANGE_RE.fullmatch(self.headers.get("Range", ""))
            if match and not head:
                start, status = int(match.group(1)), 206
            body = data[start:]
            self.send_response(status)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if head:
                return
            cut = hub.cut_once.pop(filename, None)
            if cut is not None:
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True  # the client sees the body end early
                return
            self.wfile.write(body)

    return Handler


def cli_env(hub: FakeHub, tmp_path: Path, pairs_toml: str) -> dict[str, str]:
    """The environment of a CLI subprocess against `hub`: no Hub variables or proxies of the machine's, a private HF
    home and cache under `tmp_path`, and a LOCALSPEC_HOME whose models.toml is `pairs_toml`."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "models.toml").write_text(pairs_toml, encoding="utf-8")
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE")) and "proxy" not in k.lower()
    }
    return {
        **clean,
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_ETAG_TIMEOUT": "3",
        "NO_PROXY": "127.0.0.1,localhost",
        "LOCALSPEC_HOME": str(home),
    }
