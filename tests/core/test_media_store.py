"""The target's images off the engine thread (issue 63): `MediaStore.prepare` counts the positions a request's images
take before decoding each (from the sizes seen, and at least a small blank picture's), refuses as soon as they cannot
fit, stops between images when asked, and the image files it keeps are bounded by bytes, an image let go read again
when a prompt brings it. Real llama.cpp and libmtmd on the tiny image-reading pair (tests/support/tinyvision.py); the
projector's `tokenize` is counted where it is called, not replaced.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from support.tinyvision import N_IMAGE_TOKENS, TinyVision, png_bytes, random_pixels

from localspec.core import media as media_mod
from localspec.core.engine import Engine
from localspec.core.media import MediaStore
from localspec.core.params import SpeculativeParams
from localspec.core.sampling import SamplingParams
from localspec.errors import ContextError
from localspec.llama.pictures import Image, read_image

N_CTX = 256


def picture(seed: int, size: int = 32) -> Image:
    return read_image(png_bytes(random_pixels(seed, size=size)), name=f"picture {seed}")


@pytest.fixture(scope="module")
def engine(tiny_vision: TinyVision) -> Iterator[Engine]:
    loaded = Engine.load(
        tiny_vision.target, mmproj=str(tiny_vision.mmproj), drafter="none", n_ctx=N_CTX, n_threads=1, cache_ram=0
    )
    yield loaded
    loaded.close()


@pytest.fixture
def store(engine: Engine, monkeypatch) -> Iterator[tuple[MediaStore, list[str]]]:
    """A fresh store over the engine's projector, and the threads each preprocessing ran on, in order."""
    fresh = MediaStore(engine.media.projector)
    calls: list[str] = []
    real = fresh.projector.tokenize

    def counted(*args, **kwargs):
        calls.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(fresh.projector, "tokenize", counted)
    yield fresh, calls
    fresh.close()


def test_images_that_cannot_fit_are_refused_before_any_is_decoded(store):
    media, calls = store
    many = [picture(seed) for seed in range(40)]  # 40 × 16 positions: more than 256
    with pytest.raises(ContextError) as refused:
        media.prepare(many, N_CTX)
    assert "the 40 images take at least 640 positions and the context holds 256" in str(refused.value)
    assert len(calls) == 1  # the blank probe alone: no image of the request was decoded


def test_images_of_a_size_seen_are_counted_without_decoding(store):
    media, calls = store
    fits = [picture(seed, size=48) for seed in range(3)]
    assert media.prepare(fits, N_CTX) is True
    assert len(calls) == 4  # the probe, then each image once
    n = len(media.tokens(fits[0]))
    assert n >= N_IMAGE_TOKENS
    calls.clear()
    more = [picture(seed, size=48) for seed in range(100, 100 + N_CTX // n + 1)]  # unseen content, a size seen
    with pytest.raises(ContextError) as refused:
        media.prepare(more, N_CTX)
    assert f"take {n * len(more)} positions" in str(refused.value) and calls == []


def test_prepare_runs_on_the_callers_thread_and_the_engine_then_reads_them_without_preprocessing(engine, store):
    media, calls = store
    images = [picture(seed) for seed in (1, 2)]
    worker = threading.Thread(target=media.prepare, args=(images, N_CTX), name="images-thread")
    worker.start()
    worker.join()
    assert set(calls) == {"images-thread"}
    calls.clear()
    before = media._chunks.copy()  # what the engine thread will read
    tokens = [*engine.tokenize("the man said "), *media.tokens(images[0]), *media.tokens(images[1])]
    assert calls == [] and sum(t < 0 for t in tokens) == 2 * N_IMAGE_TOKENS and media._chunks.keys() == before.keys()


def test_a_prepare_that_is_told_to_stop_stops_between_images(store):
    media, calls = store
    asked = []

    def stopped() -> bool:
        asked.append(len(calls))
        return len(asked) > 2  # after two images

    assert media.prepare([picture(seed) for seed in range(3, 9)], 10_000, stopped) is False
    assert len(calls) == 3  # the probe and two images, not the other four


def test_image_files_kept_are_bounded_and_one_let_go_is_read_again(engine, monkeypatch):
    size = len(picture(1).data)
    monkeypatch.setattr(media_mod, "IMAGE_BYTES_KEPT", 3 * size)
    monkeypatch.setattr(media_mod, "CHUNKS_KEPT", 2)
    media = MediaStore(engine.media.projector)
    engine_media, engine.media = engine.media, media
    engine.target.media = media
    try:
        first = picture(1)
        tokens_first = media.tokens(first)
        for seed in range(2, 12):
            media.tokens(picture(seed))
        assert media.images_kept <= 3 * size
        greedy = SamplingParams(temperature=0)
        prompt = [*engine.tokenize("the man said "), *media.tokens(first), *engine.tokenize(" and", add_special=False)]
        assert media.tokens(first) == tokens_first  # the same run: brought again, its file kept again
        gen = engine.generate(prompt, sampling=greedy, spec=SpeculativeParams(), max_tokens=4)
        assert len([e for e in gen]) == 4
        engine.check_invariants()
    finally:
        engine.media = engine.target.media = engine_media
        media.close()
