"""`localspec serve` takes images (issue 59): OpenAI's `image_url` parts, the Responses API's `input_image` and
Anthropic's `image` blocks, through the real `openai` and `anthropic` clients, on the tiny image-reading pair
(tests/support/tinyvision.py) served as a real uvicorn subprocess. The picture reaches the model (two images, two
answers), speculation stays exact (the same greedy answer as `--drafter none`), the image's positions are counted as
prompt tokens, and every bad input is a 400 in the route's own error shape, one line, the server still answering.
"""

from __future__ import annotations

import base64
import concurrent.futures
import http.server
import os
import signal
import struct
import threading
import zlib
from collections.abc import Iterator

import anthropic
import openai
import pytest
from support.server import Server, error_of, raw, start_server, stop_cleanly
from support.tinyvision import N_IMAGE_TOKENS, TinyVision, png_bytes, png_header, random_pixels

N_CTX = 512  # room for an image beside the generic tool syntax's system prompt (about 290 tokens)
MODEL = "target.gguf"  # a --target file is served by its name
TEXT = "the man said"
SPEC = ("--temp", "0", "--n-ctx", str(N_CTX), "--draft-max", "4", "--no-adaptive")


def png(seed: int) -> bytes:
    return png_bytes(random_pixels(seed))


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def corrupt_png() -> bytes:
    """A PNG whose chunks are whole (the header check passes) and whose pixel data is no zlib stream."""
    return png_header(32, 32) + _chunk(b"IDAT", b"\xff" * 64) + _chunk(b"IEND", b"")


def huge_png() -> bytes:
    """A small file whose header claims 20000×20000 pixels (400 megapixels)."""
    return png_header(20000, 20000) + _chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + _chunk(b"IEND", b"")


def webp() -> bytes:
    return b"RIFF" + struct.pack("<I", 30) + b"WEBPVP8 " + bytes(22)


def chat_body(url: str, *, text: str = TEXT, max_tokens: int = 12, **extra) -> dict:
    content = [{"type": "image_url", "image_url": {"url": url, "detail": "low"}}, {"type": "text", "text": text}]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **extra}


def _serve(home_factory, vision: TinyVision, *args: str) -> Iterator[Server]:
    home = home_factory.mktemp("vision-home")
    running = start_server(home, "--target", str(vision.target), "--draft", str(vision.draft), *SPEC, *args)
    yield running
    running.stop()
    assert "Traceback" not in running.stderr()


@pytest.fixture(scope="module")
def server(tiny_vision, tmp_path_factory) -> Iterator[Server]:
    """The tiny pair with its projector, drafting with the draft model (k = 4, fixed)."""
    yield from _serve(tmp_path_factory, tiny_vision, "--mmproj", str(tiny_vision.mmproj))


@pytest.fixture(scope="module")
def plain(tiny_vision, tmp_path_factory) -> Iterator[Server]:
    """The same pair decoding plainly (`--drafter none`), which fetches image URLs (`--allow-image-urls`)."""
    args = ("--mmproj", str(tiny_vision.mmproj), "--drafter", "none", "--allow-image-urls")
    yield from _serve(tmp_path_factory, tiny_vision, *args)


@pytest.fixture(scope="module")
def text_only(tiny_vision, tmp_path_factory) -> Iterator[Server]:
    """The same pair loaded without its projector."""
    yield from _serve(tmp_path_factory, tiny_vision)


def claude(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="none", max_retries=0, timeout=120)


def chat(server: Server, url: str, **extra):
    body = chat_body(url, **extra)
    return server.client().chat.completions.create(model=MODEL, **body)


@pytest.mark.slow
def test_an_image_turn_is_answered_and_its_positions_are_prompt_tokens(server):
    seen = chat(server, data_url(png(1)))
    assert seen.choices[0].message.content and seen.choices[0].finish_reason == "length"
    timings = seen.model_extra["timings"]
    assert timings["prompt_n"] + timings["cache_n"] == seen.usage.prompt_tokens
    assert timings["draft_n"] > 0  # the draft read a blank where the picture was, and still drafted
    # A second image beside it adds its 16 positions and nothing else (the text around them is cut the same).
    content = [{"type": "image_url", "image_url": {"url": data_url(png(n))}} for n in (1, 2)]
    two = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [*content, {"type": "text", "text": TEXT}]}], max_tokens=4
    )
    assert two.usage.prompt_tokens == seen.usage.prompt_tokens + N_IMAGE_TOKENS
    assert two.model_extra["timings"]["prompt_n"] + two.model_extra["timings"]["cache_n"] == two.usage.prompt_tokens
    b64 = base64.b64encode(png(1)).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
    message = claude(server).messages.create(
        model=MODEL, max_tokens=12, messages=[{"role": "user", "content": [image, {"type": "text", "text": TEXT}]}]
    )
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == seen.usage.prompt_tokens


def test_two_images_give_two_answers(server):
    answers = {seed: chat(server, data_url(png(seed)), max_tokens=16).choices[0].message.content for seed in (1, 2)}
    assert answers[1] != answers[2]


@pytest.mark.slow
def test_speculation_answers_as_plain_decoding_on_every_route(server, plain):
    for seed in (1, 2, 3):
        url = data_url(png(seed))
        spec, alone = chat(server, url, max_tokens=24), chat(plain, url, max_tokens=24)
        assert spec.choices[0].message.content == alone.choices[0].message.content
        assert spec.model_extra["timings"]["draft_n"] > 0 and alone.model_extra["timings"]["draft_n"] == 0
    url, b64 = data_url(png(4)), base64.b64encode(png(4)).decode()
    want = chat(plain, url, max_tokens=16).choices[0].message.content
    for running in (server, plain):
        response = running.client().responses.create(
            model=MODEL,
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": url, "detail": "auto"},
                        {"type": "input_text", "text": TEXT},
                    ],
                }
            ],
            max_output_tokens=16,
        )
        assert response.output_text == want
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
        message = claude(running).messages.create(
            model=MODEL,
            max_tokens=16,
            messages=[{"role": "user", "content": [image, {"type": "text", "text": TEXT}]}],
        )
        assert message.content[0].text == want


@pytest.mark.slow
def test_images_are_read_in_the_order_given(server):
    one, two = data_url(png(1)), data_url(png(2))
    answers = []
    for first, second in ((one, two), (two, one)):
        content = [{"type": "image_url", "image_url": {"url": u}} for u in (first, second)]
        body = {"messages": [{"role": "user", "content": [*content, {"type": "text", "text": TEXT}]}]}
        reply = server.client().chat.completions.create(model=MODEL, max_tokens=16, **body)
        assert reply.usage.prompt_tokens == chat(server, one).usage.prompt_tokens + N_IMAGE_TOKENS
        answers.append(reply.choices[0].message.content)
    assert answers[0] != answers[1]


def test_streaming_with_an_image_on_every_route(server):
    url = data_url(png(5))
    whole = chat(server, url, max_tokens=16).choices[0].message.content
    chunks = server.client().chat.completions.create(model=MODEL, stream=True, **chat_body(url, max_tokens=16))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    b64 = base64.b64encode(png(5)).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
    with claude(server).messages.stream(
        model=MODEL, max_tokens=16, messages=[{"role": "user", "content": [image, {"type": "text", "text": TEXT}]}]
    ) as stream:
        assert "".join(stream.text_stream) == whole
    events = server.client().responses.create(
        model=MODEL,
        input=[
            {
                "role": "user",
                "content": [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": TEXT}],
            }
        ],
        max_output_tokens=16,
        stream=True,
    )
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole


def test_counting_tokens_and_a_stored_conversation_keep_the_image(server):
    b64 = base64.b64encode(png(6)).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
    counted = claude(server).messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": [image, {"type": "text", "text": TEXT}]}]
    )
    assert counted.input_tokens == chat(server, data_url(png(6))).usage.prompt_tokens
    client, url = server.client(), data_url(png(6))
    first = client.responses.create(
        model=MODEL,
        input=[
            {
                "role": "user",
                "content": [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": TEXT}],
            }
        ],
        max_output_tokens=8,
    )
    follow = client.responses.create(model=MODEL, input="and?", previous_response_id=first.id, max_output_tokens=8)
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": TEXT}]
    turns = [
        {"role": "user", "content": content},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "and?"},
    ]
    same = client.chat.completions.create(model=MODEL, messages=turns, max_tokens=8)
    assert follow.usage.input_tokens == same.usage.prompt_tokens  # the stored turn still holds its picture
    assert follow.output_text == same.choices[0].message.content


BAD = [
    ("data:image/png;base64,not base64!", "invalid_image", "base64 is not valid"),
    (data_url(b"hello", "text/plain"), "invalid_image", "text/plain, not an image"),
    (data_url(png(1)[:60]), "invalid_image", "cut-off PNG"),
    (data_url(webp(), "image/webp"), "invalid_image", "WebP image: convert it to PNG or JPEG"),
    (data_url(huge_png()), "invalid_image", "20000×20000 pixels"),
    (data_url(corrupt_png()), "invalid_image", "could not decode"),
    ("https://example.com/cat.png", "image_url_refused", "--allow-image-urls"),
    ("file:///etc/hosts", "image_url_refused", "a local file, which this server does not read"),
    ("/etc/hosts", "image_url_refused", "a local file"),
    ("ftp://example.com/cat.png", "image_url_refused", "ftp: URL"),
]


@pytest.mark.parametrize("url,code,says", BAD, ids=[b[2].split(":")[0][:24] for b in BAD])
def test_a_bad_image_is_a_400_with_one_line_and_the_server_goes_on(server, url, code, says):
    with pytest.raises(openai.BadRequestError) as raised:
        chat(server, url)
    error = raised.value.body
    assert error["code"] == code and says in error["message"] and "\n" not in error["message"], error
    assert error["param"] == ("messages" if "decode" in says else "messages.0.content.0")
    assert chat(server, data_url(png(1))).choices[0].message.content  # nothing lost: the next request is answered


def test_bad_images_on_the_responses_and_messages_routes(server):
    with pytest.raises(openai.BadRequestError) as raised:
        server.client().responses.create(
            model=MODEL,
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": data_url(huge_png())}]}],
        )
    assert raised.value.body["param"] == "input.0.content.0" and "megapixels" in raised.value.body["message"]
    with pytest.raises(openai.BadRequestError) as raised:
        server.client().responses.create(
            model=MODEL, input=[{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]
        )
    assert raised.value.body["param"] == "input.0.content.0.file_id" and "Files API" in raised.value.body["message"]
    sources = [
        ({"type": "base64", "media_type": "image/png", "data": "%%%"}, "base64 is not valid"),
        ({"type": "base64", "media_type": "application/pdf", "data": "AAAA"}, "not an image"),
        ({"type": "url", "url": "https://example.com/cat.png"}, "--allow-image-urls"),
        ({"type": "file", "file_id": "file_1"}, "Files API"),
    ]
    for source, says in sources:
        with pytest.raises(anthropic.BadRequestError) as raised:
            claude(server).messages.create(
                model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [{"type": "image", "source": source}]}]
            )
        error = raised.value.body["error"]
        assert error["type"] == "invalid_request_error" and says in error["message"], error
        assert "messages.0.content.0" in error["message"]
    assert server.healthy()


def test_a_part_of_another_kind_is_refused_by_its_name(server):
    body = {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}
    status, _, reply = raw(server.port, "POST", "/v1/chat/completions", body)
    error = error_of(reply)
    assert status == 400 and error["param"] == "messages.0.content.0.type" and "image_url" in error["message"]


def test_images_past_the_context_are_a_400_naming_the_fix(server):
    many = [{"type": "image_url", "image_url": {"url": data_url(png(1))}}] * (N_CTX // N_IMAGE_TOKENS)
    status, _, body = raw(
        server.port, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": many}]}
    )
    error = error_of(body)
    assert status == 400 and error["code"] == "context_length_exceeded", error
    assert f"the {len(many)} images take" in error["message"]
    assert f"{N_CTX} positions and the context holds {N_CTX}" in error["message"]
    assert "fewer images" in error["message"] and "--n-ctx" in error["message"]
    assert chat(server, data_url(png(1))).choices[0].message.content


def big_png(width: int, height: int) -> bytes:
    """A whole PNG of `width`×`height` black pixels (a few KB: rows of zeros compress well)."""
    rows = (b"\x00" + b"\x00" * 3 * width) * height
    return png_header(width, height) + _chunk(b"IDAT", zlib.compress(rows, 9)) + _chunk(b"IEND", b"")


def post(server: Server, content: list) -> tuple[int, dict[str, str], bytes]:
    return raw(server.port, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": content}]})


@pytest.mark.slow
def test_many_large_pictures_are_refused_before_they_hold_the_engine(server):
    """The sweep's request: many small files of large pictures. Their positions are counted before each is decoded
    (the same size: one decode tells them all) and their pixels before any: a 400 each, the server answering after."""
    picture = data_url(big_png(2000, 2000))  # 4 megapixels each, 16 positions each on the tiny projector
    many = [{"type": "image_url", "image_url": {"url": picture}}] * (N_CTX // N_IMAGE_TOKENS + 1)
    status, _, body = post(server, many)
    assert status == 400 and error_of(body)["code"] == "context_length_exceeded", body
    claims = data_url(png_header(7000, 7000) + _chunk(b"IDAT", zlib.compress(b"\x00")) + _chunk(b"IEND", b""))
    heavy = [{"type": "image_url", "image_url": {"url": claims}}] * 5  # 245 megapixels, never decoded
    status, _, body = post(server, heavy)
    error = error_of(body)
    assert status == 400 and error["code"] == "too_many_pixels" and "245 megapixels" in error["message"], error
    assert chat(server, data_url(png(1))).choices[0].message.content


TOOLS = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}]


@pytest.mark.slow
def test_a_text_only_pair_refuses_an_image_naming_the_fix(text_only):
    for extra in ({}, {"tools": TOOLS}):  # tools rewrite the messages (the generic syntax): checked before that
        with pytest.raises(openai.BadRequestError) as raised:
            chat(text_only, data_url(png(1)), **extra)
        assert "reads no images" in raised.value.body["message"] and "--mmproj" in raised.value.body["message"]
    b64 = base64.b64encode(png(1)).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
    with pytest.raises(anthropic.BadRequestError) as raised:
        claude(text_only).messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [image]}])
    assert "--mmproj" in raised.value.body["error"]["message"]
    reply = text_only.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": TEXT}], max_tokens=4
    )
    assert reply.choices[0].message.content is not None


def test_an_image_beside_tools_reaches_the_model(server):
    text = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": TEXT}], tools=TOOLS, max_tokens=4
    )
    seen = chat(server, data_url(png(1)), tools=TOOLS, max_tokens=4)
    assert seen.usage.prompt_tokens >= text.usage.prompt_tokens + N_IMAGE_TOKENS - 4


class _Png(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path != "/cat.png":
            self.send_error(404)
            return
        data = png(7)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def test_allow_image_urls_fetches_a_url_and_reads_a_file(plain, tmp_path):
    want = chat(plain, data_url(png(7))).choices[0].message.content
    (tmp_path / "cat.png").write_bytes(png(7))
    assert chat(plain, (tmp_path / "cat.png").as_uri()).choices[0].message.content == want
    assert chat(plain, str(tmp_path / "cat.png")).choices[0].message.content == want
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Png)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{web.server_address[1]}"
        assert chat(plain, f"{base}/cat.png").choices[0].message.content == want
        with pytest.raises(openai.BadRequestError) as raised:
            chat(plain, f"{base}/dog.png")
        assert "HTTP 404" in raised.value.body["message"]
    finally:
        web.shutdown()
        web.server_close()
    with pytest.raises(openai.BadRequestError) as raised:
        chat(plain, (tmp_path / "missing.png").as_uri())
    assert f"'messages.0.content.0': no such file: {tmp_path / 'missing.png'}" in raised.value.body["message"]


def test_a_path_to_a_pipe_a_device_or_a_folder_is_refused_and_never_waited_on(plain, tmp_path):
    """With --allow-image-urls a path must name a regular file: a FIFO with no writer (whose open would wait
    forever), a device that never ends, a folder — each a 400 naming the part, many at once wedging nothing."""
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    cases = {str(fifo): "is a FIFO", "/dev/zero": "is a device", str(tmp_path): "is a folder"}
    for path, says in cases.items():
        with pytest.raises(openai.BadRequestError) as raised:
            chat(plain, path)
        error = raised.value.body
        assert says in error["message"] and error["param"] == "messages.0.content.0", error
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        body = chat_body(str(fifo))
        refused = list(pool.map(lambda _: raw(plain.port, "POST", "/v1/chat/completions", body), range(8)))
    assert {status for status, _, _ in refused} == {400}
    text = plain.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": TEXT}], max_tokens=4
    )
    assert text.choices[0].message.content is not None


@pytest.mark.slow
def test_a_stop_while_images_are_read_answers_503_at_once_and_exits_on_one_line(tiny_vision, tmp_path):
    """SIGTERM while a request's pictures are decoded (off the engine thread): its client gets the error object
    (503 server_stopping) without waiting for the rest, the reading ends at its next picture, and the server exits
    on one line with no traceback (before: 31 s, and uvicorn's bare text 500)."""
    home = tmp_path / "home"
    home.mkdir()
    server = start_server(home, "--target", str(tiny_vision.target), "--mmproj", str(tiny_vision.mmproj), *SPEC)
    try:
        pictures = []
        for i in range(12):  # 16 megapixels each, distinct (one pixel differs): each decoded, 192 megapixels in all
            rows = bytearray(b"\x00" + b"\x00" * 3 * 4000) * 4000
            rows[1 + i] = 255
            data = png_header(4000, 4000) + _chunk(b"IDAT", zlib.compress(bytes(rows), 1)) + _chunk(b"IEND", b"")
            pictures.append({"type": "image_url", "image_url": {"url": data_url(data)}})
        body = {"messages": [{"role": "user", "content": [*pictures, {"type": "text", "text": TEXT}]}]}
        answer: list = []
        client = threading.Thread(target=lambda: answer.append(raw(server.port, "POST", "/v1/chat/completions", body)))
        client.start()
        server.wait_until(lambda: "reading 12 images" in server.stderr(), "the pictures to be read")
        stop_cleanly(server, signal.SIGTERM)
        client.join(60)
        status, headers, reply = answer[0]
        assert status == 503 and error_of(reply)["code"] == "server_stopping" and headers.get("retry-after"), reply
    finally:
        server.stop(signal.SIGKILL)
