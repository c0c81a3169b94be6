"""`serve` stopping while a request switches pairs (issue 44): what it cannot answer is 503 + Retry-After, never an
empty 200 (a cancelled switch used to generate nothing and answer `"choices": []`) nor a 499 for requests whose client
is still there. The real `Runner` on the tiny pairs; the stop is what uvicorn's SIGTERM handler calls
(`Runner.cancel_all`), made to arrive while the new pair loads."""

from __future__ import annotations

import pytest

from localspec.core.session import Message
from localspec.models.flags import RunFlags
from localspec.server.api import ApiError
from localspec.server.request import Request
from localspec.server.runner import Runner

HI = Request(messages=(Message("user", "hi"),), prompt=None, max_tokens=4)


def test_a_stop_during_a_pair_switch_answers_503_with_retry_after(chat_home):
    runner = Runner(RunFlags(pair="tiny"), chat_home, pairs=("tiny", "tiny-same"))
    try:
        runner.start()
        real_load = runner.load

        def load_then_stop(pair=None):
            served = real_load(pair)
            runner.cancel_all()  # SIGTERM while the switch loaded (it cannot be interrupted)
            return served

        runner.load = load_then_stop
        switching, first = runner.submit("tiny-same", HI)
        queued, second = runner.submit("tiny-same", HI)
        for future in (first, second):
            with pytest.raises(ApiError) as caught:  # before: an Outcome with no choice (200), then a 499
                future.result(timeout=60)
            assert caught.value.status == 503 and caught.value.headers == {"Retry-After": "1"}
            assert caught.value.code == "server_stopping"
    finally:
        runner.close()


def test_the_pair_is_loaded_on_the_thread_that_decodes_its_requests(chat_home, caplog):
    # Loaded on the main thread and decoded on the worker, the demo pair ran at 0.57× `generate` on 2 cores: two
    # OpenMP thread pools (DESIGN §7). `start` loads on the worker, so one thread does every decode.
    import logging
    import threading

    runner = Runner(RunFlags(pair="tiny"), chat_home, pairs=("tiny",))
    try:
        with caplog.at_level(logging.WARNING, logger="localspec.llama.context"):
            runner.start()
            job, future = runner.submit(None, HI)
            assert future.result(60).generations[0].tokens
        assert "another thread" not in caplog.text
        threads = {seq.ctx.decoding_thread for seq in runner.served.engine.caches}
        worker = runner._executor.submit(threading.get_ident).result()
        assert threads == {worker}
    finally:
        runner.close()
