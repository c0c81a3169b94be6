"""Streaming text never splits a UTF-8 character and never shows part of a stop string."""

from localspec.core.textstream import TextStream


def test_multibyte_characters_are_held_until_complete():
    data = "héllo 🙂 wörld".encode()
    stream = TextStream()
    released = [stream.push(data[i : i + 1]) for i in range(len(data))]
    assert all("\ufffd" not in piece for piece in released)
    assert "".join(released) + stream.flush() == "héllo 🙂 wörld"
    assert released[data.index("🙂".encode())] == ""  # first byte of the emoji: nothing yet


def test_stop_string_is_cut_and_never_leaks():
    stream = TextStream(stop=["<END>"])
    out = [stream.push(p.encode()) for p in ["Hello <", "EN", "D> more"]]
    assert out == ["Hello ", "", ""]
    assert stream.stopped and stream.text == "Hello "


def test_held_prefix_is_released_when_it_is_not_a_stop():
    stream = TextStream(stop=["<END>"])
    assert stream.push(b"a <E") == "a "
    assert stream.push(b"ND") == ""
    assert stream.push(b"!") == "<END!"
    assert not stream.stopped


def test_flush_releases_a_dangling_prefix():
    stream = TextStream(stop=["###"])
    assert stream.push(b"x #") == "x "
    assert stream.flush() == "#"
    assert stream.text == "x #"
