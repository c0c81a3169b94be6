"""Can this draft model speak for this target, and how? The pre-flight verdict: same vocabulary, bridged, unusable.

"same" is llama.cpp's pairing rule — same vocabulary type, same BOS/EOS, identical token text from id 5 on — where
the larger vocabulary's extra ids are padding (unused or control tokens). Any other difference is "bridged": the
draft drafts through text (core/bridge.py), and the verdict names the first difference so the user sees why. A
vocabulary that cannot write text at all is "unusable".
"""

from __future__ import annotations

from dataclasses import dataclass

from localspec.errors import IncompatibleDraftError, ModelFileError

from .assistant import is_assistant
from .model import Model

MAX_VOCAB_SIZE_DIFFERENCE = 128
FIRST_CHECKED_TOKEN = 5
VERDICTS = ("same", "bridged", "unusable")


@dataclass(frozen=True, slots=True)
class PairVerdict:
    """How a draft can serve a target: `kind` is one of VERDICTS; `reason` says why it is not "same"."""

    kind: str
    reason: str = ""
    head_layers: int = 0  # MTP layers the target carries: it can draft for itself (`--drafter mtp`)

    def describe(self) -> str:
        """One line for `doctor` and `models`."""
        if self.kind == "same":
            return "same vocabulary"
        return f"{self.kind}: {self.reason}"


def pair_verdict(target: Model, draft: Model) -> PairVerdict:
    """Whether `draft` shares `target`'s vocabulary, drafts for it through text, or cannot draft for it."""
    for role, model in (("target", target), ("draft", draft)):
        if problem := _text_problem(model, role):
            return PairVerdict("unusable", problem)
    problem = pair_problem(target, draft) or _extra_text_token(target, draft)
    return PairVerdict("bridged" if problem else "same", problem or "", head_layers(target))


def head_layers(model: Model) -> int:
    """MTP ("nextn") layers the model's file carries, read from its metadata (a vocabulary-only load will do)."""
    value = model.meta(f"{model.info.arch}.nextn_predict_layers")
    try:
        return int(value) if value else 0
    except ValueError:
        return 0


def _text_problem(model: Model, role: str) -> str | None:
    """Why `model` cannot write text (it has no tokenizer), or None."""
    if model.info.vocab_type == "none" or model.n_vocab == 0:
        return f"the {role} {model.path.name} has no tokenizer to write text with"
    return None


def check_target(target: Model) -> None:
    """The target's own pre-flight: it must be able to write text (llama.cpp aborts on a tokenizer-less vocabulary).

    Raises:
        ModelFileError: the target has no tokenizer, or is an assistant sidecar (it drafts beside a target only).
    """
    if is_assistant(target.info.arch):
        raise ModelFileError(
            f"{target.path.name} is a {target.info.arch} sidecar, not a model of its own: give it as --draft beside "
            "the target it was made for"
        )
    if problem := _text_problem(target, "target"):
        raise ModelFileError(f"{problem}: choose a GGUF that carries its tokenizer (tokenizer.ggml.model)")


def _extra_text_token(target: Model, draft: Model) -> str | None:
    """The first id one vocabulary has beyond the other's size that is a real token (not padding)."""
    larger, smaller, role = (target, draft, "target") if target.n_vocab > draft.n_vocab else (draft, target, "draft")
    for token in range(smaller.n_vocab, larger.n_vocab):
        if not larger.is_padding(token):
            other = "draft" if role == "target" else "target"
            return f"{role} token {token} ({larger.token_text(token)!r}) is missing from the {other}'s vocabulary"
    return None


def check_pair(target: Model, draft: Model, *, hint: str = "") -> PairVerdict:
    """The pre-flight: how `draft` drafts for `target` ("same" or "bridged").

    Args:
        target: the loaded target model.
        draft: the loaded draft model.
        hint: appended to the message, e.g. which curated drafts fit this target.

    Raises:
        IncompatibleDraftError: the verdict is "unusable".
    """
    verdict = pair_verdict(target, draft)
    if verdict.kind == "unusable":
        suffix = f"; {hint}" if hint else "; choose a draft with a text tokenizer"
        raise IncompatibleDraftError(
            f"draft {draft.path.name} cannot draft for target {target.path.name}: {verdict.reason}{suffix}"
        )
    return verdict


def pair_problem(target: Model, draft: Model) -> str | None:
    """The first difference llama.cpp's pairing rule sees between the two vocabularies, or None."""
    t, d = target.info, draft.info
    if t.vocab_type != d.vocab_type:
        return f"vocabulary types differ (target {t.vocab_type}, draft {d.vocab_type})"
    if (t.add_bos, t.bos) != (d.add_bos, d.bos):
        return f"BOS tokens differ (target {t.bos}, draft {d.bos})"
    if t.eos != d.eos:
        return f"EOS tokens differ (target {t.eos}, draft {d.eos})"
    if abs(t.n_vocab - d.n_vocab) > MAX_VOCAB_SIZE_DIFFERENCE:
        return f"vocabulary sizes differ by {abs(t.n_vocab - d.n_vocab)} (target {t.n_vocab}, draft {d.n_vocab})"
    for token in range(FIRST_CHECKED_TOKEN, min(t.n_vocab, d.n_vocab)):
        target_text, draft_text = target.token_text(token), draft.token_text(token)
        if target_text != draft_text:
            return f"token {token} differs (target {target_text!r}, draft {draft_text!r})"
    return None
