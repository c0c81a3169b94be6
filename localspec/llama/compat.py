"""Can this draft model speak for this target? llama.cpp's pairing rules, with a readable verdict.

Same vocabulary type, same BOS/EOS, sizes within 128, identical token text from id 5 on (over the shared
range). A mismatch names the first differing token so the user sees *why* the pair does not fit.
"""

from __future__ import annotations

from localspec.errors import IncompatibleDraftError

from .model import Model

MAX_VOCAB_SIZE_DIFFERENCE = 128
FIRST_CHECKED_TOKEN = 5


def check_pair(target: Model, draft: Model, *, hint: str = "") -> None:
    """Raise `IncompatibleDraftError` unless `draft` can draft for `target`.

    Args:
        target: the loaded target model.
        draft: the loaded draft model.
        hint: appended to the message, e.g. which curated drafts fit this target.
    """
    problem = pair_problem(target, draft)
    if problem:
        suffix = f"; {hint}" if hint else "; choose a draft from the same model family (same tokenizer)"
        raise IncompatibleDraftError(
            f"draft {draft.path.name} does not fit target {target.path.name}: {problem}{suffix}"
        )


def pair_problem(target: Model, draft: Model) -> str | None:
    """The first reason the two vocabularies differ, or None when they are compatible."""
    t, d = target.info, draft.info
    if t.vocab_type != d.vocab_type:
        return f"vocabulary types differ (target {t.vocab_type}, draft {d.vocab_type})"
    if (t.add_bos, t.bos) != (d.add_bos, d.bos):
        return f"BOS tokens differ (target {t.bos}, draft {d.bos})"
    if t.eos != d.eos:
        return f"EOS tokens differ (target {t.eos}, draft {d.eos})"
    if abs(t.n_vocab - d.n_vocab) > MAX_VOCAB_SIZE_DIFFERENCE:
        return (
            f"vocabulary sizes differ by {abs(t.n_vocab - d.n_vocab)} (target {t.n_vocab}, draft {d.n_vocab}; "
            f"at most {MAX_VOCAB_SIZE_DIFFERENCE} allowed)"
        )
    for token in range(FIRST_CHECKED_TOKEN, min(t.n_vocab, d.n_vocab)):
        target_text, draft_text = target.token_text(token), draft.token_text(token)
        if target_text != draft_text:
            return f"token {token} differs (target {target_text!r}, draft {draft_text!r})"
    return None
