"""Loading options as one typed object (issue 13): `LoadParams` and `PairDefaults` built once from models.toml
or the flags, the engine's own ranges for models.toml, `--rpc`, and logging set up once."""

from __future__ import annotations

import logging

import pytest

from localspec.cli.main import main, setup_logging
from localspec.core.engine import Engine
from localspec.core.params import LoadParams, PairDefaults, SpeculativeParams, parse_size
from localspec.errors import ConfigError, InvalidParamsError, LocalspecError
from localspec.llama.rpc import parse_rpc
from localspec.models.catalog import load_config
from localspec.models.flags import RunFlags
from localspec.models.loading import load_params


def write_pair(paths, tiny_models, extra: str = "") -> None:
    paths.config_dir.mkdir(parents=True, exist_ok=True)
    paths.config_file.write_text(
        f'default = "local"\n[pairs.local]\ntarget = {{ path = "{tiny_models.target}" }}\n'
        f'draft = {{ path = "{tiny_models.draft_noisy}" }}\n{extra}',
        encoding="utf-8",
    )


class Loaded(LocalspecError):
    """Raised by the stand-in Engine.load once it has seen its parameters."""


@pytest.fixture
def seen_load(monkeypatch) -> list[LoadParams]:
    """Engine.load replaced by a recorder that stops the command right there."""
    seen: list[LoadParams] = []

    def load(cls, target, draft=None, params=None, **options):
        seen.append(params)
        raise Loaded("stopped after loading")

    monkeypatch.setattr(Engine, "load", classmethod(load))
    return seen


# --- rpc ----------------------------------------------------------------------------------------------------


def test_parse_rpc_takes_host_port_lists():
    assert parse_rpc("192.168.1.10:50052,worker-2.lan:50053") == ("192.168.1.10:50052", "worker-2.lan:50053")
    for bad in ("host", "host:", ":50052", "host:0", "host:65536", "a:1,", "host:port", "a b:1"):
        with pytest.raises(InvalidParamsError, match="is not an RPC endpoint: write host:port"):
            parse_rpc(bad)


@pytest.mark.parametrize("command", [["generate", "hi"], ["chat"], ["bench"]])
def test_a_bad_rpc_flag_is_one_line_before_anything_loads(localspec_home, tiny_models, capsys, seen_load, command):
    code = main([*command, "--target", str(tiny_models.target), "--rpc", "10.0.0.1:50052,10.0.0.2"])
    err = capsys.readouterr().err
    assert code == 1 and not seen_load
    assert err.count("\n") == 1 and "--rpc: '10.0.0.2' is not an RPC endpoint: write host:port" in err


def test_the_rpc_flag_overrides_the_pair_and_reaches_engine_load(localspec_home, tiny_models, capsys, seen_load):
    write_pair(localspec_home, tiny_models, 'rpc = ["pair-host:50052"]\nn_ctx = 512\n')
    assert main(["generate", "hi"]) == 1
    assert main(["generate", "hi", "--rpc", "a:1,b:2", "--n-ctx", "256"]) == 1
    assert [(p.rpc, p.n_ctx, p.drafter) for p in seen_load] == [
        (("pair-host:50052",), 512, "model+ngram"),  # a draft given, no --drafter: the chain (DEFAULT_MODEL_DRAFTER)
        (("a:1", "b:2"), 256, "model+ngram"),
    ]
    assert "stopped after loading" in capsys.readouterr().err


def test_models_toml_rpc_is_checked(localspec_home, tiny_models):
    write_pair(localspec_home, tiny_models, 'rpc = ["ok:1", "nope"]\n')
    with pytest.raises(ConfigError, match="pair 'local', field 'rpc': rpc: 'nope' is not an RPC endpoint"):
        load_config(localspec_home)


# --- one source of truth ------------------------------------------------------------------------------------


def test_models_toml_ranges_are_the_engines_own(localspec_home, tiny_models):
    write_pair(localspec_home, tiny_models, "draft_max = 65\n")
    with pytest.raises(InvalidParamsError) as engine_error:
        SpeculativeParams(draft_max=65)
    with pytest.raises(ConfigError) as config_error:
        load_config(localspec_home)
    assert str(config_error.value).endswith(f"pair 'local', field 'draft_max': {engine_error.value}")


def test_pair_defaults_come_from_the_pair_and_flags_win(localspec_home, tiny_models):
    write_pair(localspec_home, tiny_models, 'temperature = 0.2\nn_gpu_layers = 0\nrpc = ["h:9"]\n')
    defaults = load_config(localspec_home).get("local").defaults(compat_hint="hint", notice="note")
    assert defaults == PairDefaults(temperature=0.2, n_gpu_layers=0, rpc=("h:9",), compat_hint="hint", notice="note")

    assert load_params(RunFlags(), defaults, has_draft=True) == LoadParams(
        drafter="model+ngram", n_gpu_layers=0, compat_hint="hint", rpc=("h:9",)
    )
    flags = RunFlags(drafter="ngram", n_gpu_layers=3, rpc=("x:1",))
    assert load_params(flags, defaults, has_draft=True) == LoadParams(
        drafter="ngram", n_gpu_layers=3, compat_hint="hint", rpc=("x:1",)
    )


def test_load_params_check_their_ranges():
    for bad in ({"drafter": "lookup"}, {"n_ctx": 8}, {"n_gpu_layers": -2}, {"n_threads": 0}, {"rpc": ("x",)}):
        with pytest.raises(InvalidParamsError):
            LoadParams(**bad)


# --- logging ------------------------------------------------------------------------------------------------


def handlers() -> list[logging.Handler]:
    return [h for h in logging.getLogger("localspec").handlers if hasattr(h, "_localspec_handler")]


def test_setup_logging_adds_its_handlers_once(localspec_home, capsys):
    for _ in range(3):
        assert main(["generate", "hi", "--n", "0"]) == 1  # sets up logging, then a flag error
    assert len(handlers()) == 1
    setup_logging(True, localspec_home)
    setup_logging(True, localspec_home)
    assert len(handlers()) == 2  # the file and stderr
    setup_logging(False, localspec_home)
    assert len(handlers()) == 1
    logging.getLogger("localspec.test").info("one line")
    for handler in handlers():
        handler.flush()
    assert localspec_home.log_file.read_text(encoding="utf-8").count("one line") == 1


def test_one_option_table_feeds_the_flags_the_pair_schema_the_pair_defaults_and_the_settings_form():
    import dataclasses

    from localspec.cli.main import build_parser
    from localspec.core.params import OPTIONS, PairDefaults
    from localspec.models.catalog import PairSpec
    from localspec.tui.screens import SettingsScreen

    parser = build_parser()
    for opt in OPTIONS:
        given = [] if opt.kind is bool else [opt.choices[0] if opt.choices else "1"]
        args = parser.parse_args(["generate", opt.flag, *given])
        assert getattr(args, opt.name) == (False if opt.kind is bool else opt.kind(given[0])), opt
    pair_keys = {o.name for o in OPTIONS if o.pair}
    assert pair_keys <= set(PairSpec.model_fields) and pair_keys <= {f.name for f in dataclasses.fields(PairDefaults)}
    assert {o.name for o in OPTIONS} - pair_keys == {"repeat_penalty", "seed", "adaptive"}
    form = {name for name, _ in SettingsScreen.FIELDS} | {name for name, _, _ in SettingsScreen.CHOICES}
    assert {o.name for o in OPTIONS if o.form} <= form


def test_placement_keys_come_from_the_pair_and_flags_win(localspec_home, tiny_models, capsys, seen_load):
    write_pair(localspec_home, tiny_models, 'n_gpu_layers_draft = 0\ngpu_memory = "6G"\ncpu_moe = false\n')
    assert main(["generate", "hi"]) == 1
    assert main(["generate", "hi", "--n-gpu-layers-draft", "5", "--gpu-memory", "7.5GiB", "--cpu-moe"]) == 1
    assert [(p.n_gpu_layers_draft, p.gpu_memory, p.cpu_moe) for p in seen_load] == [
        (0, 6 * 2**30, False),
        (5, int(7.5 * 2**30), True),
    ]


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ('gpu_memory = "lots"', ["field 'gpu_memory'", "is not a memory size: write it like 8G"]),
        ("gpu_memory = 8", ["field 'gpu_memory'", "string"]),
        ('cpu_moe = "yes"', ["field 'cpu_moe'", "boolean"]),
        ("n_gpu_layers_draft = -3", ["field 'n_gpu_layers_draft'", "n-gpu-layers-draft must be -1 (all) or more"]),
    ],
)
def test_models_toml_placement_keys_are_checked(localspec_home, tiny_models, key, words):
    write_pair(localspec_home, tiny_models, key + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(localspec_home)
    assert "\n" not in str(e.value) and "pair 'local'" in str(e.value)
    for word in words:
        assert word in str(e.value), str(e.value)


def test_sizes_are_read_in_binary_units():
    assert parse_size("8G") == parse_size("8GiB") == parse_size("8 gb") == 8 * 2**30
    assert parse_size("7.5GiB") == int(7.5 * 2**30) and parse_size("8000M") == 8000 * 2**20
    for bad in ("8", "8X", "-1G", "0G", "G", "", "1e3G", "9" * 400 + "T", "8G8"):
        with pytest.raises(InvalidParamsError, match="is not a memory size: write it like 8G"):
            parse_size(bad)
