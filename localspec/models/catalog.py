"""The models.toml schema: named pairs (a target and its draft, or a target alone), where their files come from, and
per-pair defaults.

A pair may name its target's projector (`mmproj`), in the forms a model takes. The bundled file (shipped in the
package) is read first; the user's file (`Paths.config_file`) adds pairs
and replaces bundled ones by name, and its `default` wins. Validation is pydantic with unknown keys
forbidden; every error becomes one `ConfigError` line naming the file, the pair and the field. Value ranges
are the engine's own: its parameter objects check them. The engine never sees pydantic: it gets a
`PairDefaults` from `Pair.defaults()`.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from localspec.core.options import options_of
from localspec.core.params import LoadParams, PairDefaults, SpeculativeParams, parse_size
from localspec.core.sampling import SamplingParams
from localspec.errors import ConfigError, InvalidParamsError
from localspec.paths import Paths

DEFAULT_QUANT = "Q4_K_M"
DEFAULT_PROJECTOR_QUANT = "F16"  # how projectors are published: mmproj-*-f16.gguf beside the model's quants
BUILTIN_MODELS = ("smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-f32")
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_QUANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_]*$")
_PAIR_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# The options a pair may set (`core/options.py`); `PairSpec` declares each, with its documentation.
PAIR_SAMPLING = tuple(o.name for o in options_of(SamplingParams) if o.pair)
PAIR_SPECULATIVE = tuple(o.name for o in options_of(SpeculativeParams) if o.pair)


class ModelSource(BaseModel):
    """Where one model file comes from: a Hub repository (by quant or by file), a local path, or a built-in.

    In TOML: `"owner/repo:QUANT"` (llama.cpp's `-hf` convention; QUANT defaults to Q4_K_M),
    `{ repo = "owner/repo", file = "name.gguf" }`, `{ path = "/models/x.gguf" }` or `{ builtin = "NAME" }`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    repo: str | None = None
    """Hugging Face repository id, "owner/name"."""

    quant: str | None = None
    """Quantization to pick among the repository's .gguf files (matched case-insensitively in file names)."""

    file: str | None = None
    """Exact file name inside the repository (instead of `quant`)."""

    path: Path | None = None
    """A local .gguf file; relative paths are relative to the models.toml that names them."""

    builtin: str | None = None
    """A model localspec provides without a download (the offline demo pair's files)."""

    @model_validator(mode="before")
    @classmethod
    def _parse_hub_string(cls, value: Any) -> Any:
        if isinstance(value, dict) and "repo" in value and "file" not in value and "quant" not in value:
            return {**value, "quant": DEFAULT_QUANT}
        if not isinstance(value, str):
            return value
        repo, sep, quant = value.partition(":")
        if not _REPO_RE.match(repo) or (sep and not _QUANT_RE.match(quant)):
            raise ValueError(
                f'{value!r} is not a Hub reference: write "owner/repo:QUANT", e.g. '
                f'"bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M"'
            )
        return {"repo": repo, "quant": quant or DEFAULT_QUANT}

    @field_validator("repo")
    @classmethod
    def _check_repo(cls, value: str | None) -> str | None:
        if value is not None and not _REPO_RE.match(value):
            raise ValueError(f'{value!r} is not a repository id: write "owner/name"')
        return value

    @field_validator("quant")
    @classmethod
    def _check_quant(cls, value: str | None) -> str | None:
        if value is not None and not _QUANT_RE.match(value):
            raise ValueError(f"{value!r} is not a quantization name such as Q4_K_M or Q8_0")
        return value

    @field_validator("builtin")
    @classmethod
    def _check_builtin(cls, value: str | None) -> str | None:
        if value is not None and value not in BUILTIN_MODELS:
            raise ValueError(f"unknown builtin model {value!r}: choose one of {', '.join(BUILTIN_MODELS)}")
        return value

    @field_validator("path")
    @classmethod
    def _resolve_path(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        value = value.expanduser()
        base = (info.context or {}).get("base_dir")
        return value if value.is_absolute() or base is None else Path(base) / value

    @model_validator(mode="after")
    def _one_kind(self) -> ModelSource:
        kinds = [k for k in ("repo", "path", "builtin") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError('give exactly one of repo ("owner/repo:QUANT" or {repo, file}), path or builtin')
        if self.repo is None and (self.file or self.quant):
            raise ValueError("file and quant only go with repo")
        if self.file and self.quant:
            raise ValueError("give either file or quant, not both")
        return self

    @property
    def kind(self) -> Literal["hub", "path", "builtin"]:
        """Which of the three forms this is."""
        return "hub" if self.repo else "path" if self.path else "builtin"

    def label(self) -> str:
        """The reference as a user would write it: `owner/repo:QUANT`, `owner/repo/file`, a path or a name."""
        if self.repo:
            return f"{self.repo}/{self.file}" if self.file else f"{self.repo}:{self.quant}"
        return str(self.path) if self.path else f"builtin:{self.builtin}"


class PairSpec(BaseModel):
    """One `[pairs.NAME]` table: a target, the draft that speaks for it (or none), and defaults for using them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: ModelSource
    """The model whose output you get."""

    draft: ModelSource | None = None
    """The small model that proposes tokens (same tokenizer as the target). None: the target alone, which drafts with
    its own MTP head where it carries one (else it decodes plainly; `--drafter ngram` drafts with n-grams)."""

    mmproj: ModelSource | None = None
    """The target's projector (an mmproj GGUF): the target then sees images (or hears audio). The target's forms;
    a Hub reference picks among the repository's mmproj files, F16 when no quant is named. `--mmproj` wins."""

    description: str = ""
    """One line shown by `localspec models`."""

    temperature: float | None = None
    """Sampling temperature; 0 means greedy."""

    top_p: float | None = None
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""

    top_k: StrictInt | None = None
    """Keep the k most likely tokens; 0 disables."""

    min_p: float | None = None
    """Drop tokens less likely than min_p times the most likely one."""

    draft_max: StrictInt | None = None
    """Most tokens the draft proposes per step; 0 decodes without speculation."""

    p_min: float | None = None
    """Stop drafting when the draft's top probability falls below this."""

    verify: str | None = None
    """Verification rule: "pq" (speculative sampling, default for T > 0) or "match" (exact match)."""

    n_ctx: StrictInt | None = None
    """Context length in tokens."""

    n_gpu_layers: StrictInt | None = None
    """The target's layers on the GPU, as llama.cpp counts them (the output layer is one); -1 means all. Unset: the
    placement plan's (docs/models.md "GPU placement"); `--n-gpu-layers` wins."""

    n_gpu_layers_draft: StrictInt | None = None
    """The draft's layers on the GPU; unset: the plan's (the whole draft when it fits)."""

    gpu_memory: str | None = None
    """Plan as if the GPU had this much free ("8G", "7.5GiB"): a cap when the GPU is shared; `--gpu-memory` wins."""

    cpu_moe: StrictBool | None = None
    """A mixture-of-experts target keeps its experts in CPU memory (true) or not (false); unset: the plan's."""

    rpc: tuple[str, ...] | None = None
    """llama.cpp RPC workers ("host:port") that take the target's layers; `--rpc` replaces them."""

    chat_template: str | None = None
    """A llama.cpp built-in chat template name to use instead of the GGUF's own template."""

    bridge: str | None = None
    """A draft with another tokenizer: "auto" (by the shared tokens), "text" or "shared"; `--bridge` wins."""

    thinking: StrictBool | None = None
    """A reasoning model thinks before it answers (true) or not (false), through its chat template's switch
    (Qwen3's `enable_thinking`); unset: the model's own default. `--think on|off` and the chat's F3 settings win."""

    @field_validator("mmproj", mode="before")
    @classmethod
    def _projector_quant(cls, value: Any) -> Any:
        if isinstance(value, str) and _REPO_RE.match(value):  # "owner/repo": its F16 projector, not a Q4_K_M model
            return f"{value}:{DEFAULT_PROJECTOR_QUANT}"
        if isinstance(value, dict) and "repo" in value and "file" not in value and "quant" not in value:
            return {**value, "quant": DEFAULT_PROJECTOR_QUANT}
        return value

    @field_validator("mmproj")
    @classmethod
    def _projector_kind(cls, value: ModelSource | None) -> ModelSource | None:
        if value is not None and value.kind == "builtin":
            raise ValueError('a projector is a Hub file ("owner/repo:QUANT" or {repo, file}) or a {path}')
        return value

    # The ranges are the engine's: each value is checked by building the parameter object it goes to.
    @field_validator(*PAIR_SAMPLING)
    @classmethod
    def _check_sampling(cls, value: Any, info: ValidationInfo) -> Any:
        return _engine_check(SamplingParams, info.field_name, value)

    @field_validator(*PAIR_SPECULATIVE)
    @classmethod
    def _check_speculative(cls, value: Any, info: ValidationInfo) -> Any:
        return _engine_check(SpeculativeParams, info.field_name, value)

    @field_validator("n_ctx", "n_gpu_layers", "n_gpu_layers_draft", "rpc", "bridge")
    @classmethod
    def _check_load(cls, value: Any, info: ValidationInfo) -> Any:
        return _engine_check(LoadParams, info.field_name, value)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        annotation = cls.model_fields[info.field_name].annotation if info.field_name else None
        if isinstance(value, bool) and "bool" not in str(annotation).lower():  # TOML's true is not 1
            raise ValueError(f"{str(value).lower()} is not a value of {info.field_name}")
        return value

    @field_validator("gpu_memory", mode="before")
    @classmethod
    def _size_as_text(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, str):
            raise ValueError(
                f'{value!r} is not a memory size: write it as a string with its unit, like "8G" or "7.5GiB"'
            )
        return value

    @field_validator("gpu_memory")
    @classmethod
    def _check_size(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_size(value, "gpu_memory")
            except InvalidParamsError as e:
                raise ValueError(str(e)) from None
        return value


def _engine_check(kind: type, name: str | None, value: Any) -> Any:
    """`value` when the engine's `kind` accepts it for field `name`; its InvalidParamsError as a ValueError."""
    if value is not None and name is not None:
        try:
            kind(**{name: value})
        except InvalidParamsError as e:
            raise ValueError(str(e)) from None
    return value


class ModelsFile(BaseModel):
    """A whole models.toml: an optional default pair name and the pairs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default: str | None = None
    """The pair used when none is named."""

    pairs: dict[str, PairSpec] = Field(default_factory=dict)
    """Pairs by name."""

    @field_validator("pairs")
    @classmethod
    def _check_names(cls, pairs: dict[str, PairSpec]) -> dict[str, PairSpec]:
        for name in pairs:
            if not _PAIR_NAME_RE.match(name):
                raise ValueError(f"pair name {name!r} may only use letters, digits, '.', '_' and '-'")
        return pairs


@dataclass(frozen=True, slots=True)
class Pair:
    """A named pair as the rest of the program sees it, with where it was defined."""

    name: str
    source: Literal["bundled", "user"]
    file: Path
    spec: PairSpec

    @property
    def target(self) -> ModelSource:
        return self.spec.target

    @property
    def draft(self) -> ModelSource | None:
        """The draft model, or None for a target-only pair."""
        return self.spec.draft

    @property
    def mmproj(self) -> ModelSource | None:
        """The target's projector, or None for a pair that reads text only."""
        return self.spec.mmproj

    @property
    def description(self) -> str:
        return self.spec.description

    def sampling_overrides(self) -> dict[str, Any]:
        """Per-pair sampling defaults that were set (keys of `SamplingParams`)."""
        return self._set_fields(*PAIR_SAMPLING)

    def speculative_overrides(self) -> dict[str, Any]:
        """Per-pair speculation defaults that were set (keys of `SpeculativeParams`)."""
        return self._set_fields(*PAIR_SPECULATIVE)

    def model_overrides(self) -> dict[str, Any]:
        """Per-pair loading and template defaults that were set: n_ctx, the GPU placement keys, chat_template,
        thinking, rpc, bridge (gpu_memory in bytes)."""
        names = ("n_ctx", "n_gpu_layers", "n_gpu_layers_draft", "gpu_memory", "cpu_moe")
        fields = self._set_fields(*names, "chat_template", "thinking", "rpc", "bridge")
        if "gpu_memory" in fields:
            fields["gpu_memory"] = parse_size(fields["gpu_memory"], "gpu_memory")
        return fields

    def defaults(self, *, compat_hint: str = "", notice: str = "") -> PairDefaults:
        """The pair's defaults as the engine's callers take them, with what loading it must say."""
        fields = {**self.sampling_overrides(), **self.speculative_overrides(), **self.model_overrides()}
        return PairDefaults(**fields, compat_hint=compat_hint, notice=notice)

    def _set_fields(self, *names: str) -> dict[str, Any]:
        return {n: getattr(self.spec, n) for n in names if getattr(self.spec, n) is not None}


@dataclass(frozen=True, slots=True)
class ModelsConfig:
    """The merged configuration: bundled pairs overlaid with the user's."""

    pairs: Mapping[str, Pair]
    default: str | None
    files: tuple[Path, ...]

    def get(self, name: str) -> Pair:
        """The pair called `name`.

        Raises:
            ConfigError: no such pair.
        """
        try:
            return self.pairs[name]
        except KeyError:
            raise ConfigError(
                f"unknown pair {name!r}: choose one of {', '.join(sorted(self.pairs))} (see `localspec models`)"
            ) from None


def bundled_config_file() -> Path:
    """The models.toml shipped inside the package."""
    return Path(__file__).parents[1] / "models.toml"


def read_models_file(path: Path) -> ModelsFile:
    """Parse and validate one models.toml.

    Raises:
        ConfigError: unreadable file, invalid TOML or an invalid field (one line naming file, pair and field).
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}): save it as UTF-8") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML ({e}): fix the syntax") from e
    try:
        return ModelsFile.model_validate(data, context={"base_dir": path.parent})
    except ValidationError as e:
        raise ConfigError(_describe(path, e)) from e


def _describe(path: Path, error: ValidationError) -> str:
    """One line naming the file and every invalid field, with its pair: "pair 'x', field 'n_ctx': …; field …"."""
    parts, last_pair = [], None
    for found in error.errors():
        loc = [str(part) for part in found["loc"]]
        if found["type"] == "extra_forbidden":
            message = "unknown key (check its spelling or remove it)"
        else:
            message = found["msg"].removeprefix("Value error, ")
        if len(loc) >= 2 and loc[0] == "pairs":
            pair = f"pair {loc[1]!r}, " if loc[1] != last_pair else ""
            where, last_pair = pair + (f"field {'.'.join(loc[2:])!r}" if len(loc) > 2 else "the table"), loc[1]
        else:
            where = f"field {'.'.join(loc)!r}" if loc else "top level"
        parts.append(f"{where}: {message}")
    return f"{path}: {'; '.join(parts)}"


def load_config(paths: Paths, *, bundled: Path | None = None) -> ModelsConfig:
    """Read the bundled models.toml, then overlay the user's one if it exists.

    Args:
        paths: where the user's file lives (`paths.config_file`).
        bundled: another bundled file (tests); default the package's own.

    Returns:
        The merged pairs: user pairs replace bundled ones of the same name; the user's `default` wins.

    Raises:
        ConfigError: a file is invalid, or `default` names a pair that does not exist.
    """
    bundled = bundled or bundled_config_file()
    layers: list[tuple[Literal["bundled", "user"], Path]] = [("bundled", bundled)]
    if paths.config_file.is_dir():
        raise ConfigError(f"{paths.config_file} is a folder: models.toml must be a file (move the folder away)")
    if paths.config_file.is_file():
        layers.append(("user", paths.config_file))
    pairs: dict[str, Pair] = {}
    default: str | None = None
    default_file = bundled
    for source, file in layers:
        parsed = read_models_file(file)
        for name, spec in parsed.pairs.items():
            pairs[name] = Pair(name=name, source=source, file=file, spec=spec)
        if parsed.default is not None:
            default, default_file = parsed.default, file
    if default is not None and default not in pairs:
        raise ConfigError(
            f"{default_file}: field 'default': no pair named {default!r}: choose one of {', '.join(sorted(pairs))}"
        )
    return ModelsConfig(pairs=pairs, default=default, files=tuple(f for _, f in layers))
