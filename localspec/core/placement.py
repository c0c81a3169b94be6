"""Where a pair goes before it loads: `plan_pair` and the one `GpuPlan` it returns (what goes where, and why).

The budget is the GPU's free memory (measured, or `--gpu-memory`) less a margin. The draft goes first and whole (it runs
k times a step, so on the CPU it costs the most), then the target's output layer and as many of its last layers as fit,
each with its KV cache (n_ctx cells, however many slots `serve --parallel` keeps: they share one pool) — llama.cpp
offloads from the top, and its `n_gpu_layers` counts the output as one layer. A MoE target keeps its experts on the CPU
(`--cpu-moe`) before dense layers leave the GPU. The context is shortened only when host memory cannot hold the rest,
only when the user did not ask for one, and the plan says so. Explicit layer counts win; counts that do not fit are one
line saying what would. Pure arithmetic: the footprints (sizes from the files' headers, `llama.footprint`), the GPU and
the RAM are given — core/load.py reads them from this machine (`plan_load`) — so tests can play any laptop.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from localspec.errors import LocalspecError
from localspec.llama.footprint import Footprint, compute_bytes_estimate

from .params import LoadParams

GIB, MIB = 2**30, 2**20
# Kept free on the GPU: llama.cpp's own fitting keeps 1 GiB; our estimates leave out the backend's workspaces.
DEFAULT_MARGIN = 1 * GIB
N_UBATCH = 512  # the contexts' batch (llama/context.py), which sizes the compute buffer
N_CTX_STEP = 256  # a shortened context is a multiple of this
RS_SNAPSHOTS = 8  # a speculating hybrid target's rollback snapshots: the default draft_max (k beyond: a checkpoint)


class PlacementError(LocalspecError):
    """The pair cannot be placed in this memory (said in one line, with what would fit)."""


def gib(n: int) -> str:
    """Bytes for people: "7.0 GiB", "312 MiB"."""
    return f"{n / GIB:.1f} GiB" if abs(n) >= GIB else f"{n / MIB:.0f} MiB"


@dataclass(frozen=True, slots=True)
class Gpu:
    """The GPU the plan fills: its name and the bytes it has free (measured, or what `--gpu-memory` says)."""

    name: str
    description: str
    free: int
    given: bool = False  # `free` is --gpu-memory's, not measured


@dataclass(frozen=True, slots=True)
class Ask:
    """What the user asked for (None: not asked, the plan decides)."""

    n_ctx: int | None = None
    target_layers: int | None = None  # --n-gpu-layers (-1: all)
    draft_layers: int | None = None  # --n-gpu-layers-draft
    cpu_moe: bool | None = None
    gpu_memory: int | None = None
    margin: int = DEFAULT_MARGIN
    rpc: bool = False  # the target's layers go to RPC workers (llama.cpp splits them)


@dataclass(frozen=True, slots=True)
class ModelPlan:
    """One model's placement: llama.cpp's `n_gpu_layers`, its experts, and the bytes on each side."""

    name: str
    n_layer: int
    gpu_layers: int  # llama.cpp's n_gpu_layers: the output layer, then the last layers; -1: all, onto RPC workers
    cpu_moe_layers: int  # the first layers whose MoE experts stay on the CPU (n_layer: all, as --cpu-moe)
    n_ctx: int
    gpu_bytes: int  # weights, KV cache and compute buffer on the GPU
    host_bytes: int  # the same on this machine's CPU side (weights there are mapped from the file)
    host_cache_bytes: int  # of which KV cache and compute buffer: what must be allocated in RAM
    by_flag: bool = False  # the layer count is the user's, not the plan's

    @property
    def cpu_moe(self) -> bool:
        return self.cpu_moe_layers > 0

    @property
    def layers_on_gpu(self) -> int:
        """Repeating layers on the GPU (the output layer apart)."""
        return self.n_layer if self.gpu_layers < 0 else max(0, min(self.gpu_layers, self.n_layer + 1) - 1)

    def describe(self) -> str:
        if self.gpu_layers < 0:
            return f"{self.name}: all layers on the RPC workers"
        where = f"{self.layers_on_gpu}/{self.n_layer} layers" + (" + output" if self.gpu_layers > 0 else "")
        moe = ""
        if self.cpu_moe:
            moe = (
                ", experts on CPU"
                if self.cpu_moe_layers >= self.n_layer
                else f", experts of {self.cpu_moe_layers} on CPU"
            )
        return f"{self.name}: {where} on GPU ({gib(self.gpu_bytes)}){moe}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "n_layer": self.n_layer,
            "n_gpu_layers": self.gpu_layers,
            "layers_on_gpu": self.layers_on_gpu,
            "cpu_moe_layers": self.cpu_moe_layers,
            "n_ctx": self.n_ctx,
            "gpu_bytes": self.gpu_bytes,
            "host_bytes": self.host_bytes,
            "host_cache_bytes": self.host_cache_bytes,
            "by_flag": self.by_flag,
        }


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """Exactly what goes where for one pair: the device, each model's placement, the context, and why."""

    device: str  # "CUDA0 (NVIDIA …)", or "CPU" when there is no GPU
    free: int | None  # the GPU's free bytes the plan started from (None: no GPU)
    margin: int
    target: ModelPlan
    draft: ModelPlan | None
    n_ctx: int
    n_ctx_asked: int | None
    notes: tuple[str, ...] = field(default=())  # why, where the plan chose (experts out, a draft split)
    warnings: tuple[str, ...] = field(default=())  # what the user must be told: a shortened context, paging

    @property
    def on_gpu(self) -> bool:
        return self.free is not None

    @property
    def gpu_bytes(self) -> int:
        return self.target.gpu_bytes + (self.draft.gpu_bytes if self.draft else 0)

    @property
    def host_bytes(self) -> int:
        return self.target.host_bytes + (self.draft.host_bytes if self.draft else 0)

    def describe(self) -> str:
        """One line: "CUDA0, 8.0 GiB free: draft … ; target … ; n_ctx 4096 (…)"."""
        if not self.on_gpu:
            why = "".join(f"; {note}" for note in self.notes + self.warnings)
            return f"CPU only{why}; n_ctx {self.n_ctx}; {gib(self.host_bytes)} on the CPU side"
        parts = [p.describe() for p in (self.draft, self.target) if p is not None]
        head = f"{self.device}, {gib(self.free or 0)} free less {gib(self.margin)} margin"
        why = self.notes + self.warnings
        tail = f"n_ctx {self.n_ctx}" + (f" ({'; '.join(why)})" if why else "")
        return f"{head}: {'; '.join(parts)}; {tail}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "gpu_free": self.free,
            "margin": self.margin,
            "gpu_bytes": self.gpu_bytes,
            "host_bytes": self.host_bytes,
            "n_ctx": self.n_ctx,
            "n_ctx_asked": self.n_ctx_asked,
            "target": self.target.to_dict(),
            "draft": self.draft.to_dict() if self.draft else None,
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "text": self.describe(),
        }


DEFAULT_N_CTX = 4096  # the context when none is asked for (or the model's own when shorter)


def split_bytes(model: Footprint, gpu_layers: int, n_ctx: int, cpu_moe_layers: int = 0) -> tuple[int, int, int]:
    """(GPU bytes, host bytes, of which KV cache and compute buffer) of `model` loaded with llama.cpp's
    `n_gpu_layers = gpu_layers` (-1: all) and the experts of its first `cpu_moe_layers` layers on the CPU.

    llama.cpp puts the output layer and the last `gpu_layers - 1` repeating layers on the GPU, each layer's KV cache
    with it, and keeps the input layer on the CPU. A tied output is a second copy of the embeddings on the GPU only
    (on the CPU both map the same file bytes). The compute buffer is on each side that runs layers.
    """
    n = model.n_layer
    on_gpu = n + 1 if gpu_layers < 0 else min(gpu_layers, n + 1)
    first = n + 1 - on_gpu  # the first repeating layer on the GPU; index n is the output layer
    gpu, host, cache = 0, model.input_bytes, 0
    for i in range(n):
        weights, kv = model.layer_bytes[i], model.cache_bytes(i, n_ctx)
        if i >= first:
            experts = model.expert_bytes[i] if i < cpu_moe_layers else 0
            gpu, host = gpu + weights - experts + kv, host + experts
        else:
            host, cache = host + weights + kv, cache + kv
    compute = compute_bytes_estimate(model, min(N_UBATCH, n_ctx))
    if on_gpu:
        gpu += model.output_bytes + compute
    else:
        host += model.output_bytes - model.tied_bytes
    if first < n:  # some layers run on the CPU
        host, cache = host + compute, cache + compute
    return gpu, host, cache


def _placed(
    model: Footprint, name: str, gpu_layers: int, n_ctx: int, cpu_moe: int = 0, by_flag: bool = False
) -> ModelPlan:
    gpu, host, cache = split_bytes(model, gpu_layers, n_ctx, cpu_moe if model.is_moe else 0)
    return ModelPlan(name, model.n_layer, gpu_layers, cpu_moe if model.is_moe else 0, n_ctx, gpu, host, cache, by_flag)


def _most_layers(model: Footprint, name: str, budget: int, n_ctx: int, cpu_moe: int = 0) -> ModelPlan:
    """The largest `n_gpu_layers` whose GPU bytes fit `budget` (0 when not even the output layer does)."""
    best = _placed(model, name, 0, n_ctx, cpu_moe)
    for layers in range(1, model.n_layer + 2):  # GPU bytes grow with each layer: stop at the first that does not fit
        plan = _placed(model, name, layers, n_ctx, cpu_moe)
        if plan.gpu_bytes > budget:
            break
        best = plan
    return best


def _fewest_experts_out(model: Footprint, budget: int, n_ctx: int) -> ModelPlan:
    """A MoE target: every layer on the GPU with the experts of as few first layers as possible on the CPU (llama.cpp's
    --n-cpu-moe); when not even every expert out makes every layer fit, as many layers as fit with every expert out."""
    for cpu_moe in range(1, model.n_layer + 1):
        plan = _placed(model, "target", model.n_layer + 1, n_ctx, cpu_moe)
        if plan.gpu_bytes <= budget:
            return plan
    return _most_layers(model, "target", budget, n_ctx, model.n_layer)


def _layers(asked: int | None, model: Footprint) -> int | None:
    """An asked layer count as llama.cpp takes it (-1 and anything past the output layer: all)."""
    if asked is None:
        return None
    return model.n_layer + 1 if asked < 0 or asked > model.n_layer + 1 else asked


def plan_pair(target: Footprint, draft: Footprint | None, ask: Ask, gpu: Gpu | None, host_free: int) -> GpuPlan:
    """Place a pair: the draft whole on the GPU first, then the target's layers; see the module's docstring.

    Args:
        target: the target's footprint.
        draft: the draft's (None: no draft model is loaded).
        ask: what the user asked (flags, then the pair's models.toml keys).
        gpu: the GPU to fill (its free memory already replaced by --gpu-memory); None: no GPU in this build.
        host_free: RAM available for KV caches and compute buffers on the CPU side.

    Returns:
        The plan; its `notes` say why where the plan chose (experts on the CPU), its `warnings` what the user must be
        told (a shortened context, weights beyond RAM).

    Raises:
        PlacementError: asked layer counts beyond the GPU, or an asked context beyond host memory (one line saying
            what would fit).
    """
    n_ctx = ask.n_ctx or min(DEFAULT_N_CTX, target.n_ctx_train or DEFAULT_N_CTX)
    plan, notes = _place(target, draft, ask, gpu, n_ctx), []
    if _cache(plan) > host_free:
        fitting = _longest_fit(target, draft, ask, gpu, host_free, n_ctx)
        if ask.n_ctx is not None or fitting is None:
            would = f"--n-ctx {fitting} or less" if fitting else "a smaller quant"
            more = ", or more layers on the GPU" if gpu is not None else ""
            raise PlacementError(
                f"n_ctx {n_ctx} needs {gib(_cache(plan))} of KV cache and compute buffers in RAM but "
                f"{gib(host_free)} is available: use {would}{more}"
            )
        notes.append(f"n_ctx {n_ctx} shortened to {fitting}: {gib(host_free)} of RAM holds no more")
        plan = _place(target, draft, ask, gpu, fitting)
    host_weights = plan.host_bytes - _cache(plan)
    if host_weights > host_free:
        notes.append(
            f"{gib(host_weights)} of weights on the CPU side and {gib(host_free)} of RAM available: expect paging "
            "(a smaller quant would fit)"
        )
    return replace(plan, n_ctx_asked=ask.n_ctx, warnings=(*plan.warnings, *notes))


def _cache(plan: GpuPlan) -> int:
    return plan.target.host_cache_bytes + (plan.draft.host_cache_bytes if plan.draft else 0)


def _longest_fit(
    target: Footprint, draft: Footprint | None, ask: Ask, gpu: Gpu | None, host_free: int, below: int
) -> int | None:
    """The longest context under `below` (a multiple of N_CTX_STEP) whose host caches fit; None when none does.

    Bisected: the caches left in RAM only grow with the context (a longer one also leaves fewer layers on the GPU).
    """

    def fits(steps: int) -> bool:
        try:
            return _cache(_place(target, draft, ask, gpu, steps * N_CTX_STEP)) <= host_free
        except PlacementError:  # asked layer counts that stop fitting the GPU at this length
            return False

    below = min(below, target.n_ctx_train + 1) if target.n_ctx_train else below  # never past what it was trained for
    lo, hi = 0, (below - 1) // N_CTX_STEP  # fits(lo) is taken as true, fits(hi + 1) as false
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo * N_CTX_STEP if lo else None


def _place(target: Footprint, draft: Footprint | None, ask: Ask, gpu: Gpu | None, n_ctx: int) -> GpuPlan:
    """The placement at one context length (host memory not checked)."""
    draft_ctx = min(n_ctx, draft.n_ctx_train or n_ctx) if draft is not None else n_ctx
    asked_moe = target.n_layer if ask.cpu_moe else 0
    if gpu is None:
        note = "no GPU in this llama.cpp build"
        # an asked --cpu-moe is passed on all the same: nothing to move without a GPU, and the same load path
        t_plan = _remote(target, ask, n_ctx) if ask.rpc else _placed(target, "target", 0, n_ctx, asked_moe)
        d_plan = _placed(draft, "draft", 0, draft_ctx) if draft else None
        if ignored := _ignored_without_gpu(ask):  # said, never silent: the user asked for a GPU
            return GpuPlan(
                "CPU", None, ask.margin, t_plan, d_plan, n_ctx, ask.n_ctx, (), (f"{note}: {ignored} ignored",)
            )
        return GpuPlan("CPU", None, ask.margin, t_plan, d_plan, n_ctx, ask.n_ctx, (note,))
    notes: list[str] = []
    budget = max(0, gpu.free - ask.margin)
    t_asked = _layers(ask.target_layers, target)
    d_asked = _layers(ask.draft_layers, draft) if draft else None
    t_given = _placed(target, "target", t_asked, n_ctx, asked_moe, True) if t_asked is not None else None
    d_plan = None
    if draft is not None and d_asked is not None:
        d_plan = _placed(draft, "draft", d_asked, draft_ctx, 0, True)
    elif draft is not None:
        d_plan = _most_layers(draft, "draft", budget - (t_given.gpu_bytes if t_given else 0), draft_ctx)
        if d_plan.layers_on_gpu < draft.n_layer:
            notes.append("the draft does not fit whole")
    room = budget - (d_plan.gpu_bytes if d_plan else 0)
    if t_given is not None:
        t_plan = t_given
    elif ask.rpc:
        t_plan = _remote(target, ask, n_ctx)
    else:
        t_plan = _most_layers(target, "target", room, n_ctx, asked_moe)
        if ask.cpu_moe is None and target.is_moe and t_plan.layers_on_gpu < target.n_layer:
            t_plan = _fewest_experts_out(target, room, n_ctx)
            notes.append("experts on the CPU before layers: the whole target does not fit with them")
    plan = GpuPlan(gpu.name, gpu.free, ask.margin, t_plan, d_plan, n_ctx, ask.n_ctx, tuple(notes))
    if plan.gpu_bytes > budget and (t_given is not None or d_asked is not None):
        raise PlacementError(_gpu_error(target, draft, ask, gpu, n_ctx, plan, budget))
    return plan


def _ignored_without_gpu(ask: Ask) -> str:
    """The placement asks (flags or models.toml keys) that a build without a GPU cannot follow, named ("" for none)."""
    asked = [
        "--gpu-memory" if ask.gpu_memory else "",
        f"--n-gpu-layers {ask.target_layers}" if ask.target_layers and not ask.rpc else "",
        f"--n-gpu-layers-draft {ask.draft_layers}" if ask.draft_layers else "",
        "--cpu-moe" if ask.cpu_moe else "",
    ]
    return ", ".join(a for a in asked if a)


def _remote(target: Footprint, ask: Ask, n_ctx: int) -> ModelPlan:
    """The target on RPC workers: llama.cpp splits its layers by the workers' free memory, not sized here; the input
    layer stays on this machine's CPU."""
    layers = -1 if ask.target_layers is None else ask.target_layers
    cpu_moe = target.n_layer if ask.cpu_moe and target.is_moe else 0
    return ModelPlan(
        "target", target.n_layer, layers, cpu_moe, n_ctx, 0, target.input_bytes, 0, ask.target_layers is not None
    )


def _gpu_error(
    target: Footprint, draft: Footprint | None, ask: Ask, gpu: Gpu, n_ctx: int, plan: GpuPlan, budget: int
) -> str:
    """What the asked layer counts need, and the counts the plan would choose instead."""
    own = _place(target, draft, replace(ask, target_layers=None, draft_layers=None), gpu, n_ctx)
    would = [f"--n-gpu-layers {own.target.gpu_layers}"]
    if own.draft is not None:
        would.append(f"--n-gpu-layers-draft {own.draft.gpu_layers}")
    hints = " and ".join(would) + " (the plan's; or leave them out), a smaller --n-ctx or a smaller quant"
    if target.is_moe and not ask.cpu_moe:
        hints += ", or --cpu-moe"
    asked = [f"--n-gpu-layers {ask.target_layers}"] if plan.target.by_flag else []
    if plan.draft is not None and plan.draft.by_flag:
        asked.append(f"--n-gpu-layers-draft {ask.draft_layers}")
    return (
        f"the pair needs {gib(plan.gpu_bytes)} on {gpu.name} with {' and '.join(asked)}, but {gib(budget)} is free "
        f"after the {gib(ask.margin)} margin: use {hints}"
    )


def ask_of(params: LoadParams) -> Ask:
    """What the load parameters ask of the plan."""
    return Ask(
        n_ctx=params.n_ctx,
        target_layers=params.n_gpu_layers,
        draft_layers=params.n_gpu_layers_draft,
        cpu_moe=params.cpu_moe,
        gpu_memory=params.gpu_memory,
        rpc=bool(params.rpc),
    )
