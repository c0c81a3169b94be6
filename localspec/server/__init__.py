"""`localspec serve`: an OpenAI-compatible HTTP server over one loaded pair.

`api` reads and checks request bodies (pydantic) and writes OpenAI's error object; `runner` owns the loaded
pair and the one thread that runs it, one request at a time in arrival order; `render` turns finished or
streaming generations into OpenAI's response objects; `app` builds the Starlette application (routes, the
security checks, server-sent events).

It imports `localspec.core`, `localspec.llama`, `localspec.models`, `localspec.errors` and `localspec.paths`;
never the UI or the CLI.
"""
