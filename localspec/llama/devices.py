"""The compute devices this llama.cpp build really has (ggml's backend registry), and the build's system line.

ggml's own functions are looked up through libllama's handle (`native()`), never by opening a library by name.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp

from .log import init


def system_info() -> str:
    """llama.cpp's one-line description of the build (SIMD features, backends)."""
    init()
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()


@dataclass(frozen=True, slots=True)
class Device:
    """A compute device this llama.cpp build can really use."""

    name: str
    description: str
    kind: str  # "cpu", "gpu", "igpu" or "accel"
    memory_free: int
    memory_total: int


_DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}


def native() -> ctypes.CDLL:
    """ggml's C functions as the loaded libllama resolves them.

    A wheel cannot hold symlinks, so lib/ has libggml-base.so, .so.0 and .so.0.25.3 as three copies: opening
    one by name would load a second ggml with its own globals (abort hook, device registry). Looking symbols up
    through libllama's own handle finds the copies it really uses. A new CDLL object over the same handle keeps
    the argtypes set here apart from llama-cpp-python's.
    """
    init()
    lib = llama_cpp.llama_cpp._lib
    return ctypes.CDLL(lib._name, handle=lib._handle)


def device_handles() -> list[tuple[int, Device]]:
    """ggml's backend devices (Metal, CUDA, Vulkan, CPU…) with their native handles."""
    ggml = base = native()
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in (base.ggml_backend_dev_name, base.ggml_backend_dev_description):
        fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    base.ggml_backend_dev_type.restype, base.ggml_backend_dev_type.argtypes = ctypes.c_int, [ctypes.c_void_p]
    base.ggml_backend_dev_memory.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    found = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        device = Device(
            name=base.ggml_backend_dev_name(dev).decode(),
            description=base.ggml_backend_dev_description(dev).decode(errors="replace"),
            kind=_DEVICE_KINDS.get(base.ggml_backend_dev_type(dev), "unknown"),
            memory_free=free.value,
            memory_total=total.value,
        )
        found.append((dev, device))
    return found


def devices() -> list[Device]:
    """ggml's backend devices by name.

    `llama_supports_gpu_offload()` answers True even on CPU-only builds, so this is the real test.
    """
    return [device for _, device in device_handles()]
