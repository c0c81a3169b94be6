"""The scheduler of `serve --parallel` in-process (the real `Runner` on the tiny pair, two slots): a long prompt is
read a chunk per tick while another request answers, and the answering stream still takes its row from the shared
batch — it steps before the chunk's decode replaces the context's logits, whatever order the requests came in."""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from types import SimpleNamespace

from localspec.core.slots import SlotPool
from localspec.errors import NoRoomError
from localspec.models.flags import RunFlags
from localspec.server.request import PROMPT_CHUNK, Started, Token
from localspec.server.request import Request as ServerRequest
from localspec.server.runner import Runner
from localspec.server.scheduler import PASS_WAITS, Entry, Scheduler


def test_a_long_prompt_is_read_a_chunk_per_step_while_another_answers(chat_home):
    """Each part of B's prompt is read in the same batch as A's next row (one decode a tick, no logits for the
    prompt's rows; it was two: A's row, then B's part by a decode of its own), and both answer as they do alone."""
    runner = Runner(RunFlags(pair="tiny", drafter="none"), chat_home, parallel=2)
    try:
        served = runner.start()
        ctx = served.engine.target.ctx
        events: list[tuple[str, int]] = []  # (who, the target context's decodes so far), in order

        def recorder(who: str):
            def emit(event) -> None:
                if isinstance(event, Started):
                    events.append((f"{who} started", ctx.decodes))
                elif isinstance(event, Token):
                    events.append((who, ctx.decodes))

            return emit

        long_prompt = " ".join(["the man said that the water was hot and"] * 120)
        n_prompt = len(served.engine.tokenize(long_prompt))
        assert n_prompt > 3 * PROMPT_CHUNK
        # B first: it steps before A in arrival order, and A's row must still be taken before B's chunk is decoded
        _, b = runner.submit(ServerRequest(None, long_prompt, max_tokens=4), recorder("B"))
        _, a = runner.submit(ServerRequest(None, "water was the man", max_tokens=300), recorder("A"))
        beside = [a.result(120).generations[0].tokens, b.result(120).generations[0].tokens]
    finally:
        runner.close()
    runner = Runner(RunFlags(pair="tiny", drafter="none"), chat_home, parallel=1)
    try:
        runner.start()
        alone = [
            runner.submit(ServerRequest(None, prompt, max_tokens=n))[1].result(120).generations[0].tokens
            for prompt, n in (("water was the man", 300), (long_prompt, 4))
        ]
    finally:
        runner.close()
    assert beside == alone
    who = [w for w, _ in events]
    start, first = who.index("B started"), who.index("B")
    between = [decodes for w, decodes in events[start:first] if w == "A"]
    chunks = (n_prompt - 1) // PROMPT_CHUNK - (1 if (n_prompt - 1) % PROMPT_CHUNK == 0 else 0)
    assert len(between) >= chunks - 1, who[start : first + 1]  # A answered while B's prompt was read
    # each tick after A's first (its prompt read alone): A's row and B's part of its prompt in ONE decode — not A's
    # row, then B's part on its own (two), nor A's own decode as well (three, when B stepped first)
    steps = [later - earlier for earlier, later in zip(between, between[1:], strict=False)]
    assert steps[1:] and set(steps[1:]) == {1}, steps
    assert who.count("A") == 300 and who.count("B") == 4


def test_an_answer_beside_a_prompt_being_read_drafts_as_alone(chat_home, monkeypatch):
    """While only B's long prompt is read beside it, A is its ticks' one stream: each such tick's one decode holds
    B's part and A's row with the drafts of its own fixed k, drafted as alone (it was planned as a stream of a shared
    batch); both answer as alone."""
    ticks = []  # (the tick's one stream, parts of prompts in it, rows it decoded)
    begin = SlotPool.begin

    def recorded(pool, streams, running=None):
        rows = begin(pool, streams, running)
        ticks.append((pool.tick.solo, pool.tick.reads, rows))
        return rows

    monkeypatch.setattr(SlotPool, "begin", recorded)
    fixed = {"draft_max": 4, "adaptive": False}
    long_prompt = " ".join(["the man said that the water was hot and"] * 120)
    runner = Runner(RunFlags(pair="tiny", drafter="model"), chat_home, parallel=2)
    try:
        runner.start()
        _, b = runner.submit(ServerRequest(None, long_prompt, max_tokens=1))
        _, a = runner.submit(ServerRequest(None, "water was the man", max_tokens=48, overrides=fixed))
        beside = a.result(120).generations[0]
        b.result(120)
    finally:
        runner.close()
    runner = Runner(RunFlags(pair="tiny", drafter="model"), chat_home, parallel=1)
    try:
        runner.start()
        alone = runner.submit(ServerRequest(None, "water was the man", max_tokens=48, overrides=fixed))[1].result(120)
    finally:
        runner.close()
    assert beside.tokens == alone.generations[0].tokens
    read_beside = [(solo, rows) for solo, reads, rows in ticks if reads and solo is not None]
    assert len(read_beside) >= 2 and all(solo is beside for solo, _ in read_beside)
    assert {rows - PROMPT_CHUNK for _, rows in read_beside} == {1 + fixed["draft_max"]}  # its row and its own k


def test_automatic_slots_are_four_where_the_target_shares_and_one_where_it_cannot(chat_home, tiny_models):
    """`serve --parallel auto` (the default): four slots for a KV-cache target, each request answered as with one
    slot; a recurrent target takes one, says why, and its requests run one at a time on the engine's own cache."""
    runner = Runner(RunFlags(pair="tiny", drafter="none"), chat_home, parallel=0)
    try:
        served = runner.start()
        assert runner.parallel == 4 and served.engine.target.ctx.n_seq == 4 and not served.engine.slots_note
        futures = [runner.submit(ServerRequest(None, "the water was", max_tokens=8))[1] for _ in range(3)]
        texts = {f.result(120).generations[0].text for f in futures}
        assert len(texts) == 1  # greedy, the same prompt: the same answer in every slot
    finally:
        runner.close()
    runner = Runner(RunFlags(target=str(tiny_models.recurrent), drafter="none"), chat_home, parallel=0)
    try:
        served = runner.start()
        assert runner.parallel == 1 and served.engine.target.ctx.n_seq == 1
        assert "recurrent" in served.engine.slots_note
        futures = [runner.submit(ServerRequest(None, "the water was", max_tokens=8))[1] for _ in range(2)]
        outcomes = [f.result(120) for f in futures]
        assert all(o.generations[0].stats.emitted == 8 for o in outcomes)
    finally:
        runner.close()


def test_a_prompt_with_no_room_beside_a_running_request_waits_for_it_to_end(chat_home):
    """One pool of 256 cells for two slots: B's prompt arrives while A's long prompt and answer hold the cells it
    needs. B is not refused (it was a 503 `kv_full`): it waits at the head of the queue until A ends, then reads its
    prompt and answers as it does alone; A answers whole."""
    runner = Runner(RunFlags(pair="tiny", drafter="none", n_ctx=256), chat_home, parallel=2)
    try:
        served = runner.start()
        words = "the man said that the water was hot and".split()
        long_prompt, other_prompt = " ".join(words * 22), " ".join(reversed(words * 11))
        n_long, n_other = len(served.engine.tokenize(long_prompt)), len(served.engine.tokenize(other_prompt))
        assert n_long + 40 <= 256 < n_long + n_other  # each fits alone, not beside the other
        alone = runner.submit(ServerRequest(None, other_prompt, max_tokens=8))[1].result(120)
        order: list[str] = []
        a_answers = threading.Event()

        def emit_a(event) -> None:
            if isinstance(event, Token):
                order.append("A")
                a_answers.set()

        def emit_b(event) -> None:
            if isinstance(event, Token):
                order.append("B")

        _, a = runner.submit(ServerRequest(None, long_prompt, max_tokens=40), emit_a)
        assert a_answers.wait(120)
        _, b = runner.submit(ServerRequest(None, other_prompt, max_tokens=8), emit_b)
        first, second = a.result(120), b.result(120)
    finally:
        runner.close()
    assert first.generations[0].stats.emitted == 40 and first.generations[0].finish_reason == "length"
    assert second.generations[0].tokens == alone.generations[0].tokens  # as alone, once A ended
    assert order == ["A"] * order.count("A") + ["B"] * order.count("B"), order  # B's first token after A's last


def _entry(order: int, room_after: int | None = None, waits: int = 0) -> Entry:
    job = SimpleNamespace(cancelled=False, generation=None)
    return Entry(job, None, lambda _: None, None, Future(), room_after=room_after, waits=waits, order=order)


def test_requests_pass_a_prompt_waiting_for_room_for_its_first_waits_then_wait_behind_it():
    """The queue's order (pure logic, no model): B's prompt waits for room beside the running A; C, which never waited,
    passes it while B has waited at most PASS_WAITS times, then waits behind it; once a request ends, B goes first.
    A request that passed and found no room either waits behind B and ahead of those that never waited."""
    scheduler = Scheduler(None, 3)  # type: ignore[arg-type]  # the queue's rules need no runner
    a, b, c = _entry(1), _entry(2, room_after=0, waits=1), _entry(3)
    scheduler._active, scheduler._waiting = [a], deque([b, c])
    assert not scheduler._may_start(b) and scheduler._may_start(c)  # B waits for A; C passes it
    b.waits = PASS_WAITS + 1
    assert not scheduler._may_start(c)  # B has waited long enough: C waits behind it
    scheduler._ended = 1  # a request ended: B starts again first
    assert scheduler._may_start(b) and not scheduler._may_start(c)
    scheduler._ended, b.waits = 0, 1
    d = _entry(4)
    scheduler._active = [a, d]  # D passed B, then found no room either
    assert scheduler._wait_for_room(d, NoRoomError("full"))
    assert list(scheduler._waiting) == [b, d, c] and d.room_after == 0 and d.waits == 1
    scheduler._active = [a, _entry(5), _entry(6)]  # every slot busy: nobody starts
    assert not any(scheduler._may_start(e) for e in scheduler._waiting)


def test_a_short_request_passes_a_prompt_waiting_for_room(chat_home):
    """One pool of 256 cells, three slots: B's prompt arrives beside A's long prompt and answer and waits for room; C,
    short, arriving after it, fits beside A: it passes B and answers while A still runs (it waited for A before). B
    answers as alone once A ends; A answers whole. (B and C are sent from A's stream, at its 2nd and 12th tokens, so
    B surely waits when C arrives.)"""
    runner = Runner(RunFlags(pair="tiny", drafter="none", n_ctx=256), chat_home, parallel=3)
    try:
        served = runner.start()
        words = "the man said that the water was hot and".split()
        long_prompt, other_prompt, short = " ".join(words * 20), " ".join(reversed(words * 11)), "water was the man"
        n_long, n_other, n_short = (len(served.engine.tokenize(p)) for p in (long_prompt, other_prompt, short))
        assert n_long + 40 + n_short + 4 <= 256 < n_long + n_other  # C fits beside A; B does not
        alone = runner.submit(ServerRequest(None, other_prompt, max_tokens=8))[1].result(120)
        order: list[str] = []
        sent: dict[str, Future] = {}

        def emit(who: str):
            def on(event) -> None:
                if not isinstance(event, Token):
                    return
                order.append(who)
                if who == "A" and order.count("A") in (2, 12):
                    late, prompt, n = ("B", other_prompt, 8) if order.count("A") == 2 else ("C", short, 4)
                    sent[late] = runner.submit(ServerRequest(None, prompt, max_tokens=n), emit(late))[1]

            return on

        _, a = runner.submit(ServerRequest(None, long_prompt, max_tokens=40), emit("A"))
        first, second, third = a.result(120), sent["B"].result(120), sent["C"].result(120)
    finally:
        runner.close()
    assert first.generations[0].stats.emitted == 40 and third.generations[0].stats.emitted == 4
    last_a = len(order) - 1 - order[::-1].index("A")
    assert order.count("C") == 4 and order.index("C") < last_a, order  # C passed B: it answered while A ran
    assert order.index("B") > last_a, order  # B's first token after A's last
    assert second.generations[0].tokens == alone.generations[0].tokens
