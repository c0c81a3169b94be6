"""`localspec serve`: an OpenAI-compatible HTTP server over one loaded pair.

`api` reads and checks request bodies (pydantic) and writes OpenAI's error object; `runner` owns the queue and
the one engine thread, and loads or swaps the pair; `scheduler` runs several requests at once on that thread, each
in a slot (`--parallel`: by default four, or one where the target cannot share its context), the others waiting in
arrival order; `served` is the loaded pair and the drafters a request may pick; `request` is one request's half —
its prompt, thinking switch, params and choices, and the typed events a stream is made of; `render` turns finished
or streaming generations into OpenAI's response objects; `app` builds the Starlette application (routes, the
security checks, server-sent events); `flow`, `routes` and the `*_route` / `*_api` modules carry the other
protocols (Anthropic's Messages, OpenAI's Responses with their stored answers in `store`, embeddings) onto the same
request model.

It imports `localspec.core`, `localspec.llama`, `localspec.models`, `localspec.errors` and `localspec.paths`;
never the UI or the CLI.
"""
