"""Reasoning models: the marker scanner and the per-part numbers as pure logic, then the real llama.cpp on the tiny
thinking models — markers found in the vocabulary or the template, Qwen3's real template switched on and off, the
split of streamed answers (markers across tokens, stop strings, a prompt that opened thinking), history handed
back by the template's own rule, and prefix reuse when a past turn's thinking is dropped."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import GREEDY
from support.tinymodels import ANSWER_TEXT, CHATML_TEMPLATE, REASONING_TEXT, qwen3_template

from localspec.core.engine import Engine, TokenEvent
from localspec.core.kv import common_prefix
from localspec.core.params import SpeculativeParams
from localspec.core.session import ChatFormat, ChatSession, Message
from localspec.core.stats import Stats
from localspec.core.thinking import ANSWER, THINKING, MarkerScanner, PartStats, ThinkingSplit, opened_by, split_text
from localspec.core.thinking_support import Markers, ThinkingSupport, choose_thinking, thinking_choice
from localspec.errors import InvalidParamsError
from localspec.llama.templates import render_jinja_chat

THINK = Markers("<think>", "</think>")
SPEC = SpeculativeParams(draft_max=4, adaptive=False)


def scan(chunks: list[str], *, opened: bool = False) -> tuple[str, str]:
    """(thinking, answer) texts of `chunks` pushed one by one into a scanner, then flushed."""
    scanner = MarkerScanner(THINK, thinking=opened)
    pieces = [p for chunk in chunks for p in scanner.push(chunk)] + scanner.flush()
    return "".join(t for part, t, _ in pieces if part == THINKING), "".join(
        t for part, t, _ in pieces if part == ANSWER
    )


# --- the scanner ---------------------------------------------------------------------------------------------


TEXT = "<think>\nplan it</think>\n\nThe answer."


@pytest.mark.parametrize("cut", range(len(TEXT) + 1))
def test_a_marker_split_at_any_point_is_found(cut):
    assert scan([TEXT[:cut], TEXT[cut:]]) == ("\nplan it", "\n\nThe answer.")


def test_one_character_at_a_time_and_the_held_back_text():
    scanner = MarkerScanner(THINK, thinking=False)
    out = [scanner.push(c) for c in "  <thi"]
    assert out == [[]] * 6  # whitespace and a start marker on its way: nothing released yet
    assert scanner.push("nk>ab</") == [(THINKING, "ab", False)]  # "</" may be the end marker
    assert scanner.push("x") == [(THINKING, "</x", False)]  # it was not
    assert scanner.push("</think>C") == [(ANSWER, "C", False)]
    assert scanner.push("<think>D</think>") == [(ANSWER, "<think>D</think>", False)]  # after the answer: text


def test_pieces_keep_the_tag_of_the_text_they_came_from():
    scanner = MarkerScanner(THINK, thinking=False)
    pieces = scanner.push("<think>ab", True) + scanner.push("c</th", False) + scanner.push("ink>de", True)
    assert pieces == [(THINKING, "ab", True), (THINKING, "c", False), (ANSWER, "de", True)]


def test_an_answer_without_thinking_is_unchanged():
    assert scan(["  Hello <think> is a tag"]) == ("", "  Hello <think> is a tag")
    assert split_text(THINK, "  Hello") == ("", "Hello")  # a reasoning model's answer: leading whitespace goes
    assert split_text(None, "<think>x</think>y") == ("", "<think>x</think>y")  # a model without markers


def test_a_prompt_that_opened_thinking_starts_inside_it():
    assert scan(["plan</think>\n\nanswer"], opened=True) == ("plan", "\n\nanswer")
    assert split_text(THINK, "plan</think>\n\nanswer", opened=True) == ("plan", "answer")
    assert opened_by(THINK, "<|Assistant|><think>\n")
    assert not opened_by(THINK, "<think>\n\n</think>\n\n")
    assert not opened_by(THINK, "<|im_start|>assistant\n")
    assert not opened_by(None, "<think>")


def test_an_unfinished_thinking_span_is_all_thinking():
    assert scan(["<think>still going </thi"]) == ("still going </thi", "")
    assert split_text(THINK, "<think> half") == ("half", "")


@given(st.text(alphabet="<>/thinkab \n", max_size=40), st.lists(st.integers(0, 40), max_size=6))
def test_any_chunking_splits_as_the_whole_text(text, cuts):
    cuts = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert scan(chunks) == scan([text])


# --- per-part numbers from the event stream -------------------------------------------------------------------


def feed_steps(split: ThinkingSplit, steps: list[tuple[int, int, list[str]]]) -> Stats:
    """Feed a split the events of `steps` (drafted, accepted, emitted texts), as a Generation would yield them."""
    stats = Stats()
    ids = {}
    for drafted, accepted, texts in steps:
        stats.target_passes += 1
        stats.drafted += drafted
        stats.accepted += accepted
        for i, text in enumerate(texts):
            ids.setdefault(text, len(ids))
            split.feed(TokenEvent(ids[text], text, i < accepted), stats)
    split.feed(TokenEvent(None, "", False, "length"), stats)
    return stats


def test_tokens_drafts_and_passes_are_shared_out_by_part():
    pieces = {}
    split = ThinkingSplit(THINK, opened=False, token_bytes=lambda t: pieces[t].encode())
    steps = [
        (3, 3, ["<think>", "a", "b", "c"]),  # all thinking
        (4, 2, ["d", "</think>", "X"]),  # two accepted (thinking), the rejection at the answer's first token
        (2, 2, ["Y", "Z", "W"]),
    ]
    ids = {}
    for _, _, texts in steps:
        for text in texts:
            ids.setdefault(text, len(ids))
    pieces.update({i: t for t, i in ids.items()})
    stats = feed_steps(split, steps)
    parts = split.parts()
    assert parts[THINKING] == PartStats(tokens=6, drafted=5, accepted=5, passes=pytest.approx(1 + 2 / 3))
    assert parts[ANSWER] == PartStats(tokens=4, drafted=4, accepted=2, passes=pytest.approx(1 + 1 / 3))
    assert parts[THINKING].tokens + parts[ANSWER].tokens == 10
    assert sum(p.drafted for p in parts.values()) == stats.drafted
    assert sum(p.accepted for p in parts.values()) == stats.accepted
    assert sum(p.passes for p in parts.values()) == pytest.approx(stats.target_passes)
    assert (split.reasoning, split.answer) == ("abcd", "XYZW")
    assert split.thought and not split.thinking
    assert parts[ANSWER].acceptance_rate == 0.5 and parts[ANSWER].tokens_per_pass == pytest.approx(3.0)


def test_a_marker_in_two_tokens_is_placed_on_the_token_that_completes_it():
    texts = {0: "<thi", 1: "nk>", 2: "a", 3: "</th", 4: "ink>", 5: "B"}
    split = ThinkingSplit(THINK, opened=False, token_bytes=lambda t: texts[t].encode())
    stats = Stats()
    for token, text in texts.items():
        stats.target_passes += 1
        split.feed(TokenEvent(token, text, False), stats)
    split.feed(TokenEvent(None, "", False, "stop"), stats)
    assert split.parts()[THINKING].tokens == 5 and split.parts()[ANSWER].tokens == 1
    assert (split.reasoning, split.answer) == ("a", "B")


def test_without_markers_everything_is_answer_and_the_text_is_unchanged():
    split = ThinkingSplit(None, opened=False, token_bytes=lambda t: b"x")
    stats = Stats(target_passes=1)
    pieces = split.feed(TokenEvent(1, " <think>hi", True), stats)
    assert pieces == [(ANSWER, " <think>hi", True)]
    assert split.answer == " <think>hi" and split.reasoning == "" and not split.thought
    assert split.parts()[THINKING] == PartStats()


def test_check_refuses_what_the_model_cannot_do():
    switchable = ThinkingSupport(THINK, "enable_thinking", True, "vocabulary")
    always = ThinkingSupport(THINK, None, False, "vocabulary")
    never = ThinkingSupport()
    for think in (None, True, False):
        switchable.check(think, "qwen3")
    always.check(True, "r1")
    with pytest.raises(
        InvalidParamsError, match="r1 always thinks: its chat template has no thinking switch .*--think off"
    ):
        always.check(False, "r1")
    with pytest.raises(InvalidParamsError, match="smol does not think .* so `thinking = true` cannot be followed"):
        never.check(True, "smol", "`thinking = true`")
    never.check(False, "smol")  # "off" is what it does anyway: clients send it to every model
    assert switchable.variables(False) == {"enable_thinking": False} and switchable.variables(None) == {}
    assert always.variables(False) == {}
    assert "no switch" in always.describe() and "enable_thinking" in switchable.describe()


# --- the real llama.cpp ----------------------------------------------------------------------------------------


def run_split(session: ChatSession, messages, *, think=None, stop=(), spec=SPEC, max_tokens=40):
    split = session.splitter(think)
    gen = session.answer(messages, sampling=GREEDY, spec=spec, max_tokens=max_tokens, stop=stop, think=think)
    for event in gen:
        split.feed(event, gen.stats)
    return gen, split


@pytest.mark.slow
def test_markers_come_from_the_vocabulary_or_the_template(thinking_models, tiny_models):
    with Engine.load(thinking_models.target, drafter="none", n_ctx=256) as engine:
        support = ChatFormat(engine.target_model).thinking
        assert (support.markers, support.found_in, support.switch) == (THINK, "vocabulary", "enable_thinking")
        assert support.reasoning_field  # Qwen3's template reads reasoning_content
    with Engine.load(thinking_models.split_markers, drafter="none", n_ctx=256) as engine:
        assert ChatFormat(engine.target_model).thinking.found_in == "template"
    with Engine.load(tiny_models.target, drafter="none", n_ctx=256) as engine:
        plain = ChatFormat(engine.target_model).thinking
        assert not plain.thinks and not plain.can_switch  # ChatML and a vocabulary without markers
        assert not ChatFormat(engine.target_model, "chatml").thinking.thinks


def test_qwen3s_real_template_switches_thinking(thinking_models):
    def render(**variables) -> str:
        return render_jinja_chat(
            qwen3_template(), [{"role": "user", "content": "Hi"}], bos="", eos="", variables=variables
        )

    assert render() == render(enable_thinking=True) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render(enable_thinking=False) == render() + "<think>\n\n</think>\n\n"
    with Engine.load(thinking_models.target, drafter="none", n_ctx=256) as engine:
        fmt, model = ChatFormat(engine.target_model), engine.target_model
        messages = [Message("user", "Hi")]
        default, on, off = (fmt.tokens(messages, think=t) for t in (None, True, False))
        assert default == on and off[: len(default)] == default
        start, end = (model.tokenize(m, parse_special=True)[0] for m in ("<think>", "</think>"))
        assert start in off[len(default) :] and end in off[len(default) :] and start not in default
        assert not fmt.opens_thinking(None) and not fmt.opens_thinking(False)


@pytest.mark.slow
def test_the_answer_streams_apart_from_its_thinking(thinking_models):
    with Engine.load(thinking_models.target, thinking_models.draft, n_ctx=512) as engine:
        session = ChatSession(engine)
        gen, split = run_split(session, [Message("user", "Hi")])
        assert gen.text == f"<think> {REASONING_TEXT}</think>\n\n {ANSWER_TEXT}"
        assert (split.reasoning, split.answer) == (REASONING_TEXT, ANSWER_TEXT)
        parts = split.parts()
        assert parts[THINKING].tokens == 11 and parts[ANSWER].tokens == len(gen.tokens) - 11  # markers: thinking
        assert sum(p.drafted for p in parts.values()) == gen.stats.drafted
        assert sum(p.accepted for p in parts.values()) == gen.stats.accepted
        assert sum(p.passes for p in parts.values()) == pytest.approx(gen.stats.target_passes)
        # the draft agrees on every thinking token and proposes another word after "Hello"
        assert parts[THINKING].acceptance_rate == 1.0 and parts[ANSWER].acceptance_rate < 1.0


def test_off_makes_the_model_skip_thinking(thinking_models):
    with Engine.load(thinking_models.target, thinking_models.draft, n_ctx=512) as engine:
        gen, split = run_split(ChatSession(engine), [Message("user", "Hi")], think=False)
        assert gen.text == f" {ANSWER_TEXT}"  # no <think> was generated: the template closed it in the prompt
        assert (split.reasoning, split.answer) == ("", ANSWER_TEXT) and split.parts()[THINKING].tokens == 0
        assert not split.thought


def test_markers_written_in_two_tokens_split_the_same(thinking_models):
    with Engine.load(thinking_models.split_markers, drafter="ngram", n_ctx=512) as engine:
        gen, split = run_split(ChatSession(engine), [Message("user", "Hi")])
        pieces = [engine.target_model.token_text(t) for t in gen.tokens]
        assert pieces[:2] == ["<thin", "k>"] and "</th" in pieces  # the markers really are two tokens each
        assert (split.reasoning, split.answer) == (REASONING_TEXT, ANSWER_TEXT)
        assert split.parts()[THINKING].tokens == 13  # 2 + 9 + 2


@pytest.mark.parametrize(
    ("stop", "reasoning", "answer"),
    [
        ("kind", "We must give them a", ""),  # inside the thinking
        ("world", REASONING_TEXT, "Hello "),  # inside the answer
        ("</think>!", REASONING_TEXT, ANSWER_TEXT),  # holds the end marker back for a token: released late
        ("ink>\n\n Hel", REASONING_TEXT + "</th", ""),  # the stop cut the marker: its start stays text
    ],
)
def test_stop_strings_do_not_confuse_the_split(thinking_models, stop, reasoning, answer):
    with Engine.load(thinking_models.split_markers, drafter="none", n_ctx=512) as engine:
        gen, split = run_split(ChatSession(engine), [Message("user", "Hi")], stop=[stop])
        assert (split.reasoning, split.answer) == (reasoning, answer)
        assert gen.finish_reason == "stop"


def test_a_prompt_that_opened_thinking(thinking_models):
    with Engine.load(thinking_models.opened, drafter="none", n_ctx=512) as engine:
        session = ChatSession(engine)
        assert session.format.opens_thinking(True) and not session.format.opens_thinking(None)
        gen, split = run_split(session, [Message("user", "Hi")], think=True)
        assert not gen.text.startswith("<think>")  # the template wrote the start marker, not the model
        assert (split.reasoning, split.answer) == (REASONING_TEXT, ANSWER_TEXT)


def test_history_follows_the_templates_rule(thinking_models):
    past = [Message("user", "Hi"), Message("assistant", ANSWER_TEXT, REASONING_TEXT), Message("user", "Again")]
    with Engine.load(thinking_models.target, drafter="none", n_ctx=512) as engine:  # Qwen3: past thinking goes
        rendered = engine.target_model.detokenize(ChatFormat(engine.target_model).tokens(past))
        assert ANSWER_TEXT in rendered and REASONING_TEXT not in rendered and "<think>" not in rendered
        # the last assistant turn after the last user message keeps it (Qwen3's rule), via reasoning_content
        kept = engine.target_model.detokenize(ChatFormat(engine.target_model).tokens(past[:2] + [past[1]]))
        assert in_order(kept, "<think>", REASONING_TEXT, "</think>", ANSWER_TEXT)
    with Engine.load(thinking_models.opened, drafter="none", n_ctx=512) as engine:  # R1: splits content at </think>
        rendered = engine.target_model.detokenize(ChatFormat(engine.target_model).tokens(past))
        assert ANSWER_TEXT in rendered and REASONING_TEXT not in rendered
    # a template without any rule (ChatML) keeps the thinking, between the markers
    with Engine.load(thinking_models.no_switch, drafter="none", n_ctx=512) as engine:
        fmt = ChatFormat(engine.target_model)
        assert fmt.template == CHATML_TEMPLATE and fmt.thinking.found_in == "vocabulary"
        tokens = fmt.tokens(past)
        rendered = engine.target_model.detokenize(tokens)
        assert in_order(rendered, "Hi", "<think>", REASONING_TEXT, "</think>", ANSWER_TEXT, "Again")
        assert engine.target_model.tokenize("<think>", parse_special=True)[0] in tokens  # the marker is its token


def test_a_marker_written_in_an_answer_stays_its_text(thinking_models):
    # Qwen3's template splits an assistant's content at "</think>": it must only ever see the marks, never the text.
    past = [Message("user", "Hi"), Message("assistant", "use </think> to end it"), Message("user", "ok")]
    with Engine.load(thinking_models.target, drafter="none", n_ctx=512) as engine:
        rendered = engine.target_model.detokenize(ChatFormat(engine.target_model).tokens(past))
        assert in_order(rendered, "use", "</think>", "to end it", "ok")


def test_dropped_thinking_rereads_only_the_changed_suffix(thinking_models):
    with Engine.load(thinking_models.target, thinking_models.draft, n_ctx=1024) as engine:
        session = ChatSession(engine)
        first = session.send("Hi", sampling=GREEDY, spec=SPEC, max_tokens=40)
        for _ in first:
            pass
        assert session.messages[-1] == Message("assistant", ANSWER_TEXT, REASONING_TEXT)
        cached_target, cached_draft = list(engine.target.tokens), list(engine.drafter.seq.tokens)
        second = session.send("Again", sampling=GREEDY, spec=SPEC, max_tokens=40)
        for _ in second:
            pass
        prompt = second.prompt
        reused = common_prefix(prompt, cached_target)
        # the caches part from the new prompt exactly where the dropped thinking was: after "assistant\n"
        assert (
            reused == len(first.prompt)
            and cached_target[reused] == engine.target_model.tokenize("<think>", parse_special=True)[0]
        )
        assert second.stats.prefill_decoded == len(prompt) - 1 - reused
        assert second.stats.draft_prefill_decoded == len(prompt) - 1 - common_prefix(prompt, cached_draft)
        rendered = engine.target_model.detokenize(prompt[reused:])
        assert in_order(rendered, ANSWER_TEXT, "Again") and "<think>" not in rendered  # no thinking re-read


def in_order(text: str, *parts: str) -> bool:
    """Whether `parts` all occur in `text`, one after the other."""
    at = 0
    for part in parts:
        at = text.find(part, at)
        if at < 0:
            return False
        at += len(part)
    return True


def test_one_function_owns_the_thinking_precedence_and_its_wording():
    switchable = ThinkingSupport(Markers("<think>", "</think>"), switch="enable_thinking")
    always = ThinkingSupport(Markers("<think>", "</think>"))
    request, flag = thinking_choice(True, "request"), thinking_choice(False, "flag")
    pair = thinking_choice(True, "pair", "qwen3")
    assert thinking_choice(None, "flag") is None
    assert choose_thinking(switchable, "m", None, flag, pair) is False  # --think wins over the pair
    assert choose_thinking(switchable, "m", request, flag, pair) is True  # the request's own over both
    assert choose_thinking(switchable, "m", pair, None, flag) is False  # THINK_SOURCES' order, not the arguments'
    assert choose_thinking(switchable, "m", pair, flag, request) is True
    assert choose_thinking(switchable, "m", None, None, None) is None  # the model decides
    assert choose_thinking(always, "m", None, None, pair) is True  # "on" for a model that always thinks
    with pytest.raises(InvalidParamsError, match=r"m always thinks: .* so --think off cannot be followed; remove it"):
        choose_thinking(always, "m", None, flag, pair)
    with pytest.raises(InvalidParamsError, match=r"so `thinking = false` of pair 'qwen3' in models.toml cannot be"):
        choose_thinking(always, "m", thinking_choice(False, "pair", "qwen3"))
    with pytest.raises(InvalidParamsError, match=r"n does not think .* so serve --think on cannot be followed"):
        choose_thinking(ThinkingSupport(), "n", thinking_choice(True, "serve"))
    assert request.setting == "chat_template_kwargs.enable_thinking = true"
