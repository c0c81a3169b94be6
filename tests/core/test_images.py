"""Images under speculation (DESIGN §11) on the tiny image-reading pair (tests/support/tinyvision.py), real llama.cpp:
the target reads the picture through its projector, the draft reads a blank of the same length, and the output stays
the target's — greedy equal to plain decoding, the law at T 1 equal to the target's — while a chat that grows reads
its image once and a rollback never cuts into one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
from support.lawcheck import check_law
from support.tinyvision import TinyVision, png_bytes, random_pixels

from localspec.core.engine import Engine
from localspec.core.kv import KVSequence, media_run
from localspec.core.load import filler_token
from localspec.core.media import Embedded, Filler
from localspec.core.params import SpeculativeParams
from localspec.core.sampling import SamplingParams
from localspec.core.session import ChatFormat, ChatSession, Message
from localspec.errors import ContextError, InvalidParamsError
from localspec.llama.context import Context
from localspec.llama.pictures import Image, read_image

N_CTX = 256
FIXED = SpeculativeParams(draft_max=4, adaptive=False)
GREEDY = SamplingParams(temperature=0)


def picture(seed: int) -> Image:
    return read_image(png_bytes(random_pixels(seed)), name=f"picture {seed}")


@pytest.fixture(scope="module")
def engines(tiny_vision: TinyVision) -> Iterator[dict[str, Engine]]:
    """The tiny pair with its projector: drafting with the draft model, and plain."""
    loaded = {
        drafter: Engine.load(
            tiny_vision.target,
            tiny_vision.draft,
            mmproj=str(tiny_vision.mmproj),
            drafter=drafter,
            n_ctx=N_CTX,
            n_threads=1,
            cache_ram=0,
        )
        for drafter in ("model", "none")
    }
    yield loaded
    for engine in loaded.values():
        engine.close()


def prompt(engine: Engine, image: Image, after: str = " and the water was") -> list[int]:
    return [*engine.tokenize("the man said "), *engine.image_tokens(image), *engine.tokenize(after, add_special=False)]


def greedy(engine: Engine, tokens: list[int], n: int = 24, spec: SpeculativeParams = FIXED) -> list[int]:
    gen = engine.generate(tokens, sampling=GREEDY, spec=spec, max_tokens=n)
    for _ in gen:
        pass
    engine.check_invariants()
    return gen.tokens


def test_an_image_turn_speculates_and_answers_as_plain_decoding(engines):
    spec, plain = engines["model"], engines["none"]
    for seed in (1, 2):
        tokens = prompt(spec, picture(seed))
        assert sum(t < 0 for t in tokens) == 16  # the tiny projector's 16 positions
        drafted = spec.generate(tokens, sampling=GREEDY, spec=FIXED, max_tokens=24)
        out = [e.token for e in drafted]
        assert drafted.stats.drafted > 0 and drafted.stats.accepted > 0  # the draft read a blank, and still helps
        assert out == greedy(plain, prompt(plain, picture(seed)))


def test_the_picture_reaches_the_model(engines):
    plain = engines["none"]
    answers = {seed: greedy(plain, prompt(plain, picture(seed))) for seed in (1, 2, 3)}
    assert len({tuple(a) for a in answers.values()}) == 3
    assert greedy(plain, prompt(plain, picture(1))) == answers[1]  # and the same picture, the same answer


def test_a_chat_that_grows_reads_its_image_once(engines):
    engine = engines["model"]
    image = picture(4)
    first = prompt(engine, image)
    greedy(engine, first, n=8)
    again = engine.generate(first, sampling=GREEDY, spec=FIXED, max_tokens=8)
    answer = [e.token for e in again]
    assert again.stats.prefill_decoded == 0  # the same turn again: nothing of it is read
    longer = [*first, *answer, *engine.tokenize(" then", add_special=False)]
    gen = engine.generate(longer, sampling=GREEDY, spec=FIXED, max_tokens=4)
    list(gen)
    assert 0 < gen.stats.prefill_decoded <= 3  # the new text only: the image and all before it stayed
    engine.check_invariants()


def test_a_rollback_never_cuts_into_an_image(engines):
    engine = engines["none"]
    tokens = prompt(engine, picture(5))
    start = next(i for i, t in enumerate(tokens) if t < 0)
    assert media_run(tokens, start) == 16 and media_run(tokens, start - 1) == 0
    target = engine.target
    target.sync(tokens)
    target.rollback_to(start + 7)  # inside the image: all of it goes
    assert target.n_past == start
    target.check()
    target.sync(tokens)
    assert target.tokens == tokens
    target.check()


def test_a_different_image_at_the_same_place_is_read_again(engines):
    engine = engines["none"]
    a, b = prompt(engine, picture(6)), prompt(engine, picture(7))
    start = next(i for i, t in enumerate(a) if t < 0)
    engine.target.sync(a)
    read = engine.target.sync(b)
    assert read == len(b) - start  # the common prefix ends where the pictures differ: at the image's start
    engine.target.check()


def test_prompts_that_end_with_an_image_or_go_to_a_text_pair_are_one_line(engines, tiny_vision):
    engine = engines["none"]
    with pytest.raises(InvalidParamsError, match="ends with an image"):
        engine.generate([*engine.tokenize("look"), *engine.image_tokens(picture(1))])
    with Engine.load(tiny_vision.target, drafter="none", n_ctx=64, n_threads=1, cache_ram=0) as text_only:
        with pytest.raises(InvalidParamsError, match="reads no images.*--mmproj"):
            text_only.image_tokens(picture(1))
        fmt = ChatFormat(text_only.target_model, "chatml", images=text_only.image_tokens)
        with pytest.raises(InvalidParamsError, match="reads no images"):
            fmt.tokens([Message("user", "what is it?", images=(picture(1),))])
        seq = KVSequence(Context(text_only.target_model, n_ctx=64, n_threads=1))
        try:
            with pytest.raises(ContextError, match="cannot read images"):
                seq.append([*text_only.tokenize("a"), -1, -2])
        finally:
            seq.ctx.close()


def test_an_image_larger_than_the_room_left_is_refused_before_decoding(tiny_vision):
    with Engine.load(
        tiny_vision.target, mmproj=str(tiny_vision.mmproj), drafter="none", n_ctx=32, n_threads=1, cache_ram=0
    ) as engine:
        text = engine.tokenize("x" * (engine.n_ctx - 10))  # the image (16 positions) does not fit after it
        tokens = [
            *text[: engine.n_ctx - 10],
            *engine.image_tokens(picture(1)),
            *engine.tokenize(" y", add_special=False),
        ]
        with pytest.raises(ContextError, match="the context holds"):
            engine.generate(tokens, sampling=GREEDY, max_tokens=2)
        engine.target.sync(text[: engine.n_ctx - 10])
        with pytest.raises(ContextError, match="the image takes 16 positions and the context has room for 10 more"):
            engine.target.sync(tokens[:-1])  # the cache refuses it too, before decoding
        engine.check_invariants()


def test_a_chat_session_answers_about_a_picture(engines):
    engine = engines["model"]
    chat = ChatSession(engine, template_name="chatml")
    chat.messages.append(Message("user", "what is this?", images=(picture(8),)))
    first = chat.reply(sampling=GREEDY, spec=FIXED, max_tokens=6)
    list(first)
    second = chat.send("and then?", sampling=GREEDY, spec=FIXED, max_tokens=6)
    list(second)
    assert second.stats.prefill_decoded < 40  # the picture was not read again
    plain = ChatSession(engines["none"], template_name="chatml")
    plain.messages.append(Message("user", "what is this?", images=(picture(8),)))
    again = plain.reply(sampling=GREEDY, max_tokens=6)
    assert [e.token for e in again] == first.tokens


TOP_K, RUNS = 4, 2500


def law_after_image(engine: Engine, tokens: list[int]) -> dict[tuple[int, int], float]:
    """The exact law of the two tokens after `tokens` at T 1, top-k 4: from the target's rows decoded one at a time
    (a plain read of the prompt, image included, then one token a decode), softmax written out here."""
    seq = engine.target
    law: dict[tuple[int, int], float] = {}

    def row(prefix: list[int]) -> np.ndarray:
        seq.sync([*tokens, *prefix][:-1])
        seq.append([[*tokens, *prefix][-1]], outputs=1)
        return seq.ctx.logits(-1).astype(np.float64)

    def top(logits: np.ndarray) -> list[tuple[int, float]]:
        order = np.argsort(-logits)[:TOP_K]
        weights = np.exp(logits[order] - logits[order].max())
        return list(zip(order.tolist(), (weights / weights.sum()).tolist(), strict=True))

    for a, pa in top(row([])):
        for b, pb in top(row([a])):
            law[(a, b)] = pa * pb
    seq.rollback_to(0)
    return law


@pytest.mark.slow
@pytest.mark.parametrize("verify", ["pq", "match"])
def test_the_law_after_an_image_is_the_targets(engines, verify):
    engine = engines["model"]
    tokens = prompt(engine, picture(9))
    law = law_after_image(engines["none"], prompt(engines["none"], picture(9)))
    sampling = SamplingParams(temperature=1.0, top_k=TOP_K, top_p=1.0, min_p=0.0)
    spec = SpeculativeParams(draft_max=3, adaptive=False, verify=verify)
    rng = np.random.default_rng(11)
    counts: Counter[tuple[int, ...]] = Counter()
    drafted = 0
    for _ in range(RUNS):
        gen = engine.generate(tokens, sampling=sampling, spec=spec, max_tokens=2, rng=rng)
        list(gen)
        counts[tuple(gen.tokens)] += 1
        drafted += gen.stats.drafted
    assert drafted > RUNS // 2  # the draft drafted after the image
    outcomes = sorted(law)
    assert set(counts) <= set(outcomes)
    result = check_law([counts[o] for o in outcomes], [law[o] for o in outcomes])
    assert result.ok, result


def test_the_same_picture_twice_in_a_row_is_two_images(engines):
    """Two copies of one picture with nothing between them (a template without image tokens of its own around them)
    are two runs of ids, read whole each; a rollback into the second keeps the first."""
    engine = engines["none"]
    image = picture(10)
    one = engine.image_tokens(image)
    twice = [*engine.tokenize("see "), *one, *one, *engine.tokenize(" now", add_special=False)]
    start = next(i for i, t in enumerate(twice) if t < 0)
    assert media_run(twice, start) == 16 and media_run(twice, start + 16) == 16
    target = engine.target
    target.sync(twice[:-1])
    target.rollback_to(start + 20)  # inside the second: it goes, the first stays
    assert target.n_past == start + 16
    target.check()
    assert len(greedy(engine, twice, n=4)) == 4


def test_a_prompt_read_in_chunks_never_cuts_an_image(engines):
    """`serve` reads a long prompt a chunk a tick (`Generation.read_prompt`): a chunk that would end inside an image
    ends after it."""
    engine = engines["none"]
    image = picture(11)
    tokens = [*engine.tokenize("a"), *[t for _ in range(6) for t in engine.image_tokens(image)]]
    tokens += engine.tokenize(" b", add_special=False)
    gen = engine.generate(tokens, sampling=GREEDY, max_tokens=2)
    held = []
    for _ in gen.read_prompt(20):  # 20: every chunk boundary but the first lands inside an image
        held.append(engine.target.n_past)
        engine.target.check()
    start = next(i for i, t in enumerate(tokens) if t < 0)
    assert held and all((n - start) % 16 == 0 for n in held), held
    assert len(list(gen)) == 2


def test_the_draft_reads_the_targets_image_embeddings_and_drafts_after_a_picture_as_after_text(engines):
    """The tiny draft has the target's width, so it reads the target's own embeddings of a picture (encoded once,
    `Embedded`) instead of a blank (`Filler`): its acceptance after a picture comes back to about its text level
    (measured: 74 % against 11 % with a blank, 77 % on text, at k = 2, T 0), and the output stays the target's."""
    spec = engines["model"]
    draft = next(c for c in spec.caches if c is not spec.target)
    assert isinstance(draft.media, Embedded)

    def accepted(reader) -> tuple[float, list[list[int]]]:
        draft.media, n_accepted, n_drafted, outs = reader, 0, 0, []
        for seed in (4, 5, 6):
            gen = spec.generate(prompt(spec, picture(seed)), sampling=GREEDY, spec=SpeculativeParams(draft_max=2,
                                adaptive=False), max_tokens=32)  # fmt: skip
            outs.append([e.token for e in gen])
            n_accepted, n_drafted = n_accepted + gen.stats.accepted, n_drafted + gen.stats.drafted
        return n_accepted / n_drafted, outs

    embedded = draft.media
    try:
        with_embeddings, outs = accepted(embedded)
        with_blank, blank_outs = accepted(Filler(filler_token(draft.ctx.model)))
    finally:
        draft.media = embedded
    assert outs == blank_outs  # what the draft reads changes its proposals, never the output
    assert with_embeddings > 2 * with_blank, (with_embeddings, with_blank)


def test_a_draft_of_another_width_reads_rows_of_zeros_and_the_output_stays_the_targets(tiny_vision, tmp_path):
    """A draft narrower than the target cannot read its image embeddings: it reads as many rows of zeros of its own
    width at the picture's positions (`ZeroRows`; a little better than a blank of spaces, measured), its history as
    long as the target's, and greedy output is the target's alone."""
    from support.tinymodels import LlamaShape, write_llama_model

    from localspec.core.media import ZeroRows

    narrow = write_llama_model(tmp_path / "narrow.gguf", seed=7, shape=LlamaShape(n_embd=48, n_head=4, n_head_kv=2))
    answers = {}
    for drafter, draft in (("model", narrow), ("none", None)):
        with Engine.load(tiny_vision.target, draft, mmproj=str(tiny_vision.mmproj), drafter=drafter, n_ctx=N_CTX,
                         n_threads=1, cache_ram=0) as engine:  # fmt: skip
            if draft is not None:
                seq = next(c for c in engine.caches if c is not engine.target)
                assert isinstance(seq.media, ZeroRows)
            gen = engine.generate(prompt(engine, picture(8)), sampling=GREEDY, spec=FIXED, max_tokens=24)
            answers[drafter] = [e.token for e in gen]
            assert drafter == "none" or gen.stats.drafted > 0
            engine.check_invariants()
    assert answers["model"] == answers["none"]
