"""The `mtp` drafter on a real tiny qwen35 GGUF with one MTP block (support.tinymodels.write_mtp_model).

The head drafts through the same loop as every drafter: greedy equals the target alone (divergences only at a
near-tie, DESIGN §6), T = 1 samples the target's law (T3, with a broken kernel as the negative control), the head's
cache follows the target's through prefix reuse, checkpoint rollbacks of the hybrid target and an interrupt, and a
llama-cpp-python without the staging calls drafts with n-grams after one line.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from support import PROMPT, assert_identical, run_greedy
from support.lawcheck import drafted_accepted, expected_tv, law_of_runs
from support.tinymodels import write_llama_model, write_mtp_model

from localspec.cli.main import main
from localspec.core.drafters import DraftRequest
from localspec.core.engine import Engine
from localspec.core.head import MtpDrafter
from localspec.core.sampling import SamplingParams
from localspec.errors import ContextError, InvalidParamsError
from localspec.llama import mtp
from localspec.llama.context import Context
from localspec.llama.model import Model

N_CTX = 256
THREADS = 1  # these tiny models decode slower on two threads when the cores are shared


@pytest.fixture(scope="module")
def mtp_path(tmp_path_factory):
    """tiny-mtp.gguf: 2 trunk layers (gated delta net, then full attention) and one MTP block."""
    return write_mtp_model(tmp_path_factory.mktemp("mtp") / "tiny-mtp.gguf", seed=1, output_scale=0.4)


def load(path, drafter: str = "mtp") -> Engine:
    return Engine.load(path, None, drafter=drafter, n_ctx=N_CTX, n_threads=THREADS)


def test_the_tiny_model_carries_a_head_that_decodes_a_full_row(mtp_path):
    with Model(mtp_path, load_mtp=True) as model:
        assert model.n_layer_nextn == 1 and model.info.arch == "qwen35" and model.info.is_hybrid
        target = Context(model, n_ctx=64)
        head = mtp.HeadContext(model, n_ctx=64)
        try:
            mtp.emit_hidden(target)
            tokens = model.tokenize("the man said what the", add_special=True)
            target.decode(tokens, 0, outputs=len(tokens))
            trunk = target.logits_block(len(tokens)).argmax(axis=1)  # (n,) the target's next tokens
            rows = mtp.hidden_rows(target, len(tokens))  # (n, n_embd)
            head.stage(np.vstack([np.zeros_like(rows[:1]), rows[:-1]]), 0)  # position p reads row p - 1
            head.decode(tokens, 0, outputs=len(tokens))
            drafts = head.logits_block(len(tokens))
            assert drafts.shape == (len(tokens), model.n_vocab)
            agree = np.mean(drafts.argmax(axis=1)[1:] == trunk[1:])
            assert 0 < agree < 1  # a head that agrees often, not always: both verify branches happen
        finally:
            head.close()
            target.close()


def test_greedy_with_the_head_equals_the_target_alone(mtp_path):
    with load(mtp_path) as engine:
        assert engine.drafter.kind == "mtp"
        prompt = engine.tokenize(PROMPT)
        plain = run_greedy(engine, prompt, k=0, n=120)
        spec = run_greedy(engine, prompt, k=3, n=120)
    assert spec.stats.drafted > 0 and 0 < spec.stats.accepted < spec.stats.drafted
    assert spec.stats.target_passes < plain.stats.target_passes
    assert_identical(mtp_path, prompt, plain.tokens, spec.tokens)


def test_the_head_is_chosen_when_the_target_has_one(mtp_path, tiny_models):
    with load(mtp_path, "auto") as engine:
        assert engine.drafter.kind == "mtp"
    for refused in ("none", "ngram"):
        with load(mtp_path, refused) as engine:
            assert engine.drafter.kind == refused
    with load(tiny_models.target, "auto") as engine:  # no head: plain decoding, as before
        assert engine.drafter.kind == "none"
    with pytest.raises(InvalidParamsError, match="has no MTP"):
        load(tiny_models.target, "mtp")


def test_without_the_staging_calls_it_drafts_with_ngrams(mtp_path, monkeypatch, caplog, capsys, localspec_home):
    monkeypatch.setattr(mtp, "mtp_calls", lambda: "llama_get_embeddings_nextn")
    with caplog.at_level(logging.WARNING), load(mtp_path) as engine:
        assert engine.drafter.kind == "ngram"
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("localspec.core")]
    assert lines == ["this llama-cpp-python has no MTP calls: drafting with n-grams"]
    repeat = "the man said what the man said what the man said what the man"
    args = ["generate", repeat, "--target", str(mtp_path), "--temperature", "0", "--max-tokens", "24", "--json"]
    assert main([*args, "--draft-max", "3", "--no-adaptive", "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    run = json.loads(out.splitlines()[-1])
    assert run["drafter"] == "ngram" and run["stats"]["drafted"] > 0
    assert err.splitlines()[0] == "localspec: note: this llama-cpp-python has no MTP calls: drafting with n-grams"


def fresh_proposal(path, history: list[int], k: int = 4) -> tuple[list[int], np.ndarray]:
    """What a head fed from scratch drafts after `history`, and its first row's logits."""
    with load(path) as engine:
        engine.target.sync(history[:-1])
        engine.drafter.prefill(history)
        return propose(engine, history, k)


def propose(engine: Engine, history: list[int], k: int = 4) -> tuple[list[int], np.ndarray]:
    drafter: MtpDrafter = engine.drafter
    seen = []
    real = drafter.head.ctx.logits

    def first_row(i):
        row = real(i)
        if not seen:
            seen.append(row.copy())
        return row

    drafter.head.ctx.logits = first_row
    try:
        greedy, rng = SamplingParams(temperature=0), np.random.default_rng(0)
        request = DraftRequest(history=history, k=k, sampling=greedy, pq=False, p_min=0.0, rng=rng)
        out = drafter.propose(request)
    finally:
        del drafter.head.ctx.logits
    return out.tokens, seen[0]


def test_the_head_follows_the_target_through_prefix_reuse_and_rollbacks(mtp_path):
    """After two generations that share a prefix (the hybrid target rolls back by its snapshots, then re-reads the
    second prompt), the running head drafts what a head fed from scratch drafts after the same history."""
    with load(mtp_path) as engine:
        assert engine.target.mode == "snapshot"  # the hybrid target drops a rejected tail with its snapshots
        first = engine.tokenize(PROMPT)
        gen = run_greedy(engine, first, k=3, n=40)
        second = first + gen.tokens[:20] + engine.tokenize(" the man", add_special=False)
        gen2 = run_greedy(engine, second, k=3, n=30)
        history = second + gen2.tokens
        assert engine.drafter.n_fed == engine.target.n_past == len(history) - 1
        running, row = propose(engine, history)
        engine.check_invariants()
    fresh, fresh_row = fresh_proposal(mtp_path, history)
    assert running == fresh
    assert np.abs(row - fresh_row).max() < 1e-3


def test_a_head_fed_a_wrong_row_drafts_otherwise(mtp_path, monkeypatch):
    """The negative control of the test above: the same comparison sees a head that read one stale row."""
    with load(mtp_path) as engine:
        history = engine.tokenize(PROMPT) + engine.tokenize(" the man said what the", add_special=False)
    good, good_row = fresh_proposal(mtp_path, history)
    real = MtpDrafter._row

    def stale(self, pos):
        row = real(self, pos)
        return None if row is None else (row if pos != len(history) - 2 else np.roll(row, 7))

    monkeypatch.setattr(MtpDrafter, "_row", stale)
    bad, bad_row = fresh_proposal(mtp_path, history)
    assert np.abs(good_row - bad_row).max() > 1e-2


def test_an_interrupt_inside_the_head_leaves_both_caches_consistent(mtp_path, monkeypatch):
    with load(mtp_path) as engine:
        prompt = engine.tokenize(PROMPT)
        plain = run_greedy(engine, prompt, k=0, n=40)
        calls, real = [0], mtp.HeadContext._submit

        def interrupted(self, tokens, n_past, first_out):
            calls[0] += 1
            if calls[0] == 25:
                raise KeyboardInterrupt
            return real(self, tokens, n_past, first_out)

        monkeypatch.setattr(mtp.HeadContext, "_submit", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run_greedy(engine, prompt, k=3, n=40)
        engine.check_invariants()  # repaired: each cache holds exactly its tokens
        again = run_greedy(engine, prompt, k=3, n=40)
    assert calls[0] > 25 and again.stats.drafted > 0
    assert_identical(mtp_path, prompt, plain.tokens, again.tokens)


def test_generate_speculates_with_the_head_and_prints_the_plain_text(mtp_path, capsys, localspec_home):
    """`localspec generate --target tiny-mtp.gguf`: no --draft, no --drafter — the head drafts, same greedy text."""
    texts = {}
    for flags in ([], ["--drafter", "none"]):
        args = ["generate", PROMPT, "--target", str(mtp_path), "--temperature", "0", "--max-tokens", "60"]
        code = main([*args, "--draft-max", "3", "--no-adaptive", "--threads", "1", "--json", *flags])
        out = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert code == 0
        texts[tuple(flags)] = out
    head, plain = texts[()], texts[("--drafter", "none")]
    assert head["stats"]["drafted"] > 0 and head["stats"]["accepted"] > 0 and head["drafter"] == "mtp"
    assert plain["stats"]["drafted"] == 0 and plain["drafter"] == "none"
    assert head["text"] == plain["text"]


# --- T3 through the head: T = 1, top-k 4, the first three tokens' law (tests/core/test_real_law.py's reference) ---

LAW_RUNS = 4000


@pytest.fixture(scope="module")
def reference(mtp_path):
    from core.test_real_law import Reference

    return Reference(mtp_path)


def sample_law(mtp_path, reference, capsys):
    from core.test_real_law import PROMPT as LAW_PROMPT
    from core.test_real_law import TOP_K

    args = ["generate", LAW_PROMPT, "--target", str(mtp_path), "--drafter", "mtp", "--draft-max", "2"]
    args += ["--no-adaptive", "--verify", "pq", "--temperature", "1", "--top-k", str(TOP_K), "--top-p", "1"]
    args += ["--min-p", "0", "--max-tokens", "3", "--n", str(LAW_RUNS), "--seed", "5", "--n-ctx", "64"]
    code = main([*args, "--threads", "1", "--json"])
    runs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and len(runs) == LAW_RUNS
    return law_of_runs(runs, reference), *drafted_accepted(runs)


@pytest.mark.slow
def test_the_head_at_t1_samples_the_target_law(mtp_path, reference, capsys, localspec_home):
    verdict, drafted, accepted = sample_law(mtp_path, reference, capsys)
    assert verdict.ok, verdict
    assert verdict.tv < 1.5 * expected_tv(reference.probs, LAW_RUNS), verdict
    assert 0 < accepted < drafted  # both the accept and the reject path produced tokens


@pytest.mark.slow
def test_a_broken_kernel_on_the_head_fails_the_law(mtp_path, reference, capsys, localspec_home, monkeypatch):
    from support.lawcheck import broken_pq

    monkeypatch.setattr("localspec.core.step.verify_pq", broken_pq)
    verdict, *_ = sample_law(mtp_path, reference, capsys)
    assert not verdict.ok, verdict


def test_a_target_without_a_head_file_is_refused_in_one_line(tmp_path, capsys, localspec_home):
    plain = write_llama_model(tmp_path / "plain.gguf")
    code = main(["generate", "hi", "--target", str(plain), "--drafter", "mtp", "--max-tokens", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "has no MTP" in err[0], err


def test_models_and_doctor_name_the_head(mtp_path, tiny_models, localspec_home, capsys, monkeypatch):
    """`models` says a pair's target can draft for itself; `doctor` says whether this build can run heads."""
    from localspec.cli.doctor import _compute_findings

    localspec_home.config_file.parent.mkdir(parents=True, exist_ok=True)
    localspec_home.config_file.write_text(
        'default = "mtp"\n[pairs.mtp]\ndescription = "tiny qwen35 with a head"\n'
        f'target = {{ path = "{mtp_path}" }}\ndraft = {{ path = "{tiny_models.draft_noisy}" }}\n',
        encoding="utf-8",
    )
    assert main(["models", "--json"]) == 0
    [row] = [r for r in json.loads(capsys.readouterr().out) if r["name"] == "mtp"]
    assert row["mtp_layers"] == 1
    assert main(["models"]) == 0
    assert "head    1 MTP layer in the target: it can draft for itself (--drafter mtp)" in capsys.readouterr().out
    heads = {f.label: f.value for f in _compute_findings()}["MTP draft heads"]
    assert heads.startswith("yes")
    monkeypatch.setattr(mtp, "mtp_calls", lambda: "llama_get_embeddings_nextn")
    heads = {f.label: f.value for f in _compute_findings()}["MTP draft heads"]
    assert heads == "no (llama_get_embeddings_nextn): such targets draft with n-grams"


def test_bench_runs_the_head_against_plain(mtp_path, capsys, localspec_home):
    args = ["bench", "--target", str(mtp_path), "--drafter", "mtp", "--k", "2", "--temperature", "0"]
    assert main([*args, "--tokens", "16", "--rounds", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "draft:  the target MTP head (--drafter mtp)" in out
    [row] = [line.split() for line in out.splitlines() if line.startswith("k=2 ")]
    assert float(row[4].rstrip("%")) > 0  # the head's drafts were accepted
    code = main(["bench", "--target", str(mtp_path), "--k", "2", "--tokens", "4"])  # no head asked, no draft: refused
    assert code != 0 and "--drafter mtp" in capsys.readouterr().err


def test_a_long_chat_past_the_context_keeps_the_head_with_the_target(mtp_path):
    """Turns past a full context: the hybrid target cannot shift, so the oldest turns go and the rest is re-read;
    the head follows (each cache holds the fresh rendering) and every answer is the plain one."""
    from core.test_long_chat import SPEC, chat

    from localspec.core.session import ChatSession

    with load(mtp_path) as engine, load(mtp_path, "none") as plain:
        session, reference = ChatSession(engine, system="Be brief."), ChatSession(plain, system="Be brief.")
        gens, refs = chat(session, range(14), spec=SPEC), chat(reference, range(14), spec=SPEC)
        assert any(g.notices for g in gens)  # the window was cut at least once
        assert sum(g.stats.accepted for g in gens) > 0
        for gen, ref in zip(gens, refs, strict=True):
            assert_identical(mtp_path, ref.prompt, ref.tokens, gen.tokens)
        assert engine.drafter.n_fed == engine.target.n_past


def test_a_head_llama_cpp_cannot_run_falls_back_in_one_line(mtp_path, monkeypatch):
    """llama.cpp aborts the process on a head it cannot build (several blocks where it runs one): we ask first.
    A head context that llama.cpp refuses falls back the same way."""
    assert mtp.head_problem("qwen35", 1) == "" and mtp.head_problem("mimo2", 3) == ""
    assert mtp.head_problem("qwen35", 2) == "this llama.cpp runs a single MTP block of qwen35, and the file has 2"
    assert mtp.head_problem("llama", 1) == "this llama.cpp has no MTP graph for llama"
    monkeypatch.setattr(mtp, "head_problem", lambda arch, n: f"this llama.cpp runs a single MTP block of {arch}")
    with load(mtp_path) as engine:
        assert engine.drafter.kind == "ngram"
        assert engine.drafting_note == "this llama.cpp runs a single MTP block of qwen35: drafting with n-grams"
    monkeypatch.undo()

    def refused(*args, **kwargs):
        raise ContextError("could not create a context")

    monkeypatch.setattr(mtp.HeadContext, "__init__", refused)
    with load(mtp_path) as engine:
        assert engine.drafter.kind == "ngram"
        assert engine.drafting_note == "the MTP head could not start: drafting with n-grams"
