"""Every route that answers with the engine, by module: OpenAI's chat completions and completions
(server/chat_route.py), Anthropic's Messages (server/messages_route.py), OpenAI's Responses
(server/responses_route.py) and embeddings (server/embeddings_route.py). Each translates its body onto the same
request model and runs it on the same engine path; chat, Messages and Responses encode the same `Answer`.
"""

from __future__ import annotations

from . import chat_route, embeddings_route, messages_route, responses_route
from .images import ImageReader


def answer_routes(router, max_body: int, read_body, event_stream, settings) -> list[tuple]:
    """(path, handler, methods) of every route beyond the app's own (health and models)."""
    images = ImageReader.serving(settings.allow_image_urls, settings.timeout)
    return [
        *chat_route.routes(router, max_body, read_body, event_stream, images),
        *messages_route.routes(router, max_body, read_body, event_stream, images),
        *responses_route.routes(router, max_body, read_body, event_stream, images),
        *embeddings_route.routes(router, max_body, read_body, settings),
    ]
