"""The canary and the CPU check: every quantization type decodes in a child process with the build installed here,
a child that dies is named by its signal, and the one-line verdict names the CPU feature and the fix.

On an Intel CPU with AMX, the build of the commit before this test died in the first batched decode of every
quantized type (docs/install.md "Every x86 CPU"), and its system line has AMX_INT8: the first and the last test here
fail with that build on such a CPU. On an AMD CPU they pass with either build.
"""

from __future__ import annotations

import dataclasses
import sys

import gguf
import pytest

from localspec.errors import InvalidParamsError
from localspec.llama import canary, cpu
from localspec.llama.canary import CANARY_TYPES, CanaryResult, run_canary, verdict, write_canary_model
from localspec.llama.devices import system_info

SAPPHIRE_RAPIDS = cpu.HostCpu("Intel(R) Xeon(R) Platinum 8488C", frozenset(cpu.CPUINFO_FLAGS))
SYSTEM_LINE = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | OPENMP = 1 | REPACK = 1 |"


@pytest.mark.slow
def test_every_quantization_type_decodes_in_a_child_process():
    results = run_canary()
    assert [r.qtype for r in results] == list(CANARY_TYPES)
    assert all(r.ok for r in results), [(r.qtype, r.failure, r.log[-800:]) for r in results]
    assert all(r.system_info.startswith("CPU :") for r in results)
    assert verdict(results).startswith(f"llama.cpp decodes {' '.join(CANARY_TYPES)} on this CPU")  # (+ any one-off)


@pytest.mark.parametrize("qtype", CANARY_TYPES)
def test_each_canary_model_holds_its_type_in_every_matrix(tmp_path, qtype):
    reader = gguf.GGUFReader(write_canary_model(tmp_path / "m.gguf", qtype))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    matrices = [name for name in types if name.endswith(".weight") and "norm" not in name and "token_embd" not in name]
    assert len(matrices) == 8 and {types[name] for name in matrices} == {qtype}


def test_a_child_that_dies_is_named_by_its_signal(monkeypatch):
    # The negative control: the same orchestration with a child that dies in native code as a bad kernel would.
    crash = "import ctypes, faulthandler; faulthandler.enable(); print('CPU : AVX2 = 1 |', flush=True); " + (
        "print('decoding', flush=True); ctypes.string_at(0)"
    )
    monkeypatch.setattr(canary, "child_command", lambda path: [sys.executable, "-c", crash, str(path)])
    results = run_canary(("Q4_0", "Q8_0"))
    assert [(r.qtype, r.failure) for r in results] == [("Q4_0", "SIGSEGV"), ("Q8_0", "SIGSEGV")]
    assert "Fatal Python error: Segmentation fault" in results[0].log
    line = verdict(results, cpu.HostCpu("AMD EPYC", frozenset({"AVX2"})))
    assert line.startswith("llama.cpp died decoding Q4_0 (SIGSEGV), Q8_0 (SIGSEGV) on AMD EPYC (built with AVX2)")


def test_a_real_child_says_when_its_model_is_loaded(tmp_path):
    import subprocess

    done = subprocess.run(
        canary.child_command(write_canary_model(tmp_path / "m.gguf", "Q8_0")), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-800:]
    assert done.stdout.splitlines()[:2] == [system_info(), canary.DECODING]


def test_a_child_that_dies_before_its_first_decode_is_not_blamed_on_a_kernel(monkeypatch):
    # Seen on an AMX host (2026-11-27): every build, the one without AMX kernels too, died in llama.cpp's model
    # set-up; the verdict blamed the AMX kernels.
    crash = "import ctypes; print('CPU : AVX2 = 1 | AMX_INT8 = 1 |', flush=True); ctypes.string_at(0)"
    monkeypatch.setattr(canary, "child_command", lambda path: [sys.executable, "-c", crash, str(path)])
    results = run_canary(("Q4_0", "Q6_K"))
    assert [(r.failure, r.loaded) for r in results] == [("SIGSEGV", False)] * 2
    line = verdict(results, SAPPHIRE_RAPIDS)
    assert line.startswith("llama.cpp died loading Q4_0 (SIGSEGV), Q6_K (SIGSEGV) on Intel(R) Xeon(R) Platinum 8488C")
    assert "AMX kernels" not in line and "libstdc++" in line
    # one child that got as far as decoding is enough to blame the kernels again
    mixed = [results[0], dataclasses.replace(results[1], loaded=True)]
    assert verdict(mixed, SAPPHIRE_RAPIDS).startswith("llama.cpp's AMX kernels")


@pytest.mark.parametrize("bad_runs", [1, 2])
def test_garbage_logits_once_pass_with_a_note_and_twice_fail(tmp_path, monkeypatch, bad_runs):
    runs = tmp_path / "runs"
    child = (
        "import pathlib, sys; runs = pathlib.Path(sys.argv[1]); n = len(runs.read_text()) if runs.exists() else 0; "
        f"runs.write_text('x' * (n + 1)); print('CPU : AVX2 = 1 |'); n < {bad_runs} and sys.exit("
        "'non-finite logits in row 3 of 9')"
    )
    monkeypatch.setattr(canary, "child_command", lambda path: [sys.executable, "-c", child, str(runs)])
    [result] = run_canary(("Q4_K",))
    assert runs.read_text() == "xx"  # decoded a second time, alone
    if bad_runs == 1:
        assert result.ok and result.note == "non-finite logits in row 3 of 9 on the first of two runs"
        assert verdict([result]) == (
            "llama.cpp decodes Q4_K on this CPU (Q4_K: non-finite logits in row 3 of 9 on the first of two runs)"
        )
    else:
        assert result.failure == "non-finite logits in row 3 of 9" and not result.note


@pytest.mark.slow
def test_a_child_that_hangs_is_stopped(monkeypatch):
    monkeypatch.setattr(canary, "child_command", lambda path: [sys.executable, "-c", "import time; time.sleep(60)"])
    (result,) = run_canary(("Q4_1",), timeout=1.0)
    assert result.failure == "no answer in 1 s"


def test_the_verdict_names_the_missing_instruction_set_or_the_amx_kernels():
    crashed = [CanaryResult("Q4_K", "SIGILL", SYSTEM_LINE)]
    older = cpu.HostCpu("Intel(R) Xeon(R) E5-2690 v4", frozenset({"SSE3", "AVX", "AVX2"}))
    line = verdict(crashed, older)
    assert "built for AVX512 AMX_INT8, which Intel(R) Xeon(R) E5-2690 v4 lacks" in line
    assert "the wheel was built on another CPU" in line and "packaging/setup.sh" in line
    line = verdict([CanaryResult("Q4_K", "SIGSEGV", SYSTEM_LINE)], SAPPHIRE_RAPIDS)
    assert line.startswith("llama.cpp's AMX kernels (AMX_INT8 on Intel(R) Xeon(R) Platinum 8488C) died decoding Q4_K")


def test_the_cpu_is_read_from_cpuinfo_and_the_build_from_the_system_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\n"
        "flags\t\t: fpu sse2 pni ssse3 avx avx2 f16c fma bmi2 avx512f avx512_vnni amx_tile amx_int8\n\n"
        "processor\t: 1\nmodel name\t: ignored, the first CPU speaks\nflags\t\t: fpu\n"
    )
    host = cpu.host_cpu(cpuinfo)
    assert host.model == "Intel(R) Xeon(R) Platinum 8488C"
    assert host.features == {"SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2", "AVX512", "AVX512_VNNI", "AMX_INT8"}
    assert cpu.host_cpu(tmp_path / "absent") is None
    built = cpu.build_features(SYSTEM_LINE)
    assert built == {"SSE3", "AVX", "AVX2", "AVX512", "AMX_INT8", "OPENMP", "REPACK"}
    assert cpu.missing_features(built, cpu.HostCpu("x", frozenset({"SSE3", "AVX", "AVX2"}))) == ["AVX512", "AMX_INT8"]
    assert cpu.missing_features(built, None) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="instruction sets are read from /proc/cpuinfo")
def test_the_installed_build_fits_this_cpu_and_leaves_llamacpp_s_amx_kernels_out():
    built = cpu.build_features(system_info())
    assert cpu.missing_features(built, cpu.host_cpu()) == []
    assert "AMX_INT8" not in built, "packaging/reinstall-llama-backend.sh builds without AMX unless asked for amx"


@pytest.mark.parametrize("setting, repacked", [("on", True), ("off", False)])
def test_localspec_repack_switches_llamacpp_s_repacked_layouts(tmp_path, monkeypatch, setting, repacked):
    import logging

    from localspec.llama.model import Model

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("llama.cpp")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)  # setLevel, not .level: the logger caches what its level let through before
    monkeypatch.setenv(cpu.REPACK_ENV, setting)
    try:
        with Model(write_canary_model(tmp_path / "q4_0.gguf", "Q4_0"), n_gpu_layers=0):
            pass
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert any("model buffer size" in line for line in lines)
    assert any("CPU_REPACK model buffer size" in line for line in lines) == repacked


def test_a_bad_repack_setting_is_one_line():
    with pytest.raises(InvalidParamsError, match="LOCALSPEC_REPACK='maybe' is not on or off"):
        cpu.repack_from_env({"LOCALSPEC_REPACK": "maybe"})
    assert cpu.repack_from_env({}) and not cpu.repack_from_env({"LOCALSPEC_REPACK": "OFF"})


@pytest.mark.slow
def test_the_set_up_check_is_one_line_and_fails_the_set_up_on_a_crash(monkeypatch, capsys):
    assert canary.main([]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"llama.cpp decodes {' '.join(CANARY_TYPES)} on this CPU") and err == ""
    assert len(out.splitlines()) == 1
    crash = "import ctypes; print('CPU : AVX2 = 1 | AMX_INT8 = 1 |\\ndecoding', flush=True); ctypes.string_at(0)"
    monkeypatch.setattr(canary, "child_command", lambda path: [sys.executable, "-c", crash, str(path)])
    monkeypatch.setattr(cpu, "host_cpu", lambda: SAPPHIRE_RAPIDS)
    assert canary.main([]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith("error: llama.cpp's AMX kernels (AMX_INT8 on Intel(R) Xeon(R) Platinum 8488C) died")


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_the_canary_reads_every_row_while_its_context_lives(tmp_path, monkeypatch, qtype):
    """The "non-finite logits" of about 1 canary run in 20 (issue 44): its last row was a view of llama.cpp's output
    buffer, read after the context freed it. Here the buffer is overwritten with NaN as it is freed, as the
    allocator may: a row read afterwards is NaN every time, a row copied before never."""
    import numpy as np

    from localspec.llama.context import Context

    close = Context.close

    def scribbling_close(self):
        if getattr(self, "_handle", None) is not None:
            for address in list(self._views):
                view = self._views[address]
                view[...] = np.nan  # what a reuse of the freed memory can leave there
        close(self)

    monkeypatch.setattr(Context, "close", scribbling_close)
    canary.decode(write_canary_model(tmp_path / f"canary-{qtype}.gguf", qtype))  # before: ValueError, row 9 of 9
