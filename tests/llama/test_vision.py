"""Images through llama.cpp's mtmd (localspec/llama/vision.py), on the tiny LLaVA-style projector of
tests/support/tinyvision.py: the projector opens beside the tiny target, a prompt with images is cut into chunks, an
image chunk fills the KV at the position the caller gives, and each bad input (image bytes, projector file, context
size) is refused in one line before native code could crash on it.
"""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.tinyvision import (
    MISSING_TENSOR,
    N_IMAGE_TOKENS,
    TinyVision,
    bmp_bytes,
    png_bytes,
    png_header,
    random_pixels,
    write_projector,
)

from localspec.errors import ContextError, LocalspecError, ModelFileError
from localspec.llama import projector_probe, vision
from localspec.llama.compat import check_pair
from localspec.llama.context import Context
from localspec.llama.model import Model
from localspec.llama.pictures import read_image
from localspec.llama.vision import IMAGE, TEXT, Projector

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "the man said {} and the water was"


@pytest.fixture(scope="module")
def target(tiny_vision: TinyVision) -> Iterator[Model]:
    with Model(tiny_vision.target, n_gpu_layers=0) as model:
        yield model


@pytest.fixture(scope="module")
def projector(tiny_vision: TinyVision, target: Model) -> Iterator[Projector]:
    with Projector(tiny_vision.mmproj, target, n_threads=2) as opened:
        yield opened


def image(seed: int) -> vision.Image:
    return read_image(png_bytes(random_pixels(seed)), name=f"picture {seed}")


def logits_after(projector: Projector, target: Model, picture: vision.Image) -> tuple[np.ndarray, int]:
    """The target's logits after PROMPT with `picture` in it, in a fresh context: ((n_vocab,) copy, n_past at the
    end)."""
    with (
        projector.tokenize(PROMPT.format(vision.media_marker()), [picture], add_special=True) as chunks,
        Context(target, n_ctx=128, n_batch=64, n_threads=2) as ctx,
    ):
        n_past = projector.eval_chunks(ctx, chunks)
        return ctx.logits(-1).copy(), n_past


# --- the projector and the chunks ---------------------------------------------------------------------------


def test_the_projector_opens_beside_the_target_and_reads_images_only(projector: Projector):
    assert projector.supports_vision is True
    assert projector.supports_audio is False
    assert projector.uses_mrope is False


def test_a_prompt_with_an_image_is_cut_into_text_image_text(projector: Projector, target: Model):
    picture = image(1)
    with projector.tokenize(PROMPT.format(vision.media_marker()), [picture], add_special=True) as chunks:
        assert [c.kind for c in chunks] == [TEXT, IMAGE, TEXT]
        before, middle, after = chunks
        assert before.tokens == (target.info.bos, *target.tokenize("the man said "))
        assert after.tokens == tuple(target.tokenize(" and the water was"))
        assert (before.n_tokens, before.n_pos) == (len(before.tokens), len(before.tokens))
        assert (middle.tokens, middle.n_tokens, middle.n_pos) == ((), N_IMAGE_TOKENS, N_IMAGE_TOKENS)
        assert middle.id == picture.id == hashlib.sha256(picture.data).hexdigest()
        assert before.id == after.id == ""
        assert chunks.n_pos == len(before.tokens) + N_IMAGE_TOKENS + len(after.tokens)


def test_two_images_make_five_chunks_in_the_prompts_order(projector: Projector):
    marker = vision.media_marker()
    first, second = image(1), image(2)
    with projector.tokenize(f"one {marker} two {marker} three", [first, second]) as chunks:
        assert [c.kind for c in chunks] == [TEXT, IMAGE, TEXT, IMAGE, TEXT]
        assert [chunks[1].id, chunks[3].id] == [first.id, second.id]
        assert chunks.n_tokens == sum(len(c.tokens) for c in chunks if c.kind == TEXT) + 2 * N_IMAGE_TOKENS


def test_markers_and_images_must_agree_in_number(projector: Projector):
    with pytest.raises(LocalspecError, match="1 image markers for 2 images"):
        projector.tokenize(f"look {vision.media_marker()}", [image(1), image(2)])


# --- the image in the KV ------------------------------------------------------------------------------------


def test_an_image_advances_n_past_by_its_positions_and_fills_the_kv(projector: Projector, target: Model):
    # The core's path: it decodes the text itself and hands the image chunk over.
    with (
        projector.tokenize(f"look {vision.media_marker()} here", [image(1)], add_special=True) as chunks,
        Context(target, n_ctx=128, n_batch=64, n_threads=2) as ctx,
    ):
        before, picture, after = chunks
        ctx.decode(list(before.tokens), 0)
        n_past = projector.eval_image(ctx, picture, len(before.tokens))
        assert n_past == len(before.tokens) + picture.n_pos
        assert ctx.pos_range() == (0, n_past - 1)
        ctx.decode(list(after.tokens), n_past)
        assert ctx.pos_range() == (0, n_past + len(after.tokens) - 1)
        assert np.isfinite(ctx.logits(-1)).all()


def test_an_image_goes_into_the_sequence_it_is_given(projector: Projector, target: Model):
    with (
        projector.tokenize(vision.media_marker(), [image(1)]) as chunks,
        Context(target, n_ctx=64, n_batch=64, n_threads=2, n_seq=2) as ctx,
    ):
        (picture,) = chunks
        assert projector.eval_image(ctx, picture, 10, seq=1) == 10 + N_IMAGE_TOKENS
        assert ctx.pos_range(1) == (10, 10 + N_IMAGE_TOKENS - 1)
        assert ctx.pos_range(0) == (-1, -1)


@pytest.mark.slow
def test_two_pictures_give_different_next_token_logits(projector: Projector, target: Model):
    first, n_first = logits_after(projector, target, image(1))
    second, n_second = logits_after(projector, target, image(2))
    assert n_first == n_second
    assert np.abs(first - second).max() > 1.0  # logits have a spread of ~8: the picture changes them, not noise


@pytest.mark.slow
def test_the_same_picture_gives_the_same_logits_twice_and_from_a_bmp(projector: Projector, target: Model):
    pixels = random_pixels(3)
    once, _ = logits_after(projector, target, read_image(png_bytes(pixels)))
    again, _ = logits_after(projector, target, read_image(png_bytes(pixels)))
    as_bmp, _ = logits_after(projector, target, read_image(bmp_bytes(pixels), name="picture.bmp"))
    np.testing.assert_array_equal(once, again)
    np.testing.assert_array_equal(once, as_bmp)  # the same pixels through another decoder of stb_image


def test_an_image_larger_than_the_room_left_is_refused_before_decoding(projector: Projector, target: Model):
    with (
        projector.tokenize(vision.media_marker(), [image(1)]) as chunks,
        Context(target, n_ctx=32, n_batch=32, n_threads=2) as ctx,
    ):
        with pytest.raises(ContextError, match=f"takes {N_IMAGE_TOKENS} tokens and the context has room for 12 more"):
            projector.eval_image(ctx, chunks[0], ctx.n_ctx - 12)  # llama.cpp rounds n_ctx up: ask it
        assert ctx.pos_range() == (-1, -1)  # nothing was decoded


def test_a_batch_smaller_than_the_image_is_refused(projector: Projector, target: Model):
    with (
        projector.tokenize(vision.media_marker(), [image(1)]) as chunks,
        Context(target, n_ctx=64, n_batch=8, n_threads=2) as ctx,
        pytest.raises(ContextError, match=f"raise --n-batch to {N_IMAGE_TOKENS} or more"),
    ):
        projector.eval_image(ctx, chunks[0], 0)


# --- bad image bytes ----------------------------------------------------------------------------------------


def one_line_error(data: bytes, **kwargs) -> str:
    with pytest.raises(LocalspecError) as caught:
        read_image(data, name="photo", **kwargs)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("photo ")
    return message


def test_a_png_cut_short_is_refused():
    data = png_bytes(random_pixels(1))
    assert "damaged or cut-off PNG" in one_line_error(data[: len(data) // 2])
    assert "damaged or cut-off PNG" in one_line_error(data[:20])  # inside IHDR


def test_random_bytes_are_not_an_image():
    noise = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    assert "not an image libmtmd reads (PNG, JPEG, GIF or BMP)" in one_line_error(noise)
    assert "not an image" in one_line_error(b"")


@pytest.mark.parametrize(
    ("header", "name"),
    [
        (b"II*\x00" + bytes(64), "TIFF"),
        (b"MM\x00*" + bytes(64), "TIFF"),
        (b"RIFF\x00\x01\x00\x00WEBPVP8 " + bytes(64), "WebP"),
        (b"\x00\x00\x00\x18ftypheic" + bytes(64), "HEIC"),
    ],
)
def test_a_format_libmtmd_does_not_read_is_named(header: bytes, name: str):
    assert one_line_error(header) == f"photo is a {name} image: convert it to PNG or JPEG"


def test_a_png_claiming_twenty_thousand_pixels_square_is_refused_from_its_header():
    # A real header and a valid end, but only a few bytes of pixels: stb_image would allocate 1.2 GB to decode it.
    data = png_header(20000, 20000)
    data += struct.pack(">I", 8) + b"IDAT" + zlib.compress(b"\x00")[:8].ljust(8, b"\x00") + b"\x00" * 4
    data += struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
    message = one_line_error(data)
    assert "is 20000×20000 pixels (400 megapixels), more than the 50 allowed: scale it down first" in message
    assert read_image(png_bytes(random_pixels(1)), max_pixels=32 * 32).width == 32  # the cap itself is inclusive


def test_a_jpeg_gif_and_bmp_header_give_their_size():
    jpeg = b"\xff\xd8\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + bytes(9)
    jpeg += b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, 480, 640, 3) + bytes(9) + b"\xff\xda\x00\x02\xff\xd9"
    assert (read_image(jpeg).format, read_image(jpeg).width, read_image(jpeg).height) == ("jpeg", 640, 480)
    assert "cut-off JPEG" in one_line_error(jpeg[:-2])  # no end-of-image marker
    gif = b"GIF89a" + struct.pack("<HH", 7, 5) + bytes(3) + b";"
    assert (read_image(gif).width, read_image(gif).height) == (7, 5)
    bmp = bmp_bytes(random_pixels(1, size=4))
    assert (read_image(bmp).format, read_image(bmp).width) == ("bmp", 4)
    assert "cut-off BMP" in one_line_error(bmp[:-10])


def test_a_bmp_cut_short_whose_header_declares_no_size_is_refused():
    """A BMP's file-size field may be 0; its rows are then what says it was cut (the sweep's 7071×7071 claim with one
    byte of pixels read as a black picture)."""
    bmp = bmp_bytes(random_pixels(2, size=8))
    unsized = bmp[:2] + struct.pack("<I", 0) + bmp[6:]
    assert read_image(unsized).width == 8  # whole: its rows are all there
    message = one_line_error(unsized[:55])  # the headers (54 bytes) and one byte of pixels
    assert "cut-off BMP" in message and "8 rows of 8 pixels need 246" in message
    huge = bytearray(unsized[:55])
    huge[18:26] = struct.pack("<ii", 7071, 7071)
    assert "cut-off BMP" in one_line_error(bytes(huge))


# --- bad projector files: refused in one line, the test process alive ---------------------------------------


def test_a_projector_for_another_model_size_is_refused(tiny_vision: TinyVision, target: Model):
    with pytest.raises(ModelFileError) as caught:
        Projector(tiny_vision.mmproj_wrong_size, target)
    assert str(caught.value) == (
        f"{tiny_vision.mmproj_wrong_size} does not match target target.gguf (its output size 48 ≠ the model's "
        "n_embd 64): use the mmproj file published with target.gguf"
    )


def test_a_projector_that_crashes_llama_cpp_is_refused_through_the_child(tiny_vision: TinyVision, target: Model):
    # Opened in this process, this file kills it with SIGSEGV at warm-up (DESIGN §11).
    with pytest.raises(ModelFileError, match=r"crashed llama.cpp \(SIGSEGV\) when opened beside target.gguf") as caught:
        Projector(tiny_vision.mmproj_missing_tensor, target)
    assert "\n" not in str(caught.value)
    assert MISSING_TENSOR == "mm.0.bias"


def test_a_projector_without_a_tensor_mtmd_requires_names_it(tmp_path: Path, target: Model):
    path = write_projector(tmp_path / "mmproj-short.gguf", drop="v.blk.1.ffn_down.weight")
    with pytest.raises(ModelFileError, match=r"lacks the tensor v\.blk\.1\.ffn_down\.weight: .* re-download it"):
        Projector(path, target)


def test_a_model_file_given_as_projector_is_refused(tiny_vision: TinyVision, target: Model):
    with pytest.raises(ModelFileError, match="is not a projector \\(its architecture is llama\\)"):
        Projector(tiny_vision.draft, target)


def test_a_second_open_reuses_the_probe(tiny_vision: TinyVision, target: Model, monkeypatch: pytest.MonkeyPatch):
    with Projector(tiny_vision.mmproj, target, n_threads=2):
        pass

    def no_child(*args, **kwargs):
        raise AssertionError("the probe ran a second child")

    monkeypatch.setattr(projector_probe.subprocess, "run", no_child)
    with Projector(tiny_vision.mmproj, target, n_threads=2) as again:
        assert again.supports_vision


# --- the script ---------------------------------------------------------------------------------------------


def test_the_script_writes_a_pair_and_its_projector(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tiny_vision.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft.gguf", "mmproj.gguf", "target.gguf"]
    with Model(tmp_path / "target.gguf", n_gpu_layers=0) as target, Model(tmp_path / "draft.gguf") as draft:
        assert check_pair(target, draft).kind == "same"
        with Projector(tmp_path / "mmproj.gguf", target, n_threads=2) as projector:
            assert projector.supports_vision
