"""The chat app's pieces that need no terminal: settings parsing, the stats panel text, the streaming loop."""

from __future__ import annotations

import logging

import pytest

from localspec.core.engine import Engine
from localspec.core.params import PairDefaults, SpeculativeParams
from localspec.core.sampling import SamplingParams
from localspec.core.session import ChatSession
from localspec.core.stats import Decision, Stats
from localspec.errors import InvalidParamsError
from localspec.tui.live import Chunk, Finished, RateMeter, StatsView, add_run, stream_generation
from localspec.tui.settings import ChatOptions, ChatSettings
from localspec.tui.widgets import answer_caption, code_blocks, render_stats


def test_settings_from_flags_over_pair_defaults():
    options = ChatOptions(overrides={"temperature": 0.3, "draft_max": 4}, max_tokens=99)
    settings = ChatSettings.initial(options, PairDefaults(temperature=0.7, top_k=20), "model")
    assert settings.sampling.temperature == 0.3 and settings.sampling.top_k == 20
    assert settings.spec.draft_max == 4 and settings.max_tokens == 99 and settings.drafter == "model"


def test_settings_form_round_trip_and_one_line_errors():
    settings = ChatSettings()
    values = settings.form_values()
    assert settings.with_values(values) == settings
    changed = settings.with_values({**values, "temperature": "0", "adaptive": "off", "drafter": "ngram"})
    assert changed.sampling.greedy and not changed.spec.adaptive and changed.drafter == "ngram"
    with pytest.raises(InvalidParamsError, match="top-p must be a number, not 'x'"):
        settings.with_values({**values, "top_p": "x"})
    with pytest.raises(InvalidParamsError, match="top-p must be in"):
        settings.with_values({**values, "top_p": "2"})
    with pytest.raises(InvalidParamsError, match="max tokens must be at least 1"):
        settings.with_values({**values, "max_tokens": "0"})


def test_stats_panel_names_acceptance_and_tok_s():
    turn = Stats(
        drafted=10,
        accepted=7,
        rejections=2,
        target_passes=4,
        emitted=11,
        drafted_by_position=[4, 4, 2],
        accepted_by_position=[4, 2, 1],
        draft_length=3,
        seconds=2.0,
        seconds_prefill=1.0,
        seconds_draft=0.2,
        seconds_verify=0.6,
        seconds_sampling=0.2,
    )
    text = render_stats(
        StatsView(turn=turn, session=turn, turns=1, tokens_per_second_turn=11.0, draft_max=8, provenance=True)
    ).plain
    assert "acceptance    70% (7/10)" in text and "tok/s turn    11.0" in text
    assert "tokens/pass   2.75" in text and "on, draft length 3" in text
    assert "  1 ████████████ 100%" in text and "  3 ██████░░░░░░  50%" in text
    assert "verify ███████░░░░░  60%" in text and "draft token" in text
    idle = render_stats(StatsView(drafter="none", drafts=False)).plain
    assert "off (no drafter)" in idle and "nothing drafted yet" in idle and "no answers yet" in idle
    off = Stats(target_passes=3, emitted=3, speculation_off="adaptive: plain decoding is faster")
    shown = render_stats(StatsView(turn=off, draft_max=8)).plain
    assert "speculation   off\n  adaptive: plain decoding is faster\n" in shown
    assert "speed-up" not in shown  # no decision taken yet: no numbers to show


def test_stats_panel_shows_what_the_policy_decides_from():
    turn = Stats(
        drafted=8,
        accepted=6,
        rejections=2,
        target_passes=4,
        emitted=10,
        draft_length=3,
        decision=Decision(draft_cost=0.31, verify_cost=1.42, alpha=0.93, predicted_speedup=2.1, measured_speedup=1.87),
    )
    text = render_stats(StatsView(turn=turn, draft_max=8, adaptive=True)).plain
    assert "c · v(k) · α̂  0.31 · 1.42 · 0.93" in text
    assert "speed-up      2.10× pred, 1.87× real" in text


def test_rate_meter_and_runs():
    meter = RateMeter(window=1.0)
    assert meter.update(0.0, 0) == 0.0
    assert meter.update(0.5, 10) == pytest.approx(20.0)
    assert meter.update(3.0, 40) == pytest.approx(30 / 2.5)
    runs: list = []
    for text, from_draft in (("a", True), ("b", True), ("", False), ("c", False), ("d", True)):
        add_run(runs, text, from_draft)
    assert runs == [("ab", True), ("c", False), ("d", True)]


def test_caption_and_code_blocks():
    assert answer_caption(
        {"drafted": 4, "acceptance_rate": 0.5, "mean_tokens_per_pass": 2.0, "emitted": 8, "tokens_per_second": 12.25},
        "cancelled",
    ) == ("stopped · acceptance 50% · 2.00 tokens/pass · 12.2 tok/s")
    assert answer_caption(None, "length") == "cut at max tokens"
    text = "x\n\n```py\na = 1\n```\n\n    indented\n\n```\nb\n```\n"
    assert code_blocks(text) == ["a = 1\n", "indented\n", "b\n"]


@pytest.mark.slow
def test_stream_batches_tokens_and_keeps_provenance(tiny_models):
    clock_ticks = iter(range(10_000))
    chunks: list[Chunk] = []
    done: list[Finished] = []
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512) as engine:
        generation = ChatSession(engine).send(
            "Hello", sampling=SamplingParams(temperature=0.0), spec=SpeculativeParams(adaptive=False), max_tokens=60
        )
        taken = {"ready": True}

        def emit(item):
            (chunks if isinstance(item, Chunk) else done).append(item)
            taken["ready"] = len(chunks) % 2 == 0  # the UI "takes" every other chunk late

        stream_generation(
            generation, emit, ready=lambda: taken["ready"], interval=5, clock=lambda: float(next(clock_ticks))
        )
    [finished] = done
    assert chunks and len(chunks) < 60
    assert finished.text.startswith("".join(text for c in chunks for text, _ in c.runs))
    assert "".join(text for text, _ in finished.runs) == finished.text == generation.text
    assert any(d for _, d in finished.runs) and any(not d for _, d in finished.runs)
    assert finished.finish_reason == "length" and finished.stats.emitted == 60 and finished.error is None
    assert chunks[-1].stats.emitted < 60  # snapshots, not the live object


def test_a_worker_error_is_one_line_and_a_bug_points_to_the_log(localspec_home, caplog):
    from localspec.errors import ModelFileError
    from localspec.tui.failure import error_text

    assert error_text(ModelFileError("target.gguf is not a GGUF file"), "loading") == "target.gguf is not a GGUF file"
    logger = logging.getLogger("localspec")  # `main()` may have set it not to propagate to caplog's root handler
    logger.addHandler(caplog.handler)
    try:
        raise KeyError("n_vocab")
    except KeyError as e:
        text = error_text(e, "loading")
    finally:
        logger.removeHandler(caplog.handler)
    assert text == f"loading failed unexpectedly: 'n_vocab' (details in {localspec_home.log_file})"
    assert "\n" not in text
    assert caplog.records[-1].exc_info is not None  # the traceback goes to the log, not the screen
