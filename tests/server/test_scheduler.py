"""The scheduler of `serve --parallel` in-process (the real `Runner` on the tiny pair, two slots): a long prompt is
read a chunk per tick while another request answers, and the answering stream still takes its row from the shared
batch — it steps before the chunk's decode replaces the context's logits, whatever order the requests came in."""

from __future__ import annotations

from localspec.models.flags import RunFlags
from localspec.server.request import PROMPT_CHUNK, Started, Token
from localspec.server.request import Request as ServerRequest
from localspec.server.runner import Runner


def test_a_long_prompt_is_read_a_chunk_per_step_while_another_answers(chat_home):
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
        a.result(120)
        b.result(120)
    finally:
        runner.close()
    who = [w for w, _ in events]
    start, first = who.index("B started"), who.index("B")
    between = [decodes for w, decodes in events[start:first] if w == "A"]
    chunks = (n_prompt - 1) // PROMPT_CHUNK - (1 if (n_prompt - 1) % PROMPT_CHUNK == 0 else 0)
    assert len(between) >= chunks - 1, who[start : first + 1]  # A answered while B's prompt was read
    # each tick after A's first (its prompt read alone): A's row in the shared batch, then B's chunk — two decodes,
    # not A's own decode as well (three, when B stepped first)
    steps = [later - earlier for earlier, later in zip(between, between[1:], strict=False)]
    assert steps[1:] and set(steps[1:]) == {2}, steps
    assert who.count("A") == 300 and who.count("B") == 4


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
