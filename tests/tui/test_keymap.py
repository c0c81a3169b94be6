"""The user's keys: `[keys]` in chat.toml of the config folder, read by `keymap.load_keymap` and applied by the app
through Textual's keymap (binding ids); every bad entry is one warning line, never a crash."""

from __future__ import annotations

import pytest
from support.tui import record_notifications, send, wait_ready, wait_until

from localspec.tui.app import binding_groups, make_app
from localspec.tui.keymap import KEYS_FILE, load_keymap

SIZE = (110, 36)


def test_every_binding_of_the_chat_has_an_id_and_no_two_share_one():
    groups = binding_groups()
    ids = [name for group in groups for name in group]
    assert len(ids) == len(set(ids))
    assert {"quit", "stop", "regenerate", "new_chat", "pairs", "settings", "chats", "new_line", "copy_code"} <= set(ids)


def test_a_missing_file_is_no_keymap_and_a_good_one_is_read(tmp_path):
    groups = binding_groups()
    assert load_keymap(tmp_path / KEYS_FILE, groups) == ({}, [])
    path = tmp_path / KEYS_FILE
    path.write_text('[keys]\nnew_chat = "ctrl+b"\nregenerate = ["f9", "ctrl+g"]\nquit = "ctrl+shift+x"\n')
    assert load_keymap(path, groups) == (
        {"new_chat": "ctrl+b", "regenerate": "f9,ctrl+g", "quit": "ctrl+shift+x"},
        [],
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[keys]\nnew_chats = "ctrl+b"\n', "no binding has the id 'new_chats'"),
        ("[keys]\nnew_chat = 5\n", "new_chat = 5 is not keys"),
        ('[keys]\nnew_chat = "ctrl+nothing"\n', "is not keys"),
        ('[keys]\nnew_chat = ""\n', "is not keys"),
        ('[keys]\nnew_chat = "bogus+b"\n', "is not keys"),
        ("[keys\nnew_chat = 1\n", "is not valid TOML"),
        ('keys = "ctrl+b"\n', "[keys] must be a table"),
        ('[keys]\nnew_chat = "ctrl+r"\n', "new_chat takes ctrl+r from regenerate"),
    ],
)
def test_a_bad_entry_is_one_warning_line(tmp_path, text, said):
    path = tmp_path / KEYS_FILE
    path.write_text(text)
    keymap, warnings = load_keymap(path, binding_groups())
    [line] = warnings
    assert said in line and "\n" not in line and str(path) in line
    assert keymap in ({}, {"new_chat": "ctrl+r"})  # a key taken from another binding is still applied


def test_a_file_that_is_not_utf8_is_one_warning_line(tmp_path):
    path = tmp_path / KEYS_FILE
    path.write_bytes(b'[keys]\nnew_chat = "\xff"\n')
    assert load_keymap(path, binding_groups())[0] == {}
    [line] = load_keymap(path, binding_groups())[1]
    assert "cannot be read" in line


@pytest.mark.anyio
async def test_a_remapped_key_works_in_the_chat_and_a_bad_entry_is_a_warning(options, chat_home):
    (chat_home.config_dir / KEYS_FILE).write_text('[keys]\nnew_chat = "ctrl+b"\nnot_a_binding = "f9"\n')
    app = make_app(options)
    notes = record_notifications(app)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot)
        [warning] = [n for n in notes if "not_a_binding" in n]
        assert "no binding has the id" in warning
        await send(pilot, "Hello")
        await pilot.press("ctrl+n")  # the old key does nothing now
        assert app.chat.messages and app.chat.saved_id is not None
        await pilot.press("ctrl+b")
        await wait_until(pilot, lambda: app.chat.saved_id is None, what="the new chat")
        assert app.chat.messages == []
        footer = {binding.action: key for key, (_, binding, _, _) in app.screen.active_bindings.items()}
        assert footer["new_chat"] == "ctrl+b"
