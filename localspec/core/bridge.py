"""Drafting across two vocabularies (DESIGN §9): the draft keeps its own token history, re-tokenised from the text
of the target's, and what it drafts reaches verification as target token ids. Exact in both modes, at any temperature.

- "shared" (token-level intersection, arXiv 2502.05202): most of the draft's tokens are one target token by their
  bytes. The draft drafts in its own vocabulary; a token with no single target counterpart ends the draft, so the law
  of the tokens it keeps is its own renormalised on the shared tokens — a law over target ids, for full p/q.
- "text": the draft writes greedily, its text is re-tokenised for the target, and verification sees one-hot drafts
  (accepted with probability target(x): the n-gram case).

Special tokens never cross as text: a target control token becomes the draft's token of the same text or nothing,
and a draft control token (its end of turn) ends the draft.
"""

from __future__ import annotations

import bisect
import codecs
import logging
import math
import time
from collections.abc import Sequence

import numpy as np

from localspec.llama.model import Model
from localspec.llama.vocab import TextVocab

from .drafters import DraftRequest, ModelDrafter, Pick, Proposal, draft_loop, drive_alone
from .kv import KVSequence, common_prefix
from .laws import ArrayLaw
from .params import BRIDGES
from .sampling import SamplingParams, greedy_token, top_probability

log = logging.getLogger(__name__)

SHARED_MIN = 0.9  # "auto" drafts on shared tokens when this share of the draft's text tokens is one target token
LOOK_BEHIND = 4  # target tokens re-tokenised before the first new one: a boundary the tokenizers draw apart
TEXT_DRAFT_MAX_RATIO = 3.0  # text mode: at most this many draft tokens per wanted target token
_GREEDY = SamplingParams(temperature=0)


class Encoder:
    """One model's tokenizer, made to write exactly the text it is given.

    A SentencePiece tokenizer may put a space before every text it is given (`add_space_prefix`); the bridge
    tokenises pieces of a longer text, so that space is taken off again.
    """

    def __init__(self, model: Model, vocab: TextVocab) -> None:
        self.model, self.vocab = model, vocab
        self._longest = max((len(b) for b in vocab.by_bytes), default=1)
        self._adds_space = b"".join(model.token_bytes(t) for t in model.tokenize("a")) == b" a"

    def encode(self, text: str) -> list[int]:
        """Text tokens (no BOS, markup not parsed) that render exactly `text` where the vocabulary can."""
        if not text:
            return []
        if not self._adds_space:
            return self.model.tokenize(text)
        if text.startswith(" "):  # the tokenizer puts that space back (and writes nothing for "")
            return self.model.tokenize(text[1:]) if len(text) > 1 else self.spell(b" ")
        ids = self.model.tokenize(text)
        first = self.model.token_bytes(ids[0]) if ids else b""
        return self.spell(first[1:]) + ids[1:] if first.startswith(b" ") else ids

    def spell(self, data: bytes) -> list[int]:
        """`data` as the longest known pieces, left to right (bytes the vocabulary cannot write are skipped)."""
        out, i = [], 0
        while i < len(data):
            for n in range(min(self._longest, len(data) - i), 0, -1):
                token = self.vocab.by_bytes.get(data[i : i + n])
                if token is not None:
                    out.append(token)
                    i += n
                    break
            else:
                i += 1
        return out


class VocabBridge:
    """The maps between a target's and a draft's vocabulary, built once per pair.

    Args:
        target, draft: the two loaded models.
        mode: "auto" (shared when at least SHARED_MIN of the draft's text tokens are shared), "text" or "shared".
    """

    def __init__(self, target: Model, draft: Model, mode: str = "auto") -> None:
        assert mode in BRIDGES
        self.target, self.draft = target, draft
        target_vocab, draft_vocab = TextVocab(target), TextVocab(draft)
        self.target_text = target_vocab.is_text  # (n_target_vocab,) bool
        self.draft_text = draft_vocab.is_text  # (n_draft_vocab,) bool
        self.target_encoder, self.draft_encoder = Encoder(target, target_vocab), Encoder(draft, draft_vocab)
        self.draft_to_target = np.full(draft.n_vocab, -1, dtype=np.int64)  # (n_draft_vocab,) target id or -1
        self.target_to_draft: dict[int, int] = {}  # target tokens of whole characters that are one draft token
        for piece, token in draft_vocab.by_bytes.items():
            target_token = target_vocab.by_bytes.get(piece, -1)
            self.draft_to_target[token] = target_token
            if target_token >= 0 and _complete_utf8(piece) == len(piece):
                self.target_to_draft[target_token] = token
        self.n_shared = int((self.draft_to_target >= 0).sum())
        self.overlap = self.n_shared / max(1, draft_vocab.n_text)
        if mode == "auto":
            mode = "shared" if self.overlap >= SHARED_MIN else "text"
        self.mode = mode
        # Control tokens cross by name only (BOS to BOS); the rest of the target's markup is not the draft's text.
        draft_control = draft.control_tokens()
        self.special_to_draft = {
            token: [draft_control[text]] for text, token in target.control_tokens().items() if text in draft_control
        }
        if target.info.bos >= 0:
            self.special_to_draft[target.info.bos] = [draft.info.bos] if draft.info.add_bos else []

    def describe(self) -> str:
        """What the user is told once: "draft tokenizer differs: drafting through text" (or on shared tokens)."""
        if self.mode == "shared":
            return (
                f"draft tokenizer differs: drafting on the {self.n_shared:,} tokens both vocabularies share "
                f"({self.overlap:.0%} of the draft's)"
            )
        return f"draft tokenizer differs: drafting through text ({self.overlap:.0%} of the draft's tokens shared)"


def _complete_utf8(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(data, final=False)
    return len(data) - len(decoder.getstate()[0])


class HistoryMirror:
    """The draft's tokens for the target's history, kept incrementally.

    `anchors` are the points where both token lists spell the same text; each call re-tokenises from the last
    anchor at least LOOK_BEHIND target tokens before the first new token, so a boundary the two tokenizers draw
    differently is redrawn, and the work per step is a few tokens whatever the history's length.
    """

    def __init__(self, bridge: VocabBridge) -> None:
        self.bridge = bridge
        self.target: list[int] = []  # the target tokens translated so far
        self.draft: list[int] = []  # their draft tokens
        self.anchors: list[tuple[int, int]] = [(0, 0)]  # (n_target, n_draft), ascending

    @property
    def draft_per_target(self) -> float:
        """Draft tokens per target token over the history so far (how much longer the draft's spelling is)."""
        return len(self.draft) / len(self.target) if self.target else 1.0

    def translate(self, history: list[int]) -> bool:
        """Bring `draft` up to `history`. Returns False when the history ends inside a character (bytes of a
        character still to come): `draft` then covers the history up to it."""
        start = common_prefix(self.target, history) - LOOK_BEHIND
        i = max(0, bisect.bisect_right(self.anchors, (start, math.inf)) - 1)
        n_target, n_draft = self.anchors[i]
        draft, anchors, end = self._tokenize(history, n_target, n_draft)
        self.target = history[:end]
        self.draft = self.draft[:n_draft] + draft
        self.anchors = self.anchors[: i + 1] + anchors
        return end == len(history)

    def _tokenize(self, history: list[int], start: int, n_draft: int) -> tuple[list[int], list[tuple[int, int]], int]:
        """Draft tokens for history[start:], the anchors past `start`, and how far into `history` they reach.

        A target token that is one draft token by its bytes crosses as that token (most do: a step costs no
        tokenizer call); runs of the others are re-tokenised by the draft."""
        bridge = self.bridge
        target_text, token_bytes, to_draft = bridge.target_text, bridge.target.token_bytes, bridge.target_to_draft
        out: list[int] = []
        anchors: list[tuple[int, int]] = []
        run = bytearray()
        ends: list[tuple[int, int]] = []  # (n_target, byte offset in run) after each text token of the run
        for i in range(start, len(history)):
            token = history[i]
            if token >= 0 and target_text[token]:  # (an image's position: core/media.py, no text for the draft)
                mapped = to_draft.get(token)
                if mapped is not None and (not run or _complete_utf8(bytes(run)) == len(run)):
                    self._spell(bytes(run), ends, n_draft, out, anchors)
                    run.clear()
                    ends.clear()
                    out.append(mapped)
                    anchors.append((i + 1, n_draft + len(out)))
                    continue
                run += token_bytes(token)
                ends.append((i + 1, len(run)))
                continue
            self._spell(bytes(run), ends, n_draft, out, anchors)
            run.clear()
            ends.clear()
            out += bridge.special_to_draft.get(token, [])
            anchors.append((i + 1, n_draft + len(out)))
        # The history's tail may end inside a character: stop before it (its other bytes come next step).
        complete = _complete_utf8(bytes(run))
        ends = [e for e in ends if e[1] <= complete]
        if ends:
            self._spell(bytes(run[: ends[-1][1]]), ends, n_draft, out, anchors)
        return out, anchors, ends[-1][0] if ends else (anchors[-1][0] if anchors else start)

    def _spell(
        self, run: bytes, ends: list[tuple[int, int]], n_draft: int, out: list[int], anchors: list[tuple[int, int]]
    ) -> None:
        """Append the draft's tokens for one run of target text, and an anchor wherever their boundaries meet
        between two characters (re-tokenising from inside a character would turn its bytes into U+FFFD)."""
        if not run:
            return
        encoder = self.bridge.draft_encoder
        draft = encoder.encode(run.decode("utf-8", errors="replace"))
        base, offset, j = n_draft + len(out), 0, 0
        for n, piece in enumerate(draft):
            offset += len(encoder.model.token_bytes(piece))
            while j < len(ends) and ends[j][1] < offset:
                j += 1
            inside_character = offset < len(run) and run[offset] & 0xC0 == 0x80  # a UTF-8 continuation byte follows
            if j < len(ends) and ends[j][1] == offset and not inside_character:
                anchors.append((ends[j][0], base + n + 1))
        out += draft


class BridgedDrafter(ModelDrafter):
    """A draft model with its own tokenizer (see the module's docstring for the two modes); `make_drafter` wraps it
    for "model+ngram" as it does a `ModelDrafter`."""

    batched = False  # its cache holds the draft's own tokens: it drafts for its stream itself

    def __init__(self, seq: KVSequence, bridge: VocabBridge) -> None:
        super().__init__(seq, size_ratio=bridge.draft.info.file_size / bridge.target.info.file_size)
        self.bridge = bridge
        self.mirror = HistoryMirror(bridge)

    def spell(self, history: Sequence[int]) -> list[int]:
        """Its own tokens for `history` (the mirror kept incrementally: a few tokens of work a step): what it reads,
        and what its window (`reads`, core/draftread.py) and its read are counted in."""
        self.mirror.translate(list(history))
        return self.mirror.draft

    def describe(self) -> str:
        return self.bridge.describe()

    def propose(self, request: DraftRequest) -> Proposal:
        out = self._propose(request)
        out.cost = self.meter.take()
        return out

    def _propose(self, request: DraftRequest) -> Proposal:
        t0 = time.perf_counter()
        complete = self.mirror.translate(request.history)
        self.meter.seconds_bridging += time.perf_counter() - t0  # spelling the history for the draft
        if not complete:
            return Proposal()  # the target is inside a character: draft after it, next step
        k = request.k
        n_draft = k if self.bridge.mode == "shared" else self._text_budget(k)
        view = self.reads.view(self.mirror.draft)  # its spelling under this generation's window
        if len(view) + n_draft >= self.seq.ctx.n_ctx:
            return Proposal()  # the draft's spelling of the history fills its context
        if self.seq.ctx.device_greedy:
            self.seq.ctx.device_law(0)  # the greedy chain: its logits reach the host (the shared mode maps them)
        self.seq.sync(view, outputs=1)
        if self.seq.needs_checkpoint(request.k, one_batch=False):  # drafted one by one
            self.seq.checkpoint()
        if self.bridge.mode == "shared":
            return self._propose_shared(request)
        return self._propose_text(k, n_draft, p_min=request.p_min)

    def prefill(self, prompt: list[int], *, progress=None) -> int:
        self.mirror.translate(prompt)
        view = self.reads.view(self.mirror.draft[:-1])  # its spelling under the window the generation aimed
        if len(view) + 1 >= self.seq.ctx.n_ctx:
            return 0
        try:
            return self.seq.sync(view, progress=progress)
        finally:
            self.meter.take()  # the prompt's cost is the prefill's, not the first proposal's

    def keep(self, n: int) -> None:
        pass  # the next `propose` re-spells the accepted history and keeps the cache's common prefix

    def _text_budget(self, k: int) -> int:
        return max(1, min(math.ceil((k + 1) * self.mirror.draft_per_target) + 1, round(TEXT_DRAFT_MAX_RATIO * k)))

    def _argmax(self, p_min: float) -> tuple[int, float]:
        """The draft's greedy token after its last decode (from the graph where it samples there), and its
        probability when `p_min` asks for it (else 1)."""
        ctx = self.seq.ctx
        if ctx.device_greedy and p_min == 0:
            return ctx.sampled_token(-1), 1.0
        logits = ctx.logits(-1)  # (n_draft_vocab,)
        return greedy_token(logits, [], _GREEDY), top_probability(logits) if p_min > 0 else 1.0

    def _draft_tokens(self, n: int, p_min: float) -> tuple[list[int], bool]:
        """Greedy draft tokens (at most n); whether the draft ended its text itself (a control token)."""
        ended = False

        def pick(drafted: list[int]) -> Pick | None:
            nonlocal ended
            token, confidence = self._argmax(p_min)
            ended = not self.bridge.draft_text[token]
            return None if ended else Pick(token, None, confidence)

        seq = self.seq
        out = drive_alone(draft_loop(n, pick, p_min=p_min), lambda token: seq.append([token], outputs=1))
        return out.tokens, ended

    def _propose_text(self, k: int, n_draft: int, *, p_min: float) -> Proposal:
        drafted, ended = self._draft_tokens(n_draft, p_min)
        t0 = time.perf_counter()
        data = b"".join(self.bridge.draft.token_bytes(t) for t in drafted)
        data = data[: _complete_utf8(data)]
        tokens = self.bridge.target_encoder.encode(data.decode("utf-8", errors="replace"))
        if not ended and len(tokens) <= k:
            tokens = tokens[:-1]  # the draft stopped inside the last target token's text: it may be cut short
        tokens = tokens[:k]
        self.meter.seconds_bridging += time.perf_counter() - t0  # spelling its drafts for the target
        return Proposal(tokens, [None] * len(tokens))

    def _propose_shared(self, request: DraftRequest) -> Proposal:
        seq, to_target, sampling, p_min = self.seq, self.bridge.draft_to_target, request.sampling, request.p_min

        def pick(drafted: list[int]) -> Pick | None:
            law: ArrayLaw | None = None
            if request.pq and not sampling.greedy:
                own = self.laws(seq.ctx, [], sampling)  # the draft's law over its own ids
                token, confidence = own.sample(request.rng), own.top()[1]
                ids = to_target[own.ids]
                shared = ids >= 0
                if to_target[token] >= 0:  # conditioned on going on: renormalised on the shared tokens
                    law = ArrayLaw.from_weights(ids[shared], own.probs[shared])
            else:
                token, confidence = self._argmax(p_min)
            target_token = int(to_target[token])
            if target_token < 0:
                return None  # no single target token (or the draft's end of turn): the draft ends here
            return Pick(target_token, law, confidence, fed=token)

        return drive_alone(draft_loop(request.k, pick, p_min=p_min), lambda token: seq.append([token], outputs=1))
