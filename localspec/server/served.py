"""The loaded pair behind the server: its engine, the name clients use for it, and the drafters a request may ask
for on the engine's own caches (each keeps its own draft-length policy; the model drafters share the draft's cache).
A request's drafter is its own: the engine's is never swapped (several slots: core/slots.py `SlotPool.drafting`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from localspec.core.drafters import Drafter, make_drafter
from localspec.core.engine import Engine
from localspec.core.params import LoadParams, PairDefaults, needs_draft_model
from localspec.core.policy import DraftPolicy
from localspec.core.session import ChatFormat
from localspec.models.resolved import ResolvedPair

from .api import ApiError


@dataclass(slots=True)
class Served:
    """The loaded pair: its engine, the name clients use for it, and what it was loaded with."""

    name: str
    resolved: ResolvedPair
    engine: Engine
    params: LoadParams
    chat_template: str | None
    _format: ChatFormat | None = None
    loaded_drafter: str = ""  # the drafter it was loaded with, what a request that names none gets
    think_flag: bool | None = None  # `serve --think on|off`
    _drafters: dict[str, tuple[Drafter, DraftPolicy]] = field(default_factory=dict)  # kind -> kept
    embedder: Any = None  # the embeddings context over the target (made on first use; server/embeddings_route.py)

    def __post_init__(self) -> None:
        engine = self.engine
        self.loaded_drafter = self.loaded_drafter or engine.drafter.kind  # "auto" was settled by loading (mtp or none)
        self._drafters[self.loaded_drafter] = (engine.drafter, engine.policy)

    def drafter_kind(self, asked: str | None) -> str:
        """The drafter a request drafts with: the one it asks for, or the one the pair was loaded with.

        Raises:
            ApiError: a model drafter on a pair loaded without a draft model, or a draft head it did not load.
        """
        kind = asked or self.loaded_drafter
        if needs_draft_model(kind) and self.engine.model_drafter is None:
            raise ApiError(
                400,
                f"the drafter '{kind}' needs a draft model and this server has none loaded: ask for 'ngram' or "
                "'none', or start the server with a pair that has a draft",
                param="drafter",
                code="unsupported_value",
            )
        if kind in ("mtp", "assistant") and kind not in self._drafters:  # made beside the target's cache, at load
            raise ApiError(400, self._no_head(kind), param="drafter", code="unsupported_value")
        return kind

    def drafting(self, kind: str) -> tuple[Drafter, DraftPolicy]:
        """The drafter of `kind` (checked by `drafter_kind`) over the engine's own caches, and its draft-length policy,
        for a request that runs on them (one slot): made on first use, then kept. The engine's drafter stays as it
        was loaded: a request's drafter is its own."""
        if kind not in self._drafters:
            model = self.engine.model_drafter if needs_draft_model(kind) else None
            drafter = make_drafter(kind, model)
            self.engine.share_prompt_cache(drafter)
            self._drafters[kind] = (drafter, DraftPolicy(draft_size_ratio=drafter.size_ratio))
        return self._drafters[kind]

    def _no_head(self, kind: str) -> str:
        """Why a request cannot draft with the target's MTP head (or its assistant sidecar) here, and what to do
        instead (one line)."""
        target = self.engine.target_model
        if kind == "assistant":
            return (
                f"the drafter 'assistant' needs the target's Gemma 4 assistant, which this server did not load (it "
                f"started with the drafter '{self.loaded_drafter}'): ask for 'ngram' or 'none', or restart it with "
                "the assistant (mtp-*.gguf) as --draft"
            )
        if target.n_layer_nextn == 0:
            return (
                f"the drafter 'mtp' needs an MTP head and the target {target.path.name} has none: ask for 'ngram' or "
                "'none'"
            )
        return (
            f"the drafter 'mtp' needs the target's MTP head, which this server did not load (it started with the "
            f"drafter '{self.loaded_drafter}'): ask for 'ngram' or 'none', or restart it with --drafter mtp"
        )

    @property
    def defaults(self) -> PairDefaults:
        return self.resolved.defaults

    def chat_format(self) -> ChatFormat:
        """The chat template, read once, rendering a message's images as the target reads them (raises
        ChatTemplateError for a model without one)."""
        if self._format is None:
            template = self.chat_template or self.defaults.chat_template
            self._format = ChatFormat(self.engine.target_model, template, images=self.engine.image_tokens)
        return self._format
