"""The Responses store (server/store.py) on real SQLite files: a locked file waits off the event loop and ends in a
503 naming the file, a damaged one is a 503 naming it and the fix, and the store is capped in bytes with the file
giving the space back. Through the real server too: /health answers while a request waits on the lock."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from contextlib import closing

import pytest
from support.server import error_of, raw, start_server, write_home

from localspec.server import store as store_mod
from localspec.server.api import ApiError
from localspec.server.store import ResponseStore


def _body(i: int, size: int = 0) -> dict:
    return {"id": f"resp_{i}", "object": "response", "pad": "x" * size}


@pytest.mark.slow
def test_a_locked_store_waits_off_the_loop_then_says_which_file(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "LOCK_WAIT_S", 1.0)
    store = ResponseStore(tmp_path / "responses.sqlite3")
    asyncio.run(store.put(_body(1), "[]"))
    with closing(sqlite3.connect(store.path, isolation_level=None)) as other:
        other.execute("BEGIN EXCLUSIVE")  # another program writing

        async def both():
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            beat = asyncio.ensure_future(ticker())
            try:
                with pytest.raises(ApiError) as refused:
                    await store.get("resp_1")
            finally:
                beat.cancel()
            return refused.value, ticks

        error, ticks = asyncio.run(both())
    assert ticks > 5  # the loop went on while the call waited (blocked, it would not tick at all)
    assert error.status == 503 and str(store.path) in str(error) and "locked" in str(error)
    assert asyncio.run(store.get("resp_1"))[0]["id"] == "resp_1"  # the lock gone, the response is there


def test_a_damaged_store_names_the_file_and_the_fix(tmp_path):
    path = tmp_path / "responses.sqlite3"
    path.write_bytes(b"this is not a database, it was overwritten by something else" * 100)
    with pytest.raises(ApiError) as refused:
        asyncio.run(ResponseStore(path).get("resp_1"))
    message = str(refused.value)
    assert refused.value.status == 503 and str(path) in message and "delete it" in message
    assert len(message.splitlines()) == 1


def test_the_store_is_capped_in_bytes_and_the_file_shrinks(tmp_path):
    store = ResponseStore(tmp_path / "responses.sqlite3", max_bytes=400_000)
    for i in range(40):
        asyncio.run(store.put(_body(i, 100_000), "[]"))
    with closing(sqlite3.connect(store.path)) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM responses ORDER BY created")]
    assert ids == [f"resp_{i}" for i in range(37, 40)]  # the newest that fit: 3 of ~100 kB
    assert store.path.stat().st_size < 1_000_000  # 40 rows of 100 kB would be 4 MB without the cap's vacuum
    big = ResponseStore(store.path, max_bytes=10)  # a response larger than the cap is still kept: the newest
    asyncio.run(big.put(_body(99, 1000), "[]"))
    assert asyncio.run(big.get("resp_99")) is not None and asyncio.run(big.get("resp_39")) is None


def test_an_old_file_is_vacuumed_once_and_then_shrinks(tmp_path):
    path = tmp_path / "responses.sqlite3"
    with closing(sqlite3.connect(path)) as conn, conn:  # a store written before the byte cap: no auto_vacuum
        conn.execute("CREATE TABLE responses (id TEXT PRIMARY KEY, created REAL NOT NULL, body TEXT NOT NULL, "
                     "history TEXT NOT NULL)")  # fmt: skip
        for i in range(20):
            conn.execute(
                "INSERT INTO responses VALUES (?, ?, ?, ?)", (f"old_{i}", i, json.dumps(_body(i, 100_000)), "[]")
            )
    store = ResponseStore(path, max_bytes=200_000)
    asyncio.run(store.put(_body(100), "[]"))
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM responses").fetchone()[0] <= 3
    assert path.stat().st_size < 600_000


@pytest.mark.slow
def test_the_server_answers_health_while_a_request_waits_on_a_locked_store(tiny_models, tmp_path):
    home = write_home(tmp_path / "home", tiny_models.target, tiny_models.draft_noisy, tiny_models.draft_same)
    server = start_server(home, "--pair", "tiny")
    try:
        created = server.client().responses.create(model="tiny", input="hi", max_output_tokens=2)
        path = home / "data" / "responses.sqlite3"
        assert path.exists(), sorted(p.name for p in (home / "data").iterdir())
        order: list[str] = []
        with closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN EXCLUSIVE")
            got: dict = {}

            def fetch() -> None:
                got["reply"] = raw(server.port, "GET", f"/v1/responses/{created.id}")
                order.append("GET")

            waiting = threading.Thread(target=fetch)
            waiting.start()
            assert server.healthy()
            order.append("health")
            waiting.join(60)
        assert order == ["health", "GET"]  # /health did not wait for the store
        status, _, body = got["reply"]
        assert status == 503 and str(path) in error_of(body)["message"]
        status, _, body = raw(server.port, "GET", f"/v1/responses/{created.id}")
        assert status == 200 and json.loads(body)["id"] == created.id
    finally:
        assert server.stop() == 143, server.stderr()
    assert "Traceback" not in server.stderr() and "Traceback" not in server.log()
