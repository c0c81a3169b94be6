"""Images in the chat (issue 59): attached by Ctrl+O's path prompt, by a pasted or dropped path, shown as chips above
the prompt box and in the message, sent to the tiny image-reading pair loaded with its projector
(tests/support/tinyvision.py), saved content-addressed with the chat (schema step 7), restored on reopening, kept
by a branch, found by file name, exported; bad files and a text-only pair are one line, and nothing is lost.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support import store_v6
from support.tinyvision import png_bytes, random_pixels
from support.tui import record_notifications, send, wait_ready, wait_until
from textual import events

from localspec.tui.app import make_app
from localspec.tui.attachments import NO_CLIPBOARD, clipboard_attachment, clipboard_command, pasted_paths
from localspec.tui.export import export_conversation
from localspec.tui.image_widgets import AttachmentBar, ImageChip
from localspec.tui.schema import MIGRATIONS
from localspec.tui.screens import ImagePathScreen, PathSuggester
from localspec.tui.search import search
from localspec.tui.settings import ChatOptions
from localspec.tui.store import ChatStore
from localspec.tui.widgets import ChatMessage, PromptInput

SIZE = (110, 36)


@pytest.fixture
def pictures(tmp_path) -> Path:
    """A folder with two pictures (one with a space in its name), a damaged PNG and a text file."""
    folder = tmp_path / "pictures"
    folder.mkdir()
    (folder / "zebra.png").write_bytes(png_bytes(random_pixels(1)))
    (folder / "my cat.png").write_bytes(png_bytes(random_pixels(2)))
    (folder / "broken.png").write_bytes(png_bytes(random_pixels(3))[:40])
    (folder / "notes.txt").write_text("not a picture")
    return folder


@pytest.fixture
def vision_options(chat_home, tiny_vision, tmp_path) -> ChatOptions:
    """The chat on the tiny image-reading pair, loaded with its projector."""
    return ChatOptions(
        target=str(tiny_vision.target),
        draft=str(tiny_vision.draft),
        mmproj=str(tiny_vision.mmproj),
        n_ctx=512,
        max_tokens=8,
        cursor_blink=False,
        export_dir=tmp_path / "exports",
        overrides={"seed": 1, "adaptive": False, "temperature": 0.0},
        stats_interval=0.05,
    )


def chips(app) -> list[str]:
    return [chip.attachment.name for chip in app.query(ImageChip)]


async def paste(pilot, text: str) -> None:
    app = pilot.app
    before = len(chips(app))
    app.post_message(events.Paste(text))
    await wait_until(pilot, lambda: len(chips(app)) > before, what="the pasted image's chip")


async def attach_by_prompt(pilot, path: Path) -> None:
    app = pilot.app
    await pilot.press("ctrl+o")
    await wait_until(pilot, lambda: isinstance(app.screen, ImagePathScreen), what="the image path prompt")
    app.screen.query_one("#value").value = str(path)
    await pilot.press("enter")
    await wait_until(pilot, lambda: not isinstance(app.screen, ImagePathScreen), what="the prompt to close")
    await pilot.pause()


def image_lines(message: ChatMessage) -> list[str]:
    return [str(w.render()) for w in message.query(".message-image")]


# --- without the app ----------------------------------------------------------------------------------------------


def test_a_pasted_or_dropped_path_is_read_as_image_files(pictures):
    zebra, cat = pictures / "zebra.png", pictures / "my cat.png"
    assert pasted_paths(str(zebra)) == [zebra]
    assert pasted_paths(f"'{cat}'") == [cat]  # quoted, as GNOME's terminals drop a file
    assert pasted_paths(f'"{cat}"\n') == [cat]
    assert pasted_paths(str(cat).replace(" ", "\\ ")) == [cat]  # escaped, as iTerm2 and kitty drop it
    assert pasted_paths(f"file://{str(cat).replace(' ', '%20')}") == [cat]
    assert pasted_paths(f"file://localhost{zebra}") == [zebra]
    assert pasted_paths(f"{zebra} '{cat}'") == [zebra, cat]  # two files dropped at once
    for text in (
        "look at zebra.png",  # words: typed
        str(pictures / "notes.txt"),  # not an image's name
        str(pictures / "missing.png"),  # no such file
        f"file://elsewhere{zebra}",  # another host's file
        f"{zebra}\n{cat}",  # several lines: text
        "'unbalanced",
        "",
    ):
        assert pasted_paths(text) is None, text


def test_the_clipboard_tool_is_the_systems_own_or_one_line():
    have = {"wl-paste", "xclip", "pngpaste"}.__contains__
    assert clipboard_command({"WAYLAND_DISPLAY": "w"}, have, "linux")[0] == "wl-paste"
    assert clipboard_command({"DISPLAY": ":0"}, have, "linux")[:2] == ["xclip", "-selection"]
    assert clipboard_command({}, have, "darwin") == ["pngpaste", "-"]
    assert clipboard_command({"DISPLAY": ":0"}, lambda name: None, "linux") is None
    assert clipboard_command({}, have, "linux") is None  # no display at all


@pytest.mark.anyio
async def test_the_clipboard_read_is_checked_and_fails_in_one_line(pictures):
    from localspec.errors import LocalspecError

    image = await clipboard_attachment(["cat", str(pictures / "zebra.png")])  # a tool that writes a PNG
    assert (image.name, image.image.width) == ("clipboard.png", 32)
    for command, match in ((["false"], "holds no image"), (["cat", str(pictures / "notes.txt")], "not an image")):
        with pytest.raises(LocalspecError, match=match) as caught:
            await clipboard_attachment(command)
        assert "\n" not in str(caught.value)
    assert "xclip" in NO_CLIPBOARD and "Ctrl+O" in NO_CLIPBOARD


@pytest.mark.anyio
async def test_the_clipboard_tool_is_read_to_the_size_cap_at_most(monkeypatch):
    """A tool that writes more than an image may be is stopped past the cap (issue 63): one line, not its whole
    output in memory."""
    from localspec.errors import LocalspecError
    from localspec.tui import attachments

    monkeypatch.setattr(attachments, "MAX_FILE_BYTES", 1000)
    with pytest.raises(LocalspecError, match="more than the 1.0 kB an image may be") as caught:
        await clipboard_attachment(["head", "-c", "100000", "/dev/zero"])
    assert "\n" not in str(caught.value)


@pytest.mark.anyio
async def test_the_path_prompt_completes_folders_and_image_files(pictures, monkeypatch):
    suggester = PathSuggester()
    assert await suggester.get_suggestion(f"{pictures}/ze") == f"{pictures}/zebra.png"
    assert await suggester.get_suggestion(f"{pictures}/no") is None  # notes.txt is no image
    assert await suggester.get_suggestion(str(pictures)[:-3]) == f"{pictures}/"
    monkeypatch.setenv("HOME", str(pictures.parent))
    assert await suggester.get_suggestion("~/pic") == "~/pictures/"


# --- the schema step ----------------------------------------------------------------------------------------------


def test_a_database_of_the_release_before_images_opens_with_every_chat_and_finds_them(tmp_path):
    """Step 7 on a database written by the store of the release before it (schema 6): every row kept, the search
    index made anew over the text and the images' names, and images saved after it found by name."""
    path = tmp_path / "chats.sqlite3"
    old = store_v6.ChatStore(path)
    first, _, ids = old.save_copy("Zebras", [{"role": "user", "content": "Tell me about zebras"}])
    old.add_message(first, "assistant", "Stripes.", finish_reason="stop", tool_calls=[{"id": "c", "name": "t"}])
    rows = {t: old.db.execute(f"SELECT * FROM {t} ORDER BY id").fetchall() for t in ("conversations", "messages")}
    old.close()
    store = ChatStore(path)
    try:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) == 7
        for table, before in rows.items():
            after = store.db.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
            assert [row[: len(before[0])] for row in after] == before
        assert [(m.content, m.images) for m in store.messages(first)] == [
            ("Tell me about zebras", ()),
            ("Stripes.", ()),
        ]
        assert [h.message_id for h in search(store, "zebras")] == [ids[0]]  # the old text is in the new index
        from localspec.llama.pictures import read_image
        from localspec.tui.attachments import Attachment

        image = Attachment("savanna.png", read_image(png_bytes(random_pixels(4))))
        mid = store.add_message(first, "user", "and this?", images=[image])
        assert [h.message_id for h in search(store, "savanna")] == [mid]
        assert store.attachments(store.messages(first)[-1]) == [image]
    finally:
        store.close()


def test_images_are_stored_once_and_go_with_the_last_message_that_shows_them(tmp_path):
    from localspec.llama.pictures import read_image
    from localspec.tui.attachments import Attachment

    store = ChatStore(tmp_path / "chats.sqlite3")
    try:
        image = read_image(png_bytes(random_pixels(5)))
        a, _, _ = store.save_copy("a", [{"role": "user", "content": "x", "images": [Attachment("one.png", image)]}])
        b, _, _ = store.save_copy("b", [{"role": "user", "content": "y", "images": [Attachment("two.png", image)]}])
        count = lambda: store.db.execute("SELECT COUNT(*) FROM images").fetchone()[0]  # noqa: E731
        assert count() == 1  # one picture, two names
        assert [i.name for m in store.messages(b) for i in m.images] == ["two.png"]
        store.delete(a)
        assert count() == 1
        store.delete(b)
        assert count() == 0
    finally:
        store.close()


# --- the app ------------------------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.slow
async def test_an_image_is_attached_sent_saved_reopened_branched_found_and_exported(vision_options, pictures):
    zebra = pictures / "zebra.png"
    app = make_app(vision_options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        assert app.chat.loaded.engine.media is not None  # the projector is loaded
        await attach_by_prompt(pilot, zebra)
        assert chips(app) == ["zebra.png"]
        assert app.query_one(AttachmentBar).has_class("-on")
        await send(pilot, "What is in the picture?")
        assert chips(app) == [] and not app.query_one(AttachmentBar).has_class("-on")
        user, answer = app.query(ChatMessage)
        [line] = image_lines(user)
        assert line == "zebra.png · 32x32 · 3.2 kB"
        assert answer.text and answer.caption  # the tiny pair answered
        assert [a.name for a in app.chat.attachments(app.chat.messages[-2])] == ["zebra.png"]
        cid = app.chat.saved_id
        first_answer = answer.text
        await pilot.press("ctrl+r")  # answer again: a branch beside the first answer, the question shared
        await wait_until(pilot, lambda: app.chat.turn is None and len(app.query(ChatMessage)) == 2, what="answer")
        await pilot.pause()
    store = ChatStore(vision_options.paths.db_path)
    try:
        [question, again] = store.messages(cid)
        assert [i.name for i in question.images] == ["zebra.png"] and again.branch == (2, 2)
        assert [h.message_id for h in search(store, "zebra")] == [question.id]  # found by the file's name
        md = export_conversation(store, cid, "md", vision_options.export_dir)
        js = export_conversation(store, cid, "json", vision_options.export_dir)
        [image_file] = (md.parent / f"{md.stem}-images").iterdir()
        assert image_file.read_bytes() == zebra.read_bytes()
        assert f"![zebra.png]({md.stem}-images/{image_file.name})" in md.read_text()
        [exported] = [m for m in json.loads(js.read_text())["messages"] if m["images"]]
        assert exported["images"][0]["name"] == "zebra.png" and exported["images"][0]["width"] == 32
        assert (js.parent / exported["images"][0]["file"]).read_bytes() == zebra.read_bytes()
    finally:
        store.close()

    app = make_app(vision_options)  # a restart: the chat reopens with its picture, read back from the database
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await app.chat_screen.resume(cid)
        await pilot.pause()
        user = app.query(ChatMessage).first()
        assert image_lines(user)[0].startswith("zebra.png · 32x32")
        assert app.chat.dialogue[0].images[0].data == zebra.read_bytes()  # the model reads it again
        app.query(ChatMessage).last().focus()  # the answer selected: ← shows the first branch
        await pilot.press("left")
        await wait_until(pilot, lambda: app.query(ChatMessage).last().text == first_answer, what="the first branch")
        assert image_lines(app.query(ChatMessage).first())[0].startswith("zebra.png")
        app.query_one(PromptInput).focus()
        await send(pilot, "And now?")  # the next turn reads the picture from the cache, as the chat grew
        assert app.chat.dialogue[0].images and app.query(ChatMessage).last().text


@pytest.mark.anyio
async def test_a_pasted_path_is_attached_quoted_or_as_a_url_and_backspace_takes_it_off(vision_options, pictures):
    cat = pictures / "my cat.png"
    app = make_app(vision_options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        prompt = app.query_one(PromptInput)
        await paste(pilot, f"'{cat}'")
        await paste(pilot, f"file://{pictures / 'zebra.png'}")
        assert chips(app) == ["my cat.png", "zebra.png"] and prompt.text == ""
        app.post_message(events.Paste(str(cat).replace(" ", "\\ ")))  # the same picture is not added twice
        await pilot.pause()
        assert chips(app) == ["my cat.png", "zebra.png"]
        app.post_message(events.Paste("just some text"))
        await wait_until(pilot, lambda: prompt.text == "just some text", what="the text pasted")
        prompt.text = ""
        prompt.focus()
        await pilot.press("backspace")
        await wait_until(pilot, lambda: chips(app) == ["my cat.png"], what="the last chip to go")
        await pilot.click(ImageChip)  # a click on a chip takes it off
        await wait_until(pilot, lambda: chips(app) == [], what="the chip clicked to go")


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_damaged_file_and_a_non_image_are_one_line_each_and_nothing_is_lost(vision_options, pictures):
    app = make_app(vision_options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        seen = record_notifications(app.chat_screen)
        prompt = app.query_one(PromptInput)
        prompt.text = "my draft"
        for path in (pictures / "broken.png", pictures / "notes.txt", pictures / "missing.png", pictures):
            await attach_by_prompt(pilot, path)
        app.post_message(events.Paste(str(pictures / "broken.png")))  # dropped: its suffix says image
        await wait_until(pilot, lambda: len(seen) == 5, what="five lines")
        assert all("\n" not in line for line in seen)
        assert "damaged or cut-off PNG" in seen[0] and "not an image" in seen[1]
        assert "no such file" in seen[2] and "is a folder" in seen[3] and "damaged" in seen[4]
        assert prompt.text == "my draft" and chips(app) == []


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_text_only_pair_refuses_at_send_and_keeps_the_message_and_its_images(options, pictures):
    app = make_app(dataclasses.replace(options, max_tokens=8))
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        seen = record_notifications(app.chat_screen)
        await attach_by_prompt(pilot, pictures / "zebra.png")  # attaching is allowed
        prompt = app.query_one(PromptInput)
        prompt.text = "What is it?"
        await pilot.press("enter")
        await wait_until(pilot, lambda: any("reads no images" in line for line in seen), what="the refusal")
        [line] = [line for line in seen if "reads no images" in line]
        assert "--mmproj" in line and "\n" not in line
        assert prompt.text == "What is it?" and chips(app) == ["zebra.png"]
        assert app.chat.turn is None and app.chat.saved_id is None and not app.query(ChatMessage)


def test_the_chat_database_keeps_images_as_blobs_by_hash(tmp_path):
    """What the database holds: one `images` row per picture (sha256 hex id, the bytes), a message's JSON list."""
    from localspec.llama.pictures import read_image
    from localspec.tui.attachments import Attachment

    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    image = read_image(png_bytes(random_pixels(6)))
    store.save_copy("t", [{"role": "user", "content": "x", "images": [Attachment("a [b].png", image)]}])
    store.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT id, length(data), format FROM images").fetchall() == [(image.id, len(image.data), "png")]
    assert json.loads(db.execute("SELECT images FROM messages").fetchone()[0]) == [
        {"id": image.id, "name": "a [b].png"}
    ]
    db.close()


# --- a real terminal ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_in_a_real_terminal_an_image_is_drawn_and_its_name_writes_no_control_sequence(chat_in_terminal, chat_home):
    """The chat reopened in a pty: the picture drawn inline (half blocks, as textual-image picks for a terminal that
    answers none of its queries) above its chip, and a file name holding a title-setting sequence drawn as text."""
    from localspec.llama.pictures import read_image
    from localspec.tui.attachments import Attachment

    name = "evil\x1b]0;pwned\x07\x1b[2Jcat.png"
    store = ChatStore(chat_home.db_path)
    image = Attachment(name, read_image(png_bytes(random_pixels(7))))
    store.save_copy("pictures", [{"role": "user", "content": "look", "images": [image]}])
    store.close()
    chat = chat_in_terminal()
    chat.wait_for("ready ·".encode(), "ready (models loaded)")
    mark = len(chat.output)
    assert "▀".encode() not in chat.output  # nothing else draws the half blocks
    chat.type("\x1bOS")  # F4: the saved chats
    chat.wait_for_after(mark, b"pictures", "the saved chats")
    chat.type("\r")  # Enter: resume it
    chat.wait_for_after(mark, b"32x32", "the image's chip")
    shown = bytes(chat.output[mark:])
    assert "evilcat.png · 32x32".encode() in shown  # the sequences dropped whole, the name kept
    assert b"pwned" not in shown and b"\x1b[2J" not in shown
    assert "▀".encode() in shown  # drawn inline
    assert b"\x1bP" not in shown and b"\x1b_G" not in shown  # no sixel or kitty image: the terminal has neither


@contextmanager
def freed_if_read(fifo: Path, after: float = 10.0) -> Iterator[threading.Event]:
    """A watchdog for a test that attaches `fifo`: once `after` seconds have passed, whoever still waits to read it
    (the chat before issue 63 opened it on its UI thread, and froze) is given its other end, opened and closed, so
    that the test fails on the returned event instead of hanging. A chat that never opens it for reading is never
    freed: no reader, so the writer's non-blocking open fails."""
    done, freed = threading.Event(), threading.Event()

    def watch() -> None:
        done.wait(after)
        while not done.is_set():
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                freed.set()
            except OSError:  # ENXIO: nobody waits to read it
                pass
            done.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield freed
    finally:
        done.set()
        watcher.join(timeout=5)


@contextmanager
def memory_bounded(extra: int = 2**30) -> Iterator[None]:
    """At most `extra` more bytes of data for this process meanwhile (Linux): a read of /dev/zero to its end fails
    with MemoryError instead of filling the machine's memory."""
    status = Path("/proc/self/status")
    if not hasattr(resource, "RLIMIT_DATA") or not status.exists():
        yield
        return
    [used] = [int(line.split()[1]) * 1024 for line in status.read_text().splitlines() if line.startswith("VmData:")]
    previous = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (used + extra, previous[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, previous)


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_fifo_a_device_and_a_folder_are_one_line_each_and_the_chat_goes_on(vision_options, tmp_path):
    """Ctrl+O on what is not a file (issue 63): a FIFO froze the chat (its open waited for a writer, on the UI
    thread) and /dev/zero ended it with a traceback (read to its end); each is one line naming it, nothing is read
    from it, and the prompt and the chips already attached stay."""
    fifo, folder = tmp_path / "pipe.png", tmp_path / "album"
    os.mkfifo(fifo)
    folder.mkdir()
    zebra = tmp_path / "zebra.png"
    zebra.write_bytes(png_bytes(random_pixels(1)))
    app = make_app(vision_options)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        await attach_by_prompt(pilot, zebra)
        await wait_until(pilot, lambda: chips(app) == ["zebra.png"], what="the picture's chip")
        seen = record_notifications(app.chat_screen)
        prompt = app.query_one(PromptInput)
        prompt.text = "my draft"
        with freed_if_read(fifo) as freed:
            await attach_by_prompt(pilot, fifo)
            await wait_until(pilot, lambda: len(seen) == 1, what="the FIFO's line")
        assert not freed.is_set(), "the chat waited to read a FIFO"
        with memory_bounded():
            await attach_by_prompt(pilot, Path("/dev/zero"))
            await wait_until(pilot, lambda: len(seen) == 2, what="the device's line")
        await attach_by_prompt(pilot, folder)
        await wait_until(pilot, lambda: len(seen) == 3, what="the folder's line")
        assert all("\n" not in line for line in seen)
        assert f"{fifo} is a FIFO" in seen[0] and "/dev/zero is a device" in seen[1]
        assert f"{folder} is a folder" in seen[2]
        assert app.is_running and prompt.text == "my draft" and chips(app) == ["zebra.png"]
