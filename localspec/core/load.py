"""Loading policy: which models to open and how to set up their contexts (swa_full, device sampling, n_ctx).

`load_models` opens the target (and the draft), checks them, creates each context and its `KVSequence`, and
builds the drafter; `Engine.load` wraps the result. Everything opened is closed again if a later step fails.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localspec.errors import InvalidParamsError
from localspec.llama import rpc
from localspec.llama.compat import check_pair, check_target
from localspec.llama.context import Context as LlamaContext
from localspec.llama.model import Model, check_gguf_file

from .bridge import VocabBridge
from .drafters import Drafter, make_drafter
from .kv import KVSequence
from .params import LoadParams, needs_draft_model
from .placement import DEFAULT_N_CTX, GpuPlan, ModelPlan, plan_load

__all__ = ["DEFAULT_N_CTX", "Loaded", "load_models"]
log = logging.getLogger(__name__)


@dataclass(slots=True)
class Loaded:
    """What `load_models` opened: the engine's parts, and the native objects to close (in reverse order)."""

    target_model: Model
    target: KVSequence
    drafter: Drafter
    bridge: VocabBridge | None
    plan: GpuPlan  # where each model went (core/placement.py)
    owned: list = field(default_factory=list)


def load_models(
    target_path: str | Path,
    draft_path: str | Path | None,
    params: LoadParams,
    *,
    progress: Callable[[float], None] | None = None,
) -> Loaded:
    """Open the target (and the draft) and create their contexts (see `Engine.load`).

    The models go where the placement plan puts them (`plan_load`: the draft whole on the GPU first, then the
    target's layers; explicit layer counts win), and the plan's n_ctx is the target's context.

    Raises:
        LocalspecError: bad files, incompatible draft, n_ctx too large, unknown drafter, a pair that does not fit.
    """
    if needs_draft_model(params.drafter) and draft_path is None:
        raise InvalidParamsError(f"--drafter {params.drafter} needs --draft PATH (or use --drafter ngram or none)")
    uses_draft = needs_draft_model(params.drafter)
    for path in (target_path, draft_path if uses_draft else None):
        if path is not None:
            check_gguf_file(Path(path))  # its own one-line errors before the plan reads the header
    plan = plan_load(target_path, draft_path if uses_draft else None, params)
    log.info("placement: %s", plan.describe())
    for warning in plan.warnings:
        log.warning("placement: %s", warning)
    owned: list = []
    try:
        workers = tuple(rpc.Endpoint.parse(e) for e in params.rpc)
        placement = _own(owned, rpc.attach(workers)) if workers else None
        target_model = _own(owned, _open(target_path, plan.target, placement=placement, progress=progress))
        check_target(target_model)
        draft_model = bridge = None
        if uses_draft and plan.draft is not None:
            draft_model = _own(owned, _open(draft_path, plan.draft))
            if check_pair(target_model, draft_model, hint=params.compat_hint).kind == "bridged":
                bridge = VocabBridge(target_model, draft_model, params.bridge)
        speculating = params.drafter != "none"
        n_ctx = plan.n_ctx
        target = _sequence(owned, target_model, n_ctx, params, speculating)
        draft = None
        if draft_model is not None:
            draft_n_ctx = min(n_ctx, draft_model.info.n_ctx_train)
            draft = _sequence(owned, draft_model, draft_n_ctx, params, True)
        for seq in (target, draft):  # not timed: the policy must not judge the draft by a cold first step
            if seq is not None:
                seq.warm()
        drafter = make_drafter(params.drafter, draft, bridge)
        return Loaded(target_model, target, drafter, bridge, plan, owned)
    except BaseException:
        for obj in reversed(owned):
            obj.close()
        raise


def _open(path: str | Path, plan: ModelPlan, **options) -> Model:
    """A model where its plan puts it: its layers on the GPU, its experts on the CPU."""
    return Model(path, n_gpu_layers=plan.gpu_layers, cpu_moe_layers=plan.cpu_moe_layers, **options)


def _own(owned: list, obj):
    owned.append(obj)
    return obj


def _sequence(owned: list, model: Model, n_ctx: int, params: LoadParams, speculating: bool) -> KVSequence:
    swa_full = params.swa_full
    if swa_full is None:
        # A sliding-window cache drops cells a long rollback needs; the full cache keeps them.
        swa_full = speculating and model.info.n_swa > 0
    # Greedy tokens from the graph: on a GPU only a token id leaves the device. On a CPU the logits are read here
    # anyway, and a numpy argmax measured as fast (README, "Where sampling runs").
    # The draft's law at T > 0 from the graph (top-k candidates only) is for `on` alone: on this CPU and on an H100
    # (8B/1B shapes) the in-graph top-k cost more than the Python it saved.
    device = params.device_sampling == "on" or (params.device_sampling == "auto" and model.on_local_gpu)
    ctx = _own(
        owned,
        LlamaContext(
            model,
            n_ctx=n_ctx,
            swa_full=swa_full,
            n_threads=params.n_threads,
            device_greedy=device,
            device_topk=params.device_sampling == "on",
        ),
    )
    return KVSequence(ctx, rollback=params.rollback)
