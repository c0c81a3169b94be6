"""`localspec serve`: an OpenAI-compatible HTTP server over its pairs, each loaded on demand.

`api` reads and checks request bodies (pydantic) and writes OpenAI's error object; `pairs` is the router, every pair by
name, each behind a `runner`, which owns that pair's queue and its one engine thread and loads it; `scheduler` runs
several requests at once on that thread, each in a slot (`--parallel`: by default four, or one where the target cannot
share its context), the others waiting in arrival order; `served` is the loaded pair and the drafters a request may
pick; `request` is one request's half — its prompt, thinking switch, params and choices, and the typed events a stream
is made of; `flow` runs a route's request and reads those events once into `answer`'s neutral `Answer`, which each
protocol's encoder writes (`render`: OpenAI's chat completions and completions; `messages_route`: Anthropic's Messages;
`responses_route`: OpenAI's Responses, their stored answers in `store`); the `*_api` modules read each protocol's body
and translate it onto the one request model (`to_request()`), its images read by `images`; `routes` lists the routes
(`chat_route`, the others, embeddings); `app` builds the Starlette application (routes, the security checks, server-sent
events) and runs uvicorn.

It imports `localspec.core`, `localspec.llama`, `localspec.models`, `localspec.errors` and `localspec.paths`;
never the UI or the CLI.
"""
