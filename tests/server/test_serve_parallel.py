"""`localspec serve --parallel N` end to end: real `openai` clients at once against the real server on the tiny pair.

Greedy answers are the same alone (a lone stream speculates) and in a shared batch (their tokens decoded together in
one batch, plainly); each stream keeps its own max_tokens; a client that leaves gives its slot back; the queue stays
bounded; /health shows the slots busy.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from support.server import WAIT, error_of, raw, start_server, write_home

from localspec.cli.main import main

PROMPTS = [
    "the man said that the water was hot and",
    "water was the man",
    "hot hot said the",
    "and the man and the water and",
]


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    home = write_home(
        tmp_path_factory.mktemp("parallel-home"), tiny_models.target, tiny_models.draft_noisy, tiny_models.draft_same
    )
    running = start_server(home, "--pair", "tiny", "--parallel", "3", "--queue", "4")
    yield running
    code = running.stop()
    assert code == 143, running.stderr()
    assert "Traceback" not in running.stderr() and "Traceback" not in running.log()


def health(server) -> dict:
    return json.loads(raw(server.port, "GET", "/health")[2])


def ask(server, prompt: str, **kwargs):
    return server.client().completions.create(model="tiny", prompt=prompt, temperature=0, **kwargs)


def at_once(calls) -> list:
    """Run the calls on threads started together; their results in order."""
    results: list = [None] * len(calls)
    gate = threading.Barrier(len(calls))

    def run(i: int) -> None:
        gate.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    return results


def wait_for(predicate, seconds: float = WAIT) -> bool:
    """Whether `predicate()` came true (polled) within `seconds`: a bound for a hung server, not a timing."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_health_shows_the_slots(server):
    assert health(server)["slots"] == {"busy": 0, "total": 3, "shared_ctx": 2048}  # one pool of --n-ctx cells


def test_greedy_answers_are_the_same_alone_and_beside_others(server):
    fixed_k = {"draft_max": 4, "adaptive": False}  # drafts every step alone (the adaptive policy may stop)
    alone = [ask(server, p, max_tokens=40, extra_body=fixed_k) for p in PROMPTS]
    together = at_once([lambda p=p: ask(server, p, max_tokens=40, extra_body=fixed_k) for p in PROMPTS])
    assert [a.choices[0].text for a in together] == [a.choices[0].text for a in alone]
    assert all(a.usage.completion_tokens == 40 for a in alone)
    drafted_alone = [a.model_extra["timings"]["draft_n"] for a in alone]
    assert min(drafted_alone) > 0  # a lone stream speculates
    # In a shared batch a stream drafts where this machine's costs say it pays (copies, or the draft model batched): how
    # much depends on the timings, the text does not. tests/core/test_slots.py drafts in a shared batch on purpose.


def test_each_stream_keeps_its_own_max_tokens_and_stats(server):
    limits = [3, 17, 40]
    answers = at_once([lambda n=n: ask(server, PROMPTS[0], max_tokens=n) for n in limits])
    for n, answer in zip(limits, answers, strict=True):
        assert answer.usage.completion_tokens == n and answer.choices[0].finish_reason == "length"
    # the same prompt: each is the longest one's beginning
    longest = answers[-1].choices[0].text
    assert all(longest.startswith(a.choices[0].text) for a in answers)


@pytest.mark.slow
def test_streams_beside_each_other_all_progress(server):
    """A long answer does not hold a short one back: the short one started second ends first."""
    done: dict[str, float] = {}

    def long() -> None:
        stream = ask(server, PROMPTS[1], max_tokens=1200, stream=True)
        for _ in stream:
            pass
        done["long"] = time.monotonic()

    first = threading.Thread(target=long)
    first.start()
    assert wait_for(lambda: health(server)["slots"]["busy"] == 1)
    ask(server, PROMPTS[2], max_tokens=8)
    done["short"] = time.monotonic()
    first.join(180)
    assert done["short"] < done["long"]


def test_a_client_that_leaves_frees_its_slot(server):
    stream = ask(server, PROMPTS[3], max_tokens=1500, stream=True)
    for _, _chunk in zip(range(3), stream):
        pass
    assert health(server)["slots"]["busy"] == 1
    stream.close()
    assert wait_for(lambda: health(server)["slots"]["busy"] == 0), health(server)
    assert ask(server, PROMPTS[0], max_tokens=4).choices[0].finish_reason == "length"


def test_past_the_queue_bound_a_503(server):
    streams = [ask(server, p, max_tokens=1500, stream=True) for p in PROMPTS[:3]]  # 3 running
    for stream in streams:
        next(iter(stream))
    waiting = threading.Thread(target=lambda: ask(server, PROMPTS[3], max_tokens=4))  # the 4th waits for a slot
    waiting.start()
    assert wait_for(lambda: health(server)["queue"] == 4), health(server)
    assert health(server)["slots"]["busy"] == 3
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 4}
    status, headers, data = raw(server.port, "POST", "/v1/completions", body)
    assert status == 503 and headers["retry-after"] == "1"
    assert error_of(data)["code"] == "queue_full"
    for stream in streams:
        stream.close()
    waiting.join(60)
    assert wait_for(lambda: health(server)["queue"] == 0 and health(server)["slots"]["busy"] == 0), health(server)


@pytest.mark.parametrize("value", ["0", "-2", "65"])
def test_a_parallel_out_of_range_is_one_line(value, capsys):
    code = main(["serve", "--parallel", value])
    err = capsys.readouterr().err
    assert code != 0 and f"--parallel {value} is out of range" in err and "Traceback" not in err
