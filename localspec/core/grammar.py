"""Constrained decoding as a law (DESIGN §1): a grammar restricts each row's law to the tokens it allows, renormalised.

The one module that imports the grammar library, llguidance (chosen over xgrammar by measurement:
docs/benchmarks.md "Grammar masks: llguidance against xgrammar"). `Grammar` is what a caller asks for (a JSON
schema, any JSON object, Lark or GBNF text), checked and compiled for a vocabulary by `GrammarVocab.compile`;
`Constraint` is one generation's matcher: the allowed set at each position (`TokenMask`), the tokens it forces, and
the rollback that follows the caches. `masked` is the law itself: the row's law restricted to the allowed tokens,
or — where none of the law's support is allowed (a top-k that kept only forbidden tokens) — the same sampling
transform on the row with every forbidden logit at -inf. Both the draft and the target build theirs this way, so
p/q verification emits the target's masked law exactly, and greedy takes the masked argmax.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from localspec.errors import InvalidParamsError

from .laws import Law
from .sampling import SamplingParams, greedy_token, sampling_law
from .schemacheck import closed, problem

GRAMMAR_KINDS = ("json_schema", "json_object", "grammar", "lark", "gbnf", "regex")  # "grammar": Lark or GBNF
# JSON as OpenAI's structured outputs write it: no whitespace between tokens, so keys, quotes and braces are forced.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


class GrammarError(InvalidParamsError):
    """A grammar or a schema that cannot be compiled; the message names what the library refused."""


@dataclass(frozen=True, slots=True)
class Grammar:
    """What the output must match: `kind` (one of GRAMMAR_KINDS) and its text (a JSON schema as JSON text)."""

    kind: str
    text: str = ""

    @classmethod
    def json_schema(cls, schema: dict | str) -> Grammar:
        """Output that validates against a JSON schema (a dict or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise GrammarError(f"the JSON schema is not JSON: {e}") from None
        if not isinstance(schema, dict):
            raise GrammarError(f"a JSON schema is an object, not {type(schema).__name__}")
        if (why := problem(schema)) is not None:
            raise GrammarError(f"the JSON schema {why}")
        return cls("json_schema", json.dumps(schema))

    @classmethod
    def output_schema(cls, schema: dict | str) -> Grammar:
        """A structured output's schema (`response_format`, `--json-schema`): `json_schema` with each object that lists
        its `properties` closed to them where it does not say `additionalProperties` — as tools' parameters are and
        as llama.cpp reads a schema; an open object lets even a well-prompted small model invent keys. An empty
        schema stays any JSON."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise GrammarError(f"the JSON schema is not JSON: {e}") from None
        return cls.json_schema(closed(schema) if isinstance(schema, dict) and schema else schema)

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's `response_format: json_object`)."""
        return cls("json_object", json.dumps({"type": "object"}))

    def source(self) -> str:
        """The llguidance grammar (its JSON form), before it is checked against a vocabulary."""
        import llguidance

        if self.kind in ("json_schema", "json_object"):
            return llguidance.LLMatcher.grammar_from_json_schema(self.text, overrides=_JSON_OPTIONS)
        if self.kind == "lark":
            return llguidance.LLMatcher.grammar_from_lark(self.text)
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.text)
        if self.kind in ("gbnf", "grammar"):  # llguidance reads GBNF into Lark (Lark passes through)
            try:
                return llguidance.grammar_from("gbnf", self.text)
            except ValueError as e:
                raise GrammarError(f"the grammar cannot be read: {_one_line(str(e))}") from None
        raise GrammarError(f"unknown grammar kind {self.kind!r}: one of {', '.join(GRAMMAR_KINDS)}")


class GrammarVocab:
    """A model's vocabulary as llguidance reads it, built once per model (about 0.2 s at 49k tokens, 3 s at 262k).

    Args:
        pieces: each token's bytes, special tokens as b"\\xff" + their text (llama/vocab.py `grammar_pieces`).
        eog: the end-of-generation tokens: where a finished grammar lets the answer end.
        tokenize: the model's tokenizer on text (llguidance tokenizes the text a grammar forces with it).
    """

    def __init__(self, pieces: list[bytes], eog: Sequence[int], tokenize: Callable[[str], list[int]]) -> None:
        import llguidance

        class _Tokenizer:  # what llguidance.TokenizerWrapper reads
            eos_token_id = min(eog) if eog else 0
            bos_token_id = None
            tokens = pieces

            def __call__(self, text: bytes | str) -> list[int]:  # bytes, or str if a first call with bytes failed
                return tokenize(text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text)

        self.n_vocab = len(pieces)
        ends = set(eog)  # the special tokens free text may hold (a thinking model's </think>), ends of generation not
        self.special_ids = tuple(i for i, p in enumerate(pieces) if p.startswith(b"\xff") and i not in ends)
        self.tokenizer = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_Tokenizer()), eos_token=sorted(eog) or None
        )

    def compile(self, grammar: Grammar) -> CompiledGrammar:
        """Check `grammar` against this vocabulary.

        Raises:
            GrammarError: the library cannot compile it; the message is the library's, which names the feature.
        """
        import llguidance

        try:
            source = grammar.source()
        except ValueError as e:
            raise GrammarError(f"the {_name(grammar)} cannot be compiled: {e}") from None
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(source, self.tokenizer, limits=_limits())
        if failed:
            raise GrammarError(f"the {_name(grammar)} cannot be compiled: {_one_line(messages[0])}")
        return CompiledGrammar(self, source)


def _limits():
    """llguidance's default limits, its errors without the parser's state (a one-line error, never a dump)."""
    import llguidance

    return llguidance.LLParserLimits(verbose_errors=False)


def _name(grammar: Grammar) -> str:
    names = {"json_schema": "JSON schema", "json_object": "JSON grammar", "regex": "regular expression"}
    return names.get(grammar.kind, {"gbnf": "GBNF grammar", "lark": "Lark grammar"}.get(grammar.kind, "grammar"))


def _one_line(message: str) -> str:
    return " ".join(message.split())[:400]


@dataclass(frozen=True, slots=True)
class CompiledGrammar:
    """A grammar checked against one vocabulary: each generation starts its own `Constraint` from it.

    Each generation's matcher is a copy of one kept at the grammar's start: the copies share the lexer's states, so
    a grammar used again (the same schema in every request) starts warm — its mean mask per row about 35 µs
    instead of 60–280 µs at 49k tokens, where a fresh matcher builds its lexer on its first rows (benchmarks.md
    "Structured output under speculation").
    """

    vocab: GrammarVocab
    source: str
    _kept: list = field(default_factory=list, compare=False, hash=False, repr=False)  # [the matcher at the start]

    def start(self) -> Constraint:
        return Constraint(self)

    def matcher(self):
        """A new matcher at the grammar's start (an llguidance `LLMatcher`)."""
        import llguidance

        if not self._kept:
            kept = llguidance.LLMatcher(self.vocab.tokenizer, self.source, log_level=0, limits=_limits())
            if kept.is_error():  # compiled already: a limit of this vocabulary, said the same way
                raise GrammarError(f"the grammar cannot be used: {_one_line(kept.get_error())}")
            self._kept.append(kept)
        return self._kept[0].deep_copy()


class TokenMask:
    """The tokens a grammar allows at one position: llguidance's bitmask, one bit per token id.

    Indexed like a (n_vocab,) bool array by an array of ids (`Law.restricted` reads it so); ids past the vocabulary
    (a draft with a few more tokens) are not allowed.
    """

    __slots__ = ("words", "n_vocab", "_dense", "_count")

    def __init__(self, words: np.ndarray, n_vocab: int) -> None:
        self.words = words.view(np.uint32)  # ((n_vocab + 31) // 32,)
        self.n_vocab = n_vocab
        self._dense: np.ndarray | None = None
        self._count: int | None = None

    def allows(self, token: int) -> bool:
        return 0 <= token < self.n_vocab and bool((int(self.words[token >> 5]) >> (token & 31)) & 1)

    def __getitem__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.shape[0] > 4096:  # a whole row's support: one unpack of the bits is the cheaper
            return self.dense(max(self.n_vocab, int(ids.max()) + 1))[ids]
        inside = ids < self.n_vocab
        out = np.zeros(ids.shape[0], dtype=bool)
        held = ids[inside]
        out[inside] = (self.words[held >> 5] >> (held & 31).astype(np.uint32)) & 1
        return out

    def dense(self, n: int) -> np.ndarray:
        """The mask as a (n,) bool array (False past the vocabulary)."""
        if self._dense is None:
            self._dense = np.unpackbits(self.words.view(np.uint8), bitorder="little")[: self.n_vocab].view(bool)
        if n == self.n_vocab:
            return self._dense
        out = np.zeros(n, dtype=bool)
        m = min(n, self.n_vocab)
        out[:m] = self._dense[:m]
        return out

    @property
    def count(self) -> int:
        """How many tokens are allowed."""
        if self._count is None:
            self._count = int(np.bitwise_count(self.words).sum())
        return self._count

    def single(self) -> int | None:
        """The one token allowed, when there is exactly one (a forced token), else None."""
        if self.count != 1:
            return None
        word = int(np.flatnonzero(self.words)[0])
        return word * 32 + (int(self.words[word]).bit_length() - 1)


class Constraint:
    """One generation's grammar: a matcher at the last emitted token, and the step's tokens pushed past it.

    Within a step, `push` advances over forced and drafted tokens, each position's mask computed once (`mask`,
    `mask_at`); `end_step` rolls the matcher back to what was kept and consumes the token emitted after it — the
    caches' rollback, followed.
    """

    def __init__(self, grammar: CompiledGrammar) -> None:
        self.vocab = grammar.vocab
        self.n_vocab = grammar.vocab.n_vocab
        self.matcher = grammar.matcher()
        self._n_words = (self.n_vocab + 31) // 32
        self._pushed: list[int] = []  # tokens consumed past the step's start
        self.seconds_mask, self.n_masks = 0.0, 0  # what the masks cost (`localspec bench --structured`)
        self._masks: list[TokenMask] = []  # _masks[i]: the mask after _pushed[:i]

    @property
    def position(self) -> int:
        """Tokens pushed in this step."""
        return len(self._pushed)

    def mask(self) -> TokenMask:
        """The tokens allowed after everything pushed so far."""
        n = len(self._pushed)
        if len(self._masks) <= n:
            start = time.perf_counter()
            words = np.empty(self._n_words, dtype=np.uint32)
            self.matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
            self._masks.append(TokenMask(words, self.n_vocab))
            self.seconds_mask += time.perf_counter() - start
            self.n_masks += 1
        return self._masks[n]

    def push(self, token: int) -> bool:
        """Consume `token` if the grammar allows it here; False (nothing consumed) if it does not, or if the grammar
        has ended (after an end of generation the matcher takes more but would not count them for a rollback)."""
        if self.matcher.is_stopped() or not self.mask().allows(token):
            return False
        if not self.matcher.consume_token(token):
            raise GrammarError(f"the grammar refused a token its mask allowed: {self.matcher.get_error()}")
        self._pushed.append(token)
        return True

    def mask_at(self, position: int, tail: Sequence[int], offset: int) -> TokenMask | None:
        """The mask after the step's first `position` tokens, pushing as needed the step's token j ≥ `offset` from
        `tail[j - offset]` (the drafts after the forced tokens); None when one of them is not allowed (a row no
        verification reaches)."""
        while len(self._pushed) < position:
            if not self.push(tail[len(self._pushed) - offset]):
                return None
        if position == len(self._pushed):
            return self.mask()
        return self._masks[position]

    def forced(self, cap: int, eog: frozenset[int]) -> list[int]:
        """Push and return the tokens the grammar forces from here (each the only one its mask allows), at most
        `cap`, never an end-of-generation token (the target's row emits that, with probability 1)."""
        out: list[int] = []
        while len(out) < cap:
            token = self.mask().single()
            if token is None or token in eog:
                break
            self.push(token)
            out.append(token)
        return out

    def end_step(self, kept: int, token: int) -> None:
        """Keep the step's first `kept` pushed tokens, then consume `token` (emitted by the target, under the mask of
        that position); a new step starts after it."""
        extra = len(self._pushed) - kept
        if extra > 0 and not self.matcher.rollback(extra):
            raise GrammarError(f"the grammar could not roll back {extra} tokens: {self.matcher.get_error()}")
        if not self.matcher.consume_token(token):
            raise GrammarError(f"the grammar refused token {token}: {self.matcher.get_error()}")
        self._pushed.clear()
        self._masks.clear()

    def is_accepting(self) -> bool:
        """Whether the output so far is complete under the grammar."""
        return self.matcher.is_accepting()


def masked_row(logits: np.ndarray, mask: TokenMask) -> np.ndarray:
    """A copy of `logits` with every token the mask forbids at -inf."""
    return np.where(mask.dense(logits.shape[0]), logits, np.float32(-math.inf)).astype(np.float32, copy=False)


def masked(
    law: Law, mask: TokenMask, logits: Callable[[], np.ndarray], history: list[int], sampling: SamplingParams
) -> Law:
    """The law a row draws from under a grammar: `law` (the row's own) restricted to the allowed tokens and
    renormalised; where none of its support is allowed, the sampling transform of the row with the forbidden logits
    at -inf (`logits` gives the row; `history` is the penalty window).

    Raises:
        GrammarError: the grammar allows no token at all here.
    """
    restricted = law.restricted(mask)
    if restricted is not None:
        return restricted
    if mask.count == 0:
        raise GrammarError("the grammar allows no token here: it cannot be finished")
    return sampling_law(masked_row(logits(), mask), history, sampling)


def masked_argmax(
    token: int, mask: TokenMask, logits: Callable[[], np.ndarray], history: list[int], sampling: SamplingParams
) -> int:
    """The greedy token under a grammar: `token` (the row's own argmax) where allowed, else the argmax of the
    allowed tokens."""
    if mask.allows(token):
        return token
    if mask.count == 0:
        raise GrammarError("the grammar allows no token here: it cannot be finished")
    return greedy_token(masked_row(logits(), mask), history, sampling)
