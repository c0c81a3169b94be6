"""`POST /v1/embeddings`: OpenAI's embeddings from the loaded target (an embeddings context made over its model on
first use, pooled as its GGUF says, mean where it says nothing) or from `serve --embedding-model PATH` (loaded on
first use). The work runs as a job on the one worker thread, in its turn, so it never races a generation: the inputs
are tokenized and decoded a batch at a time (`packs`: up to 64 inputs and 512 tokens in one decode, a longer input
alone), and between batches the job stops if its
client went away or the server is stopping, and — with several slots — the running chats take their next step.

Inputs are checked before the engine sees them, as chat requests are: a string, a list of strings, a token array or
a list of token arrays, none empty, at most `INPUTS_MAX` inputs and `TOKENS_MAX` tokens in all; the body's size is
bounded by the server's guard.
`dimensions` is refused unless it is the model's own width (nothing to shorten to: no model here is trained for it).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, field_validator
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from localspec.errors import LocalspecError
from localspec.llama.embedding import SEQ_MAX, EmbeddingContext, packs
from localspec.llama.model import Model

from . import flow
from .api import ApiError, _Strict, parse_body
from .pairs import Pairs

log = logging.getLogger(__name__)

INPUTS_MAX = 2048  # inputs per request, as OpenAI allows
TOKENS_MAX = 65_536  # tokens per request, all inputs together: a bound on the engine time one request may ask for
BATCH_TOKENS = 512  # tokens a batch of inputs holds (a longer input has one alone): a stop waits one such decode


class EmbeddingsRequest(_Strict):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value):
        if value == "" or value == []:
            raise ValueError("the input is empty: give a string, a list of strings or token arrays")
        if isinstance(value, list):
            if len(value) > INPUTS_MAX and not isinstance(value[0], int):
                raise ValueError(f"at most {INPUTS_MAX} inputs per request, not {len(value)}")
            for i, item in enumerate(value):
                if item == "" or item == []:
                    raise ApiError(400, f"'input.{i}' is empty", param=f"input.{i}", code="invalid_value")
        return value

    def inputs(self) -> list[str | list[int]]:
        if isinstance(self.input, str):
            return [self.input]
        if self.input and isinstance(self.input[0], int):
            return [list(self.input)]
        return list(self.input)


def routes(router: Pairs, max_body: int, read_body, settings) -> list[tuple[str, object, list[str]]]:
    own: dict[str, Any] = {}  # `--embedding-model`'s model and context, loaded on first use

    def embedder(served) -> tuple[str, EmbeddingContext]:
        if settings.embedding_model is not None:
            if "context" not in own:
                model = Model(settings.embedding_model)
                own["context"] = EmbeddingContext(model, n_ctx=min(model.info.n_ctx_train, 8192))
                own["model"] = model  # kept alive beside its context
                log.info("embeddings: %s, pooling %s", model.path.name, own["context"].pooling_name)
            return own["model"].path.stem, own["context"]
        if served.embedder is None:
            served.embedder = EmbeddingContext(served.engine.target_model, n_ctx=served.engine.n_ctx)
            log.info("embeddings: an embeddings context over %s, pooling %s", served.name, served.embedder.pooling_name)
        return served.name, served.embedder

    async def embeddings(http: HttpRequest) -> Response:
        parsed = parse_body(await read_body(http, max_body), EmbeddingsRequest, unsupported={}, ignored=("user",))
        inputs = parsed.inputs()
        single = not isinstance(parsed.input, list)

        def work(served):  # a job's work: one batch of inputs a part, the engine free for other work between parts
            try:
                name, context = embedder(served)
            except LocalspecError as e:
                raise ApiError(400, f"no embeddings: {e}", param="model", code="embeddings_unavailable") from None
            _check_dimensions(parsed.dimensions, name, context)
            tokens = []
            for i, item in enumerate(inputs):
                if i and i % SEQ_MAX == 0:
                    yield  # thousands of inputs take a while to tokenize: a stop or a client gone is seen between
                tokens.append(_tokens(context, item, "input" if single else f"input.{i}"))
            total = sum(map(len, tokens))
            if total > TOKENS_MAX:
                raise ApiError(
                    400,
                    f"the inputs are {total} tokens in all; a request may ask for at most {TOKENS_MAX}: "
                    "split them over several requests",
                    param="input",
                    code="too_many_tokens",
                )
            vectors: list[np.ndarray] = []
            for part in packs([len(t) for t in tokens], min(context.n_ctx, BATCH_TOKENS)):
                yield
                vectors += context.embed_batch([tokens[i] for i in part])
            return name, vectors, total

        model = None if settings.embedding_model is not None else parsed.model
        job, future = router.submit(await router.ready(model), None, work=work)
        name, vectors, total = await flow.watched(asyncio.wrap_future(future), http, job, router)
        data = [
            {"object": "embedding", "index": i, "embedding": _encoded(v, parsed.encoding_format)}
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": total, "total_tokens": total}
        return JSONResponse({"object": "list", "data": data, "model": name, "usage": usage})

    return [("/v1/embeddings", embeddings, ["POST"])]


def _check_dimensions(dimensions: int | None, name: str, context: EmbeddingContext) -> None:
    if dimensions is not None and dimensions != context.n_embd:
        raise ApiError(
            400,
            f"'dimensions' {dimensions} is not supported: {name} gives {context.n_embd} dimensions "
            "(leave 'dimensions' out)",
            param="dimensions",
            code="unsupported_value",
        )


def _tokens(context: EmbeddingContext, item: str | list[int], where: str) -> list[int]:
    """An input's tokens, checked: in the vocabulary, within the context."""
    model = context.model
    if isinstance(item, str):
        tokens = model.tokenize(item, add_special=True, parse_special=True)
    else:
        tokens = item
        if bad := [t for t in tokens if not 0 <= t < model.n_vocab]:
            raise ApiError(
                400, f"{where}: token {bad[0]} is not in the model's vocabulary", param=where, code="invalid_value"
            )
    if len(tokens) > context.n_ctx:
        raise ApiError(
            400,
            f"{where} is {len(tokens)} tokens; the embeddings context holds {context.n_ctx}: shorten it",
            param=where,
            code="context_length_exceeded",
        )
    return tokens


def _encoded(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32, as OpenAI's clients decode it
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]
