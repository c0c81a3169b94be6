"""`Engine`: the loaded target, its drafter and their `KVSequence`s — the target's, and whatever the drafter declares
in `Drafter.caches` — kept warm across generations, with the draft-length policy, the grammar cache and the prompt
cache they share. Each answer is a `Generation` (core/generation.py: the loop, DESIGN §1). How the models are opened
(n_ctx, swa_full, device sampling) is core/load.py's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Unpack

from localspec.errors import InvalidParamsError
from localspec.llama import threads
from localspec.llama.model import Model
from localspec.llama.pictures import Image
from localspec.llama.vocab import grammar_pieces, grammar_tokenizer

from .bridge import VocabBridge
from .drafters import Drafter
from .generation import GenerateOptions, Generation, TokenEvent
from .grammar import CompiledGrammar, Grammar, GrammarVocab
from .kv import KVSequence
from .load import load_models
from .media import MediaStore
from .params import LoadParams, SpeculativeParams
from .placement import GpuPlan
from .policy import DraftPolicy
from .promptcache import PromptCache, cache_budget
from .promptdisk import DIR_SIZE, DiskTier
from .stats import Stats

__all__ = ["Engine", "GenerateOptions", "Generation", "TokenEvent"]  # the loop's names, where callers found them

log = logging.getLogger(__name__)


class Engine:
    """A target model, an optional drafter, and their caches — kept warm across generations.

    Build it with `Engine.load(...)` and close it (or use `with`) to free the native memory.
    """

    def __init__(
        self,
        target_model: Model,
        target: KVSequence,
        drafter: Drafter,
        *,
        owned: Sequence = (),
        auto_threads: bool = False,
        model_drafter: Drafter | None = None,
        bridge: VocabBridge | None = None,
        plan: GpuPlan | None = None,
        load_note: str = "",
        prompt_cache: PromptCache | None = None,
        slots_note: str = "",
        media: MediaStore | None = None,
    ) -> None:
        self.target_model = target_model
        # Earlier prompts' states, saved and restored by every cache of the engine (`KVSequence.use_cache`).
        self.prompt_cache = prompt_cache
        target.use_cache(prompt_cache, "target")
        self.plan = plan  # where the models went (None: built without `load`)
        self.target = target
        self.eog = target_model.eog_tokens()
        self.n_ctx = target.ctx.n_ctx
        self._owned = list(owned)
        self.use_drafter(drafter)  # the drafter, its caches (the engine keeps them consistent) and its policy
        # Threads follow the cores other processes leave free, unless the caller fixed them.
        self.threads = threads.ThreadTuner([seq.ctx for seq in self.caches]) if auto_threads else None
        self.cannot_roll_back = ""  # set when speculation would force a full re-prefill every step
        # The draft model's own drafter (plain or bridged), what "model" and "model+ngram" draft with (`make_drafter`).
        self.model_drafter = model_drafter
        self.bridge = bridge  # how the draft drafts when its vocabulary is not the target's (None: same vocabulary)
        self.load_note = load_note  # what loading found that the user must know (a head it could not run)
        self.media = media  # the target's images: a prompt may hold them (None: text only; core/media.py)
        self.slots_note = slots_note  # why automatic slots (`LoadParams.n_seq` 0) are fewer than 4 ("" otherwise)
        self._grammar_vocab: GrammarVocab | None = None  # the target's vocabulary for grammars, built on first use
        self._grammars: dict[Grammar, CompiledGrammar] = {}
        for seq in self.caches:
            if seq.mode == "refill" and seq.probed:
                self.cannot_roll_back = f"{seq.ctx.model.path.name} can neither drop a KV tail nor restore a state"
                log.warning("speculation off: %s", self.cannot_roll_back)

    @classmethod
    def load(
        cls,
        target_path: str | Path,
        draft_path: str | Path | None = None,
        params: LoadParams | None = None,
        *,
        progress: Callable[[float], bool | None] | None = None,
        **options: Any,
    ) -> Engine:
        """Load the target (and the draft) and create their contexts.

        Args:
            target_path: the target GGUF.
            draft_path: the draft GGUF (required when the drafter is "model" or "model+ngram").
            params: how to load (drafter, n_ctx, threads, RPC workers, …); default `LoadParams()`. The draft's
                context is capped at its own training context (drafting pauses past it).
            progress: called with the fraction of the target's weights loaded (0..1).
            **options: fields of `LoadParams` replaced in `params` (`Engine.load(path, drafter="none")`).

        Raises:
            LocalspecError: bad files, incompatible draft, n_ctx too large, unknown drafter.
        """
        params = dataclasses.replace(params or LoadParams(), **options)
        disk = None if params.cache_dir is None else DiskTier(params.cache_dir, params.cache_dir_size or DIR_SIZE)
        loaded = load_models(target_path, draft_path, params, progress=progress)
        prompt_cache = PromptCache(cache_budget(params.cache_ram), disk)
        engine = cls(
            loaded.target_model,
            loaded.target,
            loaded.drafter,
            owned=loaded.owned,
            auto_threads=params.n_threads is None,
            model_drafter=loaded.model_drafter,
            bridge=loaded.bridge,
            plan=loaded.plan,
            load_note=loaded.note,
            prompt_cache=prompt_cache,
            slots_note=loaded.slots_note,
            media=loaded.media,
        )
        # Each namespace's states on disk are its model file's: the target's, and the draft's as `use_drafter` names
        # them (the model drafter's too: the server drafts with it on request).
        prompt_cache.identify("target", loaded.target_model.path)
        model_caches = engine.model_drafter.caches if engine.model_drafter is not None else ()
        for seq in (*engine.drafter.caches, *model_caches):
            prompt_cache.identify(f"draft:{seq.ctx.model.path}", seq.ctx.model.path)
        return engine

    def use_drafter(self, drafter: Drafter, policy: DraftPolicy | None = None) -> DraftPolicy:
        """Draft with `drafter` from the next generation on (the server's per-request drafter); its caches join
        the engine's. A drafter may share a cache with the one it replaces (`make_drafter` around the same model
        drafter): the cache's token list stays its truth. A drafter that follows the target's decodes (the target's
        MTP head) is told of each from here on, and still after another drafter takes over: its cache stays
        current, so coming back to it costs no re-read.

        Args:
            drafter: the drafter (`NoDrafter` for plain decoding).
            policy: the draft-length policy this drafter used before (kept by the caller); None: a fresh one.

        Returns:
            The policy now in use (keep it to hand back when this drafter is used again).
        """
        self.drafter = drafter
        # Every cache the engine keeps consistent: the target's first, then the drafter's own.
        self.caches: tuple[KVSequence, ...] = (self.target, *drafter.caches)
        self.share_prompt_cache(drafter)
        if drafter.after_target_decode is not None:
            self.target.ctx.after_decode = drafter.after_target_decode
        self.policy = policy or DraftPolicy(draft_size_ratio=drafter.size_ratio)
        return self.policy

    def share_prompt_cache(self, drafter: Drafter) -> None:
        """`drafter`'s caches save and restore their prompts in the engine's prompt cache, as the engine's own
        drafter's do (a drafter a request drafts with: server/served.py)."""
        for seq in drafter.caches:
            seq.use_cache(self.prompt_cache, f"draft:{seq.ctx.model.path}")

    @property
    def drafting_note(self) -> str:
        """What the user is told once about how the draft drafts ("" for a draft with the target's vocabulary): a
        bridged draft's vocabulary, the target's own head ("draft head: 1 MTP layer"), or what loading found."""
        return self.drafter.describe() or self.load_note

    def draft_length(
        self,
        spec: SpeculativeParams,
        remaining: int,
        n_history: int,
        stats: Stats,
        drafting: tuple[Drafter, DraftPolicy] | None = None,
        *,
        timed: bool = True,
    ) -> int:
        """k for the next step: the policy's (draft_max unless adaptive), bounded by what is wanted and the room.
        `drafting`: the stream's drafter and policy (None: the engine's)."""
        drafter, policy = drafting if drafting is not None else (self.drafter, self.policy)
        no_drafter = not drafter.drafts
        if no_drafter or spec.draft_max == 0 or self.cannot_roll_back:
            stats.speculation_off = "no drafter" if no_drafter else self.cannot_roll_back or "draft-max is 0"
            stats.draft_length = 0
            return 0
        cap = self.draft_limit(spec, remaining, n_history, drafter)
        choice = policy.choose(spec.adaptive, spec.draft_max, timed=timed, cap=cap)
        stats.record_choice(choice.k, choice.reason, probe=choice.probe)
        stats.decision = policy.decision
        return choice.k

    def draft_limit(
        self, spec: SpeculativeParams, remaining: int, n_history: int, drafter: Drafter | None = None
    ) -> int:
        """Most drafts a step may verify: draft_max, within what is wanted and the room left (0 where nothing drafts:
        no drafter, draft-max 0, a cache that cannot roll back). `drafter`: the stream's (None: the engine's)."""
        drafter = drafter if drafter is not None else self.drafter
        if not drafter.drafts or spec.draft_max == 0 or self.cannot_roll_back:
            return 0
        # The target decodes history[-1] + k drafts; the draft holds history + k - 1 of them.
        room = min(self.n_ctx - n_history, drafter.n_ctx - n_history + 1)
        return max(0, min(spec.draft_max, remaining - 1, room))

    def compile_grammar(self, grammar: Grammar | CompiledGrammar) -> CompiledGrammar:
        """`grammar` checked against the target's vocabulary (the vocabulary built once, about 0.2 s at 49k tokens
        and 3 s at 262k; the last few grammars kept).

        Raises:
            GrammarError: the grammar library cannot compile it (the message names what it refused).
        """
        if isinstance(grammar, CompiledGrammar):
            return grammar
        if grammar not in self._grammars:
            if len(self._grammars) >= 16:
                self._grammars.pop(next(iter(self._grammars)))
            self._grammars[grammar] = self.grammar_vocab().compile(grammar)
        return self._grammars[grammar]

    def grammar_vocab(self) -> GrammarVocab:
        """The target's vocabulary as the grammar library reads it (built on first use, then kept)."""
        if self._grammar_vocab is None:
            model = self.target_model
            self._grammar_vocab = GrammarVocab(grammar_pieces(model), sorted(self.eog), grammar_tokenizer(model))
        return self._grammar_vocab

    def generate(self, prompt: list[int], **options: Unpack[GenerateOptions]) -> Generation:
        """Start a generation continuing `prompt` (token ids) with `options` (`GenerateOptions`). Iterate the result
        to run it."""
        return Generation(self, prompt, **options)

    def image_tokens(self, image: Image) -> list[int]:
        """`image` as the target reads it in a prompt (core/media.py: its positions, and the model's own tokens
        around it).

        Raises:
            InvalidParamsError: the pair reads no images (loaded without a projector).
        """
        if self.media is None:
            raise InvalidParamsError(
                f"{self.target_model.path.name} reads no images: load it with its projector (--mmproj PATH, or a pair "
                "with mmproj in models.toml)"
            )
        return self.media.tokens(image)

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Tokenize raw text for the target (BOS as the model wants; markup is NOT parsed)."""
        return self.target_model.tokenize(text, add_special=add_special, parse_special=False)

    def seconds_decoding(self) -> float:
        """Time spent inside llama_decode by every cache's model so far (what is not Python)."""
        return sum(seq.ctx.seconds_decoding for seq in self.caches)

    def check_invariants(self) -> None:
        """Each cache holds exactly its token list (DESIGN §1, step 4)."""
        for seq in self.caches:
            seq.check()

    def repair(self) -> None:
        """Bring each cache back in line with its token list after an interrupted step (see `KVSequence.repair`)."""
        for seq in self.caches:
            seq.repair()

    @property
    def closed(self) -> bool:
        """Whether `close()` has freed the contexts and models."""
        return not self._owned

    def own(self, obj) -> None:
        """Free `obj` (a context on one of the engine's models) with the engine, before the models it uses."""
        self._owned.append(obj)

    def close(self) -> None:
        """Free contexts and models now."""
        for obj in reversed(self._owned):
            obj.close()
        self._owned.clear()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
