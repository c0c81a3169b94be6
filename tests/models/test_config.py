"""models.toml: the bundled pairs, the schema's one-line errors, the user overlay, and LOCALSPEC_HOME paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.errors import ConfigError
from localspec.models.catalog import DEFAULT_QUANT, ModelSource, bundled_config_file, load_config, read_models_file
from localspec.paths import get_paths

PAIR = '[pairs.mine]\ntarget = "a/b-GGUF:Q8_0"\ndraft = "a/c-GGUF"\n'


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def config_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        read_models_file(write(tmp_path / "models.toml", text))
    message = str(info.value)
    assert "\n" not in message
    return message


# --- paths --------------------------------------------------------------------------------------------------


def test_localspec_home_moves_everything_and_creates_nothing(localspec_home, tmp_path):
    home = tmp_path / "home"
    assert localspec_home.config_file == home / "models.toml"
    assert localspec_home.data_dir == home / "data"
    assert localspec_home.log_dir == home / "logs"
    assert localspec_home.db_path.parent == home / "data"
    load_config(localspec_home)
    assert not home.exists()


def test_without_localspec_home_platform_folders_are_used():
    paths = get_paths({})
    for folder in (paths.config_dir, paths.data_dir, paths.log_dir):
        assert "localspec" in str(folder)


# --- the bundled file ---------------------------------------------------------------------------------------


def test_bundled_file_has_six_curated_hub_pairs_a_demo_and_a_valid_default(localspec_home):
    config = load_config(localspec_home)
    hub_pairs = [p for p in config.pairs.values() if p.target.kind == "hub" and p.draft and p.draft.kind == "hub"]
    assert len(hub_pairs) >= 6
    assert config.pairs["demo"].target.kind == "builtin"
    assert config.default in config.pairs and config.pairs[config.default].target.kind == "hub"
    assert all(p.source == "bundled" and p.description for p in config.pairs.values())
    assert bundled_config_file().read_text(encoding="utf-8").count("confirmed") >= 1


def test_the_bundled_file_has_a_target_only_mtp_pair_and_a_same_family_draft_pair(localspec_home):
    """Issue #32: a laptop-size Qwen3.5 that keeps its MTP head, alone, and the same target with a small draft."""
    config = load_config(localspec_home)
    alone = [p for p in config.pairs.values() if p.draft is None]
    assert [p.name for p in alone] == ["qwen3.5-4b-mtp", "qwen3.5-9b-mtp", "qwen3.6-35b-a3b-mtp"]
    assert all("-MTP-GGUF" in p.target.label() for p in alone)  # the repositories that keep the head
    nine = config.get("qwen3.5-9b-mtp")
    [with_draft] = [p for p in config.pairs.values() if p.draft is not None and p.target == nine.target]
    assert "Qwen3.5-0.8B" in with_draft.draft.label()
    assert (
        nine.sampling_overrides()
        == with_draft.sampling_overrides()
        == {
            "temperature": 0.7,
            "top_p": 0.8,
            "top_k": 20,
            "min_p": 0.0,
        }
    )


def test_every_bundled_pair_says_where_its_repositories_were_confirmed():
    text = bundled_config_file().read_text(encoding="utf-8")
    for block in text.split("[pairs.")[1:]:
        name = block.split("]", 1)[0]
        before = text.split(f"[pairs.{name}]")[0].rsplit("\n\n", 1)[-1]
        assert before.lstrip().startswith("#"), f"pair {name} has no comment saying where it was confirmed"


# --- references ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "label", "quant"),
    [
        ("owner/repo-GGUF", f"owner/repo-GGUF:{DEFAULT_QUANT}", DEFAULT_QUANT),
        ("owner/repo-GGUF:q8_0", "owner/repo-GGUF:q8_0", "q8_0"),
        ({"repo": "owner/repo-GGUF", "file": "x.gguf"}, "owner/repo-GGUF/x.gguf", None),
        ({"repo": "owner/repo-GGUF"}, f"owner/repo-GGUF:{DEFAULT_QUANT}", DEFAULT_QUANT),
    ],
)
def test_hub_references(value, label, quant):
    ref = ModelSource.model_validate(value)
    assert (ref.kind, ref.label(), ref.quant) == ("hub", label, quant)


def test_relative_paths_are_relative_to_their_models_toml(tmp_path):
    parsed = read_models_file(
        write(
            tmp_path / "cfg" / "models.toml",
            '[pairs.p]\ntarget = { path = "m/t.gguf" }\ndraft = { path = "/abs/d.gguf" }\n',
        )
    )
    assert parsed.pairs["p"].target.path == tmp_path / "cfg" / "m" / "t.gguf"
    assert parsed.pairs["p"].draft.path == Path("/abs/d.gguf")


# --- schema errors: one line naming the file, the pair and the field ----------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('target = "not a ref"\ndraft = "a/b"', ["pair 'bad'", "field 'target'", "owner/repo:QUANT"]),
        ('target = "a/b"\ndraft = "a/b"\ntemprature = 0.5', ["pair 'bad'", "field 'temprature'", "unknown key"]),
        ('target = { repo = "a/b", flie = "x.gguf" }\ndraft = "a/b"', ["pair 'bad'", "target.flie", "unknown key"]),
        ('target = "a/b"\ndraft = "a/b"\nverify = "maybe"', ["pair 'bad'", "field 'verify'", "pq"]),
        ('target = "a/b"\ndraft = "a/b"\ntemperature = -1', ["pair 'bad'", "field 'temperature'", "0"]),
        ('target = "a/b"\ndraft = "a/b"\ntop_p = 0', ["pair 'bad'", "field 'top_p'"]),
        ('target = { repo = "a/b", file = "x.gguf", quant = "Q8_0" }\ndraft = "a/b"', ["field 'target'", "not both"]),
        ('target = { repo = "a/b", path = "x.gguf" }\ndraft = "a/b"', ["field 'target'", "exactly one"]),
        ('target = { builtin = "gpt-5" }\ndraft = "a/b"', ["target.builtin", "unknown builtin"]),
        ('draft = "a/b"', ["pair 'bad'", "field 'target'", "required"]),
    ],
)
def test_schema_errors_name_file_pair_and_field(tmp_path, body, expected):
    message = config_error(tmp_path, f"[pairs.bad]\n{body}\n")
    assert str(tmp_path / "models.toml") in message
    for part in expected:
        assert part in message, message


def test_unknown_top_level_key_and_bad_toml_are_errors(tmp_path):
    assert "field 'defualt'" in config_error(tmp_path, 'defualt = "x"\n')
    assert "invalid TOML" in config_error(tmp_path, "[pairs.x\n")
    assert "pair name" in config_error(tmp_path, '[pairs."a b"]\ntarget = "a/b"\ndraft = "a/b"\n')


def test_default_must_name_a_pair(localspec_home):
    write(localspec_home.config_file, 'default = "nope"\n')
    with pytest.raises(ConfigError, match=r"models\.toml: field 'default': no pair named 'nope'"):
        load_config(localspec_home)


# --- overlay ------------------------------------------------------------------------------------------------


def test_the_bundled_default_is_a_2026_pair_with_the_drafter_and_projector_its_repository_ships(localspec_home):
    """Issue 64: a default an 8 GB GPU runs whole (Gemma 4 E4B Q4_K_M, its assistant, its projector, one repository);
    the 2024-25 pairs come after the "Older pairs" heading, and the demo pair stays last."""
    config = load_config(localspec_home)
    default = config.get(config.default or "")
    assert (default.name, default.target.repo, default.target.file) == (
        "gemma4-e4b",
        "ggml-org/gemma-4-E4B-it-GGUF",
        "gemma-4-E4B-it-Q4_K_M.gguf",
    )
    assert default.draft is not None and default.mmproj is not None
    assert (default.draft.repo, default.draft.file) == (default.target.repo, "mtp-gemma-4-E4B-it-Q8_0.gguf")
    assert (default.mmproj.repo, default.mmproj.file) == (default.target.repo, "mmproj-gemma-4-E4B-it-Q8_0.gguf")
    names = list(config.pairs)
    text = bundled_config_file().read_text(encoding="utf-8")
    older = text.index("# ==== Older pairs")
    for name in ("llama3.1-8b", "qwen2.5-7b", "qwen2.5-14b", "qwen3-8b", "gemma3-12b", "gemma3-4b"):
        assert text.index(f'[pairs."{name}"]') > older, name
    for name in ("gemma4-e4b", "gemma4-12b", "qwen3.5-9b-mtp", "qwen3.6-35b-a3b-mtp"):
        assert text.index(f'[pairs."{name}"]') < older, name
    assert names[-1] == "demo"


def test_user_overlay_adds_overrides_and_sets_default(localspec_home):
    bundled = load_config(localspec_home)
    write(
        localspec_home.config_file,
        'default = "mine"\n'
        + PAIR
        + '[pairs."qwen2.5-7b"]\ntarget = { path = "t.gguf" }\ndraft = { path = "d.gguf" }\ntemperature = 0.1\n',
    )
    config = load_config(localspec_home)
    assert config.default == "mine" != bundled.default
    assert config.files == (bundled_config_file(), localspec_home.config_file)
    mine, replaced = config.get("mine"), config.get("qwen2.5-7b")
    assert (mine.source, mine.target.label(), mine.draft.quant) == ("user", "a/b-GGUF:Q8_0", DEFAULT_QUANT)
    assert replaced.source == "user" and replaced.target.path == localspec_home.config_dir / "t.gguf"
    assert replaced.sampling_overrides() == {"temperature": 0.1}
    assert set(config.pairs) == set(bundled.pairs) | {"mine"}
    assert config.get("llama3.1-8b").source == "bundled"


def test_user_file_errors_name_the_user_file(localspec_home):
    write(localspec_home.config_file, PAIR + "n_ctx = 4\n")
    with pytest.raises(ConfigError) as info:
        load_config(localspec_home)
    assert str(localspec_home.config_file) in str(info.value)
    assert "pair 'mine', field 'n_ctx'" in str(info.value)


def test_unknown_pair_lists_the_choices(localspec_home):
    with pytest.raises(ConfigError, match="unknown pair 'nope': choose one of .*qwen2.5-7b"):
        load_config(localspec_home).get("nope")


def test_overrides_split_by_consumer(tmp_path):
    text = PAIR + (
        'temperature = 0.3\ntop_k = 5\ndraft_max = 4\nverify = "match"\nn_ctx = 1024\nchat_template = "chatml"\n'
    )
    parsed = read_models_file(write(tmp_path / "models.toml", text))
    from localspec.models.catalog import Pair

    pair = Pair("mine", "user", tmp_path / "models.toml", parsed.pairs["mine"])
    assert pair.sampling_overrides() == {"temperature": 0.3, "top_k": 5}
    assert pair.speculative_overrides() == {"draft_max": 4, "verify": "match"}
    assert pair.model_overrides() == {"n_ctx": 1024, "chat_template": "chatml"}
