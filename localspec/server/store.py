"""The stored responses of `/v1/responses` (`store: true`, the default): SQLite in the server's data directory,
`responses.sqlite3`, so a `previous_response_id` goes on from them and `GET` / `DELETE /v1/responses/{id}` read and
remove them.

Each row keeps the response object and the conversation it ended (the turns the next response continues from). The
store is bounded: a response older than `MAX_AGE_DAYS`, beyond the newest `MAX_RESPONSES`, or past `MAX_BYTES` of
rows counted from the newest is removed as each new one is written, and the file gives the freed pages back at each
commit (auto_vacuum FULL): docs/serve.md "Responses". The calls run off the event loop (a locked file waits in a
thread, never the server), a connection per call; a file that is locked, damaged or unwritable is a 503 naming it
and the fix.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import TypeVar

from .api import ApiError

MAX_RESPONSES = 1000
MAX_AGE_DAYS = 30
MAX_BYTES = 256 * 2**20  # each row holds its whole conversation: a long agent session grows by its square
LOCK_WAIT_S = 5.0  # how long a call waits for another program's write before the 503

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    body TEXT NOT NULL,
    history TEXT NOT NULL
)
"""
# The rows past the byte cap: every row whose running total of bytes, newest first, passes it (the newest is kept).
_OVER_BYTES = """
DELETE FROM responses WHERE id IN (
    SELECT id FROM (
        SELECT id, SUM(length(CAST(body AS BLOB)) + length(CAST(history AS BLOB))) OVER (ORDER BY created DESC)
            AS running
        FROM responses
    ) WHERE running > ? AND id != ?
)
"""

T = TypeVar("T")


class ResponseStore:
    """The stored responses; each method runs its SQLite call in a thread.

    Raises (every method):
        ApiError: 503 naming the file and the fix when it is locked, damaged or cannot be written.
    """

    def __init__(
        self,
        path: Path,
        max_responses: int = MAX_RESPONSES,
        max_age_days: float = MAX_AGE_DAYS,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.path = path
        self.max_responses, self.max_age, self.max_bytes = max_responses, max_age_days * 86400, max_bytes
        self._vacuum_set = False

    async def put(self, body: dict, history: str) -> None:
        """Keep `body` (a response object) and `history` (its conversation, JSON); prune the old ones."""
        await self._off_loop(self._put, body, history)

    async def get(self, response_id: str) -> tuple[dict, str] | None:
        """(the response object, its conversation JSON), or None when it was never stored or is gone."""
        return await self._off_loop(self._get, response_id)

    async def delete(self, response_id: str) -> bool:
        return await self._off_loop(self._delete, response_id)

    async def check(self) -> None:
        """Whether the store can be read now (before an answer that will be stored is generated)."""
        await self._off_loop(self._get, "")

    async def _off_loop(self, call: Callable[..., T], *args) -> T:
        try:
            return await asyncio.to_thread(call, *args)
        except sqlite3.Error as e:
            raise self._unavailable(e) from None

    def _unavailable(self, error: sqlite3.Error) -> ApiError:
        what = str(error)
        if "locked" in what or "busy" in what:
            fix = "another program holds it (another `localspec serve` on this data directory?): retry shortly"
        elif isinstance(error, sqlite3.DatabaseError) and not isinstance(error, sqlite3.OperationalError):
            fix = "it is damaged: move it away or delete it (its stored responses are lost) and a new one is made"
        else:
            fix = "check the disk's free space and the file's permissions"
        return ApiError(
            503,
            f"the Responses store {self.path} cannot be used ({what}): {fix}",
            type="server_error",
            code="store_unavailable",
            headers={"Retry-After": "1"},
        )

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=LOCK_WAIT_S)
        if not self._vacuum_set:  # a file made before the byte cap keeps its pages until vacuumed once
            if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 1:
                conn.execute("PRAGMA auto_vacuum = FULL")
                conn.execute("VACUUM")
            self._vacuum_set = True
        conn.execute(_SCHEMA)
        return conn

    def _put(self, body: dict, history: str) -> None:
        now = time.time()
        with closing(self._connect()) as conn, conn:
            conn.execute(
                "INSERT OR REPLACE INTO responses (id, created, body, history) VALUES (?, ?, ?, ?)",
                (body["id"], now, json.dumps(body, ensure_ascii=False), history),
            )
            conn.execute("DELETE FROM responses WHERE created < ?", (now - self.max_age,))
            conn.execute(
                "DELETE FROM responses WHERE id NOT IN (SELECT id FROM responses ORDER BY created DESC LIMIT ?)",
                (self.max_responses,),
            )
            conn.execute(_OVER_BYTES, (self.max_bytes, body["id"]))

    def _get(self, response_id: str) -> tuple[dict, str] | None:
        with closing(self._connect()) as conn:
            row = conn.execute("SELECT body, history FROM responses WHERE id = ?", (response_id,)).fetchone()
        return None if row is None else (json.loads(row[0]), row[1])

    def _delete(self, response_id: str) -> bool:
        with closing(self._connect()) as conn, conn:
            return conn.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0
