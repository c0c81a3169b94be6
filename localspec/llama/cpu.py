"""This CPU's instruction sets against the ones this llama.cpp build was compiled for.

llama.cpp is compiled for the CPU it is built on (-march=native), and a build meets another CPU when a home folder,
a wheelhouse or an image moves. An instruction set the build uses and the CPU lacks kills the process (SIGILL) at
its first use, so doctor and the canary name such sets before anything loads. The build's sets come from
llama.cpp's system line (ggml's names); the CPU's from Linux's /proc/cpuinfo. It also owns the one switch of the
CPU kernels, LOCALSPEC_REPACK: llama.cpp's repacked weight layouts (faster CPU matrix kernels) on or off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import InvalidParamsError

REPACK_ENV = "LOCALSPEC_REPACK"

# ggml's feature names (llama_print_system_info) → the flag Linux lists for the same instructions.
CPUINFO_FLAGS = {
    "SSE3": "pni",
    "SSSE3": "ssse3",
    "AVX": "avx",
    "AVX2": "avx2",
    "F16C": "f16c",
    "FMA": "fma",
    "BMI2": "bmi2",
    "AVX_VNNI": "avx_vnni",
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}


@dataclass(frozen=True, slots=True)
class HostCpu:
    """What /proc/cpuinfo says about this CPU: its model name and the instruction sets ggml knows, by ggml's name."""

    model: str
    features: frozenset[str]

    def describe(self) -> str:
        known = [name for name in CPUINFO_FLAGS if name in self.features]
        return f"{self.model}: {' '.join(known) or 'none of the sets ggml uses'}"


def host_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> HostCpu | None:
    """This CPU's model and instruction sets; None where there is no /proc/cpuinfo with flags (macOS, ARM)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    if "flags" not in fields:
        return None
    flags = set(fields["flags"].split())
    return HostCpu(
        model=fields.get("model name", "unknown CPU"),
        features=frozenset(name for name, flag in CPUINFO_FLAGS.items() if flag in flags),
    )


def build_features(system_info: str) -> frozenset[str]:
    """The instruction sets a build uses, from llama.cpp's system line ("CPU : SSE3 = 1 | AVX = 1 | … |")."""
    cpu_part = system_info.partition("CPU :")[2]
    found = set()
    for item in cpu_part.split("|"):
        name, sep, value = item.partition("=")
        if sep and value.strip() == "1":
            found.add(name.strip())
    return frozenset(found)


def missing_features(built: frozenset[str], host: HostCpu | None) -> list[str]:
    """The instruction sets the build uses and this CPU lacks (ggml's names, in its order); [] when unknown."""
    if host is None:
        return []
    return [name for name in CPUINFO_FLAGS if name in built and name not in host.features]


def repack_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether models load with llama.cpp's extra CPU buffer types (the repacked layouts): `LOCALSPEC_REPACK`,
    "on" (the default) or "off". `bench --peer` gives llama-server the same choice (`--no-repack`).

    Raises:
        InvalidParamsError: set to anything else.
    """
    value = (os.environ if environ is None else environ).get(REPACK_ENV, "").strip().lower()
    if value in ("", "on", "1", "yes"):
        return True
    if value in ("off", "0", "no"):
        return False
    raise InvalidParamsError(f"{REPACK_ENV}={value!r} is not on or off: set {REPACK_ENV}=on (the default) or off")
