"""The stored responses of `/v1/responses` (`store: true`, the default): SQLite in the server's data directory,
`responses.sqlite3`, so a `previous_response_id` goes on from them and `GET` / `DELETE /v1/responses/{id}` read and
remove them.

Each row keeps the response object and the conversation it ended (the turns the next response continues from). The
store is bounded: a response older than `MAX_AGE_DAYS` or beyond the newest `MAX_RESPONSES` is removed as each new
one is written (docs/serve.md "Responses"). A connection is opened per call: the calls are few and small, made on
the event loop, and SQLite serialises the writes of several servers on one data directory.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path

MAX_RESPONSES = 1000
MAX_AGE_DAYS = 30

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    body TEXT NOT NULL,
    history TEXT NOT NULL
)
"""


class ResponseStore:
    def __init__(self, path: Path, max_responses: int = MAX_RESPONSES, max_age_days: float = MAX_AGE_DAYS) -> None:
        self.path = path
        self.max_responses, self.max_age = max_responses, max_age_days * 86400

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=10)
        conn.execute(_SCHEMA)
        return conn

    def put(self, body: dict, history: str) -> None:
        """Keep `body` (a response object) and `history` (its conversation, JSON); prune the old ones."""
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

    def get(self, response_id: str) -> tuple[dict, str] | None:
        """(the response object, its conversation JSON), or None when it was never stored or is gone."""
        with closing(self._connect()) as conn:
            row = conn.execute("SELECT body, history FROM responses WHERE id = ?", (response_id,)).fetchone()
        return None if row is None else (json.loads(row[0]), row[1])

    def delete(self, response_id: str) -> bool:
        with closing(self._connect()) as conn, conn:
            return conn.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0
