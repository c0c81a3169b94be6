"""Loading through the placement plan on the real llama.cpp (this CPU-only build): the engine keeps its plan, the
draft gets its own layer count, --cpu-moe loads and decodes, and a load that fails part-way frees what it opened."""

from __future__ import annotations

import gc

import pytest
from support import GREEDY, run_to_end
from support.tinymodels import write_moe_model

from localspec.core.engine import Engine
from localspec.core.load import load_models
from localspec.core.params import LoadParams
from localspec.errors import ContextError, ModelFileError
from localspec.llama.context import Context
from localspec.llama.devices import devices
from localspec.llama.model import Model

CPU_ONLY = not any(d.kind in ("gpu", "igpu") for d in devices())


def open_handles() -> int:
    """Models and contexts of this process whose native memory is still held."""
    gc.collect()
    return sum(
        1 for o in gc.get_objects() if isinstance(o, Model | Context) and getattr(o, "_handle", None) is not None
    )


@pytest.mark.skipif(not CPU_ONLY, reason="the CPU plan of a build without a GPU")
def test_the_engine_keeps_the_plan_it_was_loaded_with(tiny_models):
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512, gpu_memory=8 * 2**30) as engine:
        plan = engine.plan
        assert plan is not None and not plan.on_gpu and plan.n_ctx == engine.n_ctx == 512
        assert plan.target.gpu_layers == plan.draft.gpu_layers == 0
        assert "--gpu-memory ignored" in plan.describe()
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, drafter="none") as engine:
        assert engine.plan.draft is None  # a draft file that is not used is not planned for


def test_cpu_moe_loads_and_decodes_as_without(tmp_path):
    path = write_moe_model(tmp_path / "moe.gguf")
    texts = []
    for cpu_moe in (None, True):
        with Engine.load(path, None, drafter="none", n_ctx=256, cpu_moe=cpu_moe) as engine:
            assert engine.plan.target.cpu_moe_layers == (engine.plan.target.n_layer if cpu_moe else 0)
            texts.append(run_to_end(engine, engine.tokenize("Hello"), sampling=GREEDY, max_tokens=8).tokens)
    assert texts[0] == texts[1]


@pytest.mark.slow
def test_a_load_that_fails_part_way_frees_what_it_opened(tiny_models):
    before = open_handles()
    with pytest.raises(ModelFileError):  # the draft fails after the target loaded
        load_models(tiny_models.target, tiny_models.truncated, LoadParams())
    assert open_handles() == before
    with pytest.raises(ContextError):  # both models loaded, the target's context fails
        load_models(tiny_models.target, tiny_models.draft_noisy, LoadParams(n_ctx=4096))
    assert open_handles() == before
    loaded = load_models(tiny_models.target, tiny_models.draft_noisy, LoadParams(n_ctx=256))
    assert open_handles() == before + 4  # the control: two models and two contexts are counted
    for obj in reversed(loaded.owned):
        obj.close()
    assert open_handles() == before
