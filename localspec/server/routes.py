"""The routes beside OpenAI's chat completions, each a translation onto the same request model and engine path:
Anthropic's Messages (server/messages_route.py), OpenAI's Responses (server/responses_route.py) and embeddings
(server/embeddings_route.py)."""

from __future__ import annotations

from . import embeddings_route, messages_route, responses_route


def more_routes(runner, max_body: int, read_body, event_stream, settings) -> list[tuple]:
    """(path, handler, methods) of every route beyond chat completions, completions and models."""
    return [
        *messages_route.routes(runner, max_body, read_body, event_stream),
        *responses_route.routes(runner, max_body, read_body, event_stream),
        *embeddings_route.routes(runner, max_body, read_body, settings),
    ]
