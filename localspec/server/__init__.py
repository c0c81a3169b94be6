"""`localspec serve`: an OpenAI-compatible HTTP server over one loaded pair.

`api` reads and checks request bodies (pydantic) and writes OpenAI's error object; `runner` owns the queue and
the one thread that runs requests, one at a time in arrival order, and loads or swaps the pair; `served` is the
loaded pair and the drafters a request may pick; `request` is one request's half — its prompt, thinking switch,
params and choices, and the typed events a stream is made of; `render` turns finished or
streaming generations into OpenAI's response objects; `app` builds the Starlette application (routes, the
security checks, server-sent events).

It imports `localspec.core`, `localspec.llama`, `localspec.models`, `localspec.errors` and `localspec.paths`;
never the UI or the CLI.
"""
