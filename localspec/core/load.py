"""Loading policy: which models to open and how to set up their contexts (swa_full, device sampling, n_ctx).

`load_models` plans the pair's placement from what this machine has (`plan_load`: the files' headers, this build's
GPU, the RAM available; core/placement.py does the arithmetic), opens the target (and the draft), checks them,
creates each context and its `KVSequence`, and builds the drafter; `Engine.load` wraps the result. Everything opened
is closed again if a later step fails.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localspec.errors import ContextError, InvalidParamsError
from localspec.llama import assistant, mtp, rpc
from localspec.llama.compat import check_pair, check_target
from localspec.llama.context import Context as LlamaContext
from localspec.llama.context import memory_bytes
from localspec.llama.devices import devices
from localspec.llama.footprint import Footprint, read_footprint, read_header
from localspec.llama.model import Model, check_gguf_file
from localspec.llama.vision import Projector

from .assistant import AssistantDrafter
from .bridge import BridgedDrafter, VocabBridge
from .drafters import Drafter, ModelDrafter, make_drafter
from .head import MtpDrafter
from .kv import KVSequence
from .media import Embedded, Filler, MediaStore, ZeroRows
from .params import AUTO_DRAFTER, LoadParams, drafts, needs_draft_model
from .placement import DEFAULT_N_CTX, RS_SNAPSHOTS, Gpu, GpuPlan, ModelPlan, ask_of, plan_pair

__all__ = ["DEFAULT_N_CTX", "Loaded", "footprints", "load_models", "local_gpu", "plan_load"]
log = logging.getLogger(__name__)


@dataclass(slots=True)
class Loaded:
    """What `load_models` opened: the engine's parts, and the native objects to close (in reverse order)."""

    target_model: Model
    target: KVSequence
    drafter: Drafter
    model_drafter: Drafter | None  # the draft model's drafter (plain or bridged) that `drafter` wraps or is
    bridge: VocabBridge | None
    plan: GpuPlan  # where each model went (core/placement.py)
    owned: list = field(default_factory=list)
    note: str = ""  # what loading must tell the user (the MTP head's fallback to n-grams)
    slots_note: str = ""  # why a target loaded for automatic slots (`LoadParams.n_seq` 0) has fewer ("" otherwise)
    media: MediaStore | None = None  # the target's images (None: no projector: text only)


def load_models(
    target_path: str | Path,
    draft_path: str | Path | None,
    params: LoadParams,
    *,
    progress: Callable[[float], bool | None] | None = None,
) -> Loaded:
    """Open the target (and the draft) and create their contexts (see `Engine.load`).

    The models go where the placement plan puts them (`plan_load`: the draft whole on the GPU first, then the
    target's layers; explicit layer counts win), and the plan's n_ctx is the target's context.

    Raises:
        LocalspecError: bad files, incompatible draft, n_ctx too large, unknown drafter, a pair that does not fit.
    """
    if (needs_draft_model(params.drafter) or params.drafter == "assistant") and draft_path is None:
        raise InvalidParamsError(f"--drafter {params.drafter} needs --draft PATH (or use --drafter ngram or none)")
    reads_draft = needs_draft_model(params.drafter) or params.drafter == "assistant"
    for path in (target_path, draft_path if reads_draft else None):
        if path is not None:
            check_gguf_file(Path(path))  # its own one-line errors before the plan reads the header
    if reads_draft and draft_path is not None:
        params = dataclasses.replace(params, drafter=sidecar_drafter(params.drafter, draft_path))
    uses_draft = needs_draft_model(params.drafter)
    sidecar = params.drafter == "assistant"
    plan = plan_load(target_path, draft_path if uses_draft or sidecar else None, params)
    if params.drafter == "mtp" and not mtp.mtp_calls() and plan_target_heads(target_path) == 0:  # before any load
        raise InvalidParamsError(_no_head(Path(target_path).name, draft_path is not None))
    log.info("placement: %s", plan.describe())
    for warning in plan.warnings:
        log.warning("placement: %s", warning)
    owned: list = []
    try:
        workers = tuple(rpc.Endpoint.parse(e) for e in params.rpc)
        placement = _own(owned, rpc.attach(workers)) if workers else None
        missing = mtp.mtp_calls() if params.drafter in ("mtp", AUTO_DRAFTER) else ""
        load_head = params.drafter in ("mtp", AUTO_DRAFTER) and not missing and placement is None
        target_model = _own(
            owned, _open(target_path, plan.target, placement=placement, progress=progress, load_mtp=load_head)
        )
        check_target(target_model)
        kind, note = head_drafter(params.drafter, target_model, missing, placement is not None)
        if kind == "assistant":
            kind, note = assistant_drafter(placement is not None)
        media = None
        if params.mmproj is not None:
            if kind == "mtp":
                raise InvalidParamsError(
                    f"--drafter {kind} does not follow an image yet: with --mmproj use --drafter model, ngram or none"
                )
            projector = _own(owned, Projector(params.mmproj, target_model, n_threads=params.n_threads))
            media = _own(owned, MediaStore(projector))
        draft_model = bridge = None
        if uses_draft and plan.draft is not None:
            draft_model = _own(owned, _open(draft_path, plan.draft))
            if check_pair(target_model, draft_model, hint=params.compat_hint).kind == "bridged":
                bridge = VocabBridge(target_model, draft_model, params.bridge)
        sidecar_model = None
        if kind == "assistant" and plan.draft is not None and draft_path is not None:
            sidecar_model = _own(owned, _open(draft_path, plan.draft))
            assistant.check_assistant(sidecar_model, target_model)
        speculating = drafts(kind)
        n_ctx = plan.n_ctx
        n_seq, slots_note = (params.n_seq, "") if params.n_seq else slots_for(target_model, kind)
        target = _sequence(owned, target_model, n_ctx, params, speculating, snapshots=RS_SNAPSHOTS, n_seq=n_seq)
        draft = None
        if draft_model is not None:
            draft_n_ctx = min(n_ctx, draft_model.info.n_ctx_train)
            draft = _sequence(owned, draft_model, draft_n_ctx, params, True)
        for seq in (target, draft):  # not timed: the policy must not judge the draft by a cold first step
            if seq is not None:
                seq.warm()
        if media is not None:
            target.media = media
            if draft is not None:
                draft.media = draft_images(media, draft.ctx.model, bridged=bridge is not None)
        model_drafter = _model_drafter(draft, target_model, bridge) if draft is not None else None
        head = helper = None  # the target's MTP head's drafter, or the assistant's
        if kind == "mtp":
            try:
                head = _head_drafter(owned, target_model, target, n_ctx, params)
            except ContextError as e:  # llama.cpp would not make the head's context: the target still works
                log.warning("the MTP head could not start (%s): drafting with n-grams", e)
                kind, note = "ngram", "the MTP head could not start: drafting with n-grams"
        if kind == "assistant" and sidecar_model is not None:
            try:
                helper = _assistant_drafter(owned, sidecar_model, target, params)
            except ContextError as e:
                log.warning("the assistant could not start (%s): drafting with n-grams", e)
                kind, note = "ngram", f"the assistant {sidecar_model.path.name} could not start: drafting with n-grams"
        drafter = make_drafter(kind, head or helper or model_drafter)  # a draft model loads for the model kinds alone
        return Loaded(target_model, target, drafter, model_drafter, bridge, plan, owned, note, slots_note, media)
    except BaseException:
        for obj in reversed(owned):
            obj.close()
        raise


def draft_images(media: MediaStore, draft: Model, *, bridged: bool) -> Embedded | ZeroRows | Filler:
    """How a draft reads an image (core/media.py): the target's embeddings of it where its input width is the
    target's, else rows of zeros of its own width; a blank of spaces where positions are not one per row (M-RoPE) or
    the draft is bridged (its text has no picture: it reads none of the target's rows)."""
    if bridged or media.projector.uses_mrope:
        return Filler(filler_token(draft))
    return Embedded(media) if media.projector.feeds(draft) else ZeroRows(media)


def filler_token(model: Model) -> int:
    """The plain token a draft reads for each position of an image it cannot see (core/media.py `Filler`): a space."""
    tokens = model.tokenize(" ", add_special=False, parse_special=False)
    return tokens[-1] if tokens else 0


AUTO_SLOTS = 4  # slots where the target can take several streams (llama-server's automatic `-np`)


def slots_for(target: Model, drafter_kind: str) -> tuple[int, str]:
    """(sequences, why fewer than `AUTO_SLOTS`) for automatic slots. One where a slot could not share the target's
    context — a recurrent or hybrid memory cannot drop a tail in a shared batch, an MTP head reads the target's own
    rows — else `AUTO_SLOTS`: the slots share one pool of n_ctx cells (`Context(n_seq=…)`), so more slots take no
    more KV memory."""
    info = target.info
    if info.is_recurrent or info.is_hybrid:
        return 1, f"{target.path.name} is a {'hybrid' if info.is_hybrid else 'recurrent'} model: one slot"
    if drafter_kind == "mtp":
        return 1, "the target's MTP head drafts: one slot (it reads the target's rows, one stream's)"
    if drafter_kind == "assistant":
        return 1, "the Gemma 4 assistant drafts: one slot (it reads the target's rows, one stream's)"
    return AUTO_SLOTS, ""


def local_gpu(gpu_memory: int | None = None) -> Gpu | None:
    """This build's first GPU, with `gpu_memory` as its free memory when given; None when the build has none.

    With several GPUs llama.cpp spreads the offloaded layers over all of them: planning for the first alone is the
    cautious side of that.
    """
    for device in devices():
        if device.kind in ("gpu", "igpu"):
            free = device.memory_free if gpu_memory is None else gpu_memory
            return Gpu(device.name, device.description, free, given=gpu_memory is not None)
    return None


def footprints(target: str | Path, draft: str | Path | None, params: LoadParams) -> tuple[Footprint, Footprint | None]:
    """The pair's footprints as their contexts will hold them: a target that may speculate keeps `RS_SNAPSHOTS`
    rollback snapshots of its recurrent state where llama.cpp has them (Qwen3.5: 9 copies of ~50 MiB at 9B).

    Raises:
        ModelFileError: a file whose GGUF header cannot be read.
    """
    target_footprint = read_footprint(target)
    if drafts(params.drafter):
        target_footprint = target_footprint.with_snapshots(RS_SNAPSHOTS)
    return target_footprint, read_footprint(draft) if draft is not None else None


def plan_load(target: str | Path, draft: str | Path | None, params: LoadParams) -> GpuPlan:
    """The plan for loading these files on this machine: their headers, this build's GPU and the RAM available.

    Raises:
        ModelFileError: a file whose GGUF header cannot be read.
        PlacementError: as `plan_pair`.
    """
    gpu = local_gpu(params.gpu_memory)
    return plan_pair(*footprints(target, draft, params), ask_of(params), gpu, memory_bytes())


def _open(path: str | Path, plan: ModelPlan, **options) -> Model:
    """A model where its plan puts it: its layers on the GPU, its experts on the CPU."""
    return Model(path, n_gpu_layers=plan.gpu_layers, cpu_moe_layers=plan.cpu_moe_layers, **options)


def head_drafter(drafter: str, target: Model, missing: str, remote: bool) -> tuple[str, str]:
    """What `drafter` (a name in DRAFTERS, or AUTO_DRAFTER) becomes for this target, and what to tell the user:
    "auto" is "mtp" where the target carries an MTP head this llama-cpp-python can run, else "none"; a head it
    cannot run drafts with n-grams (one line). Others stay.

    Raises:
        InvalidParamsError: --drafter mtp on a target without MTP layers.
    """
    if drafter not in ("mtp", AUTO_DRAFTER):
        return drafter, ""
    if drafter == AUTO_DRAFTER and target.n_layer_nextn == 0:
        return "none", ""
    if drafter == "mtp" and target.n_layer_nextn == 0 and not missing:
        raise InvalidParamsError(_no_head(target.path.name, has_draft=False))
    problem = missing and "this llama-cpp-python has no MTP calls"
    problem = problem or (remote and "the MTP head does not run on RPC workers yet")
    problem = problem or mtp.head_problem(target.info.arch, target.n_layer_nextn)
    if problem:
        log.warning("%s: drafting with n-grams", problem)
        log.debug("missing MTP calls: %s", missing)
        return "ngram", f"{problem}: drafting with n-grams"
    return "mtp", ""


def sidecar_drafter(drafter: str, draft_path: str | Path) -> str:
    """What `drafter` becomes with this draft file: a Gemma 4 assistant sidecar (llama/assistant.py) drafts as
    "assistant" where a draft model would ("model", "model+ngram": the default with a draft); others stay.

    Raises:
        InvalidParamsError: --drafter assistant with a draft that is no assistant.
        ModelFileError: a draft whose GGUF header cannot be read.
    """
    arch = read_header(draft_path).arch
    if assistant.is_assistant(arch):
        return "assistant" if needs_draft_model(drafter) or drafter == "assistant" else drafter
    if drafter == "assistant":
        raise InvalidParamsError(
            f"--drafter assistant: {Path(draft_path).name} is a {arch} model, not an assistant sidecar "
            "(general.architecture gemma4-assistant): use --drafter model, or give the target's mtp-*.gguf"
        )
    return drafter


def assistant_drafter(remote: bool) -> tuple[str, str]:
    """("assistant", "") where this llama-cpp-python can run an assistant here, else n-grams and why (one line)."""
    problem = ""
    if missing := assistant.assistant_calls():
        problem = f"this llama-cpp-python cannot run an assistant (no {missing})"
    elif remote:
        problem = "the assistant does not run on RPC workers yet"
    if problem:
        log.warning("%s: drafting with n-grams", problem)
        return "ngram", f"{problem}: drafting with n-grams"
    return "assistant", ""


def plan_target_heads(target_path: str | Path) -> int:
    """The MTP layers the target's header declares (its footprint, already read for the plan)."""
    return read_footprint(target_path).nextn_layers


def _no_head(name: str, has_draft: bool) -> str:
    instead = "--drafter model (the pair's draft) or ngram" if has_draft else "give --draft PATH or use --drafter ngram"
    return f"--drafter mtp: {name} has no MTP (nextn) layers: {instead}"


def _model_drafter(draft: KVSequence, target: Model, bridge: VocabBridge | None) -> ModelDrafter:
    """The draft model's drafter: over its own vocabulary through the bridge, else the target's."""
    if bridge is not None:
        return BridgedDrafter(draft, bridge)
    return ModelDrafter(draft, size_ratio=draft.ctx.model.info.file_size / target.info.file_size)


def _head_drafter(owned: list, model: Model, target: KVSequence, n_ctx: int, params: LoadParams) -> MtpDrafter:
    """The target's own MTP head: a second context on its model, fed the target's hidden rows."""
    mtp.emit_hidden(target.ctx)
    head_ctx = _own(owned, mtp.HeadContext(model, n_ctx=n_ctx, n_threads=params.n_threads))
    head = KVSequence(head_ctx, rollback="seq_rm")
    head.warm()
    info = model.info
    ratio = model.n_layer_nextn / (info.n_layer + model.n_layer_nextn)  # the head is one more layer (and the output)
    return MtpDrafter(target, head, mtp.hidden_rows, size_ratio=ratio)


def _assistant_drafter(owned: list, model: Model, target: KVSequence, params: LoadParams) -> AssistantDrafter:
    """The assistant sidecar's drafter: its context beside the target's, fed the target's output rows' hidden rows.
    Made after the target's context and owned after it, so it is freed first."""
    target_ctx = target.ctx
    assert isinstance(target_ctx, LlamaContext)
    assistant.emit_output_hidden(target_ctx)
    ctx = _own(owned, assistant.AssistantContext(model, target_ctx, n_threads=params.n_threads))
    ratio = model.info.file_size / target_ctx.model.info.file_size
    return AssistantDrafter(target, ctx, lambda: assistant.output_hidden(target_ctx), size_ratio=ratio)


def _own(owned: list, obj):
    owned.append(obj)
    return obj


def _sequence(
    owned: list,
    model: Model,
    n_ctx: int,
    params: LoadParams,
    speculating: bool,
    *,
    snapshots: int = 0,
    n_seq: int = 1,
) -> KVSequence:
    """A model's context and its token history. `snapshots`: for a speculating target, llama.cpp's recurrent-state
    rollback snapshots (`Context(n_rs_seq=…)`; kept only where the architecture has them, Qwen3.5 among them): a
    hybrid target then drops a verify pass's rejected tail like any KV cache ("snapshot" rollback) instead of
    saving its whole state — attention cache included — before every pass."""
    swa_full = params.swa_full
    if swa_full is None:
        # A sliding-window cache drops cells a long rollback needs; the full cache keeps them.
        swa_full = speculating and model.info.n_swa > 0
    # Greedy tokens from the graph: on a GPU only a token id leaves the device. On a CPU the logits are read here
    # anyway, and a numpy argmax measured as fast (docs/benchmarks.md "Where sampling runs").
    # The draft's law at T > 0 from the graph (top-k candidates only) is for `on` alone: on this CPU and on an H100
    # (8B/1B shapes) the in-graph top-k cost more than the Python it saved.
    device = params.device_sampling == "on" or (params.device_sampling == "auto" and model.on_local_gpu)
    device = device and n_seq == 1  # the graph's sampler is sequence 0's alone
    ctx = _own(
        owned,
        LlamaContext(
            model,
            n_ctx=n_ctx,
            swa_full=swa_full,
            n_threads=params.n_threads,
            device_greedy=device,
            device_topk=params.device_sampling == "on",
            n_rs_seq=snapshots if speculating and (model.info.is_hybrid or model.info.is_recurrent) else 0,
            n_seq=n_seq,
        ),
    )
    return KVSequence(ctx, rollback=params.rollback)
