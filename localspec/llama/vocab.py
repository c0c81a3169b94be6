"""What a vocabulary writes as text: which tokens render to bytes, and the token for each byte string.

A bridged draft (core/bridge.py) moves between two vocabularies through text, and only text tokens may cross:
control, unknown and unused tokens (end-of-turn, BOS, padding) never turn into text on the other side. Built
once per model with one llama.cpp call per token (about a second at 262,144 tokens).
"""

from __future__ import annotations

import llama_cpp
import numpy as np

from .model import Model

_NOT_TEXT = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN | llama_cpp.LLAMA_TOKEN_ATTR_UNUSED


class TextVocab:
    """A model's text tokens.

    Attributes:
        is_text: (n_vocab,) bool, True for tokens that render as generated text.
        by_bytes: each byte string some text token renders to → that token (a whole-word token over a byte
            token when both render the same bytes: the one the tokenizer itself would choose).
    """

    def __init__(self, model: Model) -> None:
        vocab = model._vocab
        attrs = [int(llama_cpp.llama_vocab_get_attr(vocab, t)) for t in range(model.n_vocab)]
        self.is_text = np.array([not (a & _NOT_TEXT) for a in attrs], dtype=bool)  # (n_vocab,)
        self.by_bytes: dict[bytes, int] = {}
        byte_tokens = []
        for token in np.flatnonzero(self.is_text).tolist():
            piece = model.token_bytes(token)
            if not piece:
                continue
            if attrs[token] & llama_cpp.LLAMA_TOKEN_ATTR_BYTE:
                byte_tokens.append((piece, token))
            else:
                self.by_bytes.setdefault(piece, token)
        for piece, token in byte_tokens:
            self.by_bytes.setdefault(piece, token)

    @property
    def n_text(self) -> int:
        """How many distinct byte strings the vocabulary can write as one token."""
        return len(self.by_bytes)


_CONTROL = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
_USER_DEFINED = llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED


def grammar_pieces(model: Model) -> list[bytes]:
    """Each token's bytes as a grammar library reads a vocabulary (core/grammar.py): the bytes it writes, and for a
    control token (or a user-defined one that looks like markup, `<tool_call>`) b"\\xff" + its text — the marker
    llguidance gives special tokens, so a grammar names them as `<|im_end|>` and no text ever matches them. One
    llama.cpp call per token (about a second at 262,144 tokens): the caller keeps the result."""
    vocab = model._vocab
    pieces = []
    for token in range(model.n_vocab):
        attr = int(llama_cpp.llama_vocab_get_attr(vocab, token))
        if attr & _CONTROL or attr & _USER_DEFINED:
            text = model.token_piece_text(token).encode("utf-8")
            if attr & _CONTROL or (text.startswith(b"<") and text.endswith(b">")):
                pieces.append(b"\xff" + text)
                continue
        pieces.append(model.token_bytes(token))
    return pieces


def grammar_tokenizer(model: Model):
    """The model's tokenizer for text that continues other text (what a grammar library tokenizes forced text with):
    a SentencePiece vocabulary would add its word-start space to the text's first piece, so the text is tokenized
    after a newline and the newline's tokens dropped."""
    mark = model.tokenize("\n")

    def tokenize(text: str) -> list[int]:
        tokens = model.tokenize("\n" + text)
        return tokens[len(mark) :] if tokens[: len(mark)] == mark else model.tokenize(text)

    return tokenize
