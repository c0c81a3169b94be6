"""`localspec bench`'s yardstick: our sampling timed against llama.cpp's own sampler chain (`NativeSampler`, as
llama-server runs it) on freshly decoded rows of the target — a plain step's row, and the rows of a verify pass —
so the Python a step spends on sampling is measured against what a C loop spends on the same rows.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import numpy as np

from localspec.core.drafters import DraftRequest, Proposal
from localspec.core.engine import Engine
from localspec.core.sampling import SamplingParams
from localspec.core.step import accept_or_reject, target_chain, verified_rows
from localspec.llama.sampler import NativeSampler

from .report import SamplingCost
from .run import Setting, rotated


def sampling_costs(
    engine: Engine, prompt: list[int], temperatures: Sequence[float], rows: int = 16, k: int = 4
) -> list[SamplingCost]:
    """Time sampling on freshly decoded rows of the target, ours against llama.cpp's own chain: a plain step's row,
    and the rows of a verify pass.

    Plain step: after the prompt, each single-token decode is sampled by one of: ours as a plain step does it (the
    draw from the target's law — llama.cpp's chain where `target_chain` applies, else numpy; the argmax at T 0),
    `NativeSampler` (the chain as llama-server runs it), and, where ours is the chain, numpy's law and draw. One of
    each per three decodes, in an order rotated every three, so all meet the same cold caches after a decode.
    Verified rows: each decode of k + 1 rows (a verify pass) is read by ours as verification reads it when every
    draft is accepted (`verified_rows`), or by the chain sampling each row (what llama.cpp's own speculative
    decoding does), in turn; µs per row. Not on a target that samples in the graph: llama.cpp's chain would hand
    back the graph's token there.
    """
    target = engine.target
    if target.ctx.device_greedy:
        return []
    out = []
    for temperature in temperatures:
        sampling = Setting(temperature, 0).sampling
        rng = np.random.default_rng(0)
        chain = target_chain(target.ctx, sampling, rng, drafting=False)  # what a plain generation's steps use
        methods = ["ours", "llama.cpp"] + (["numpy"] if chain is not None else [])
        n = max(1, min(rows, (target.ctx.n_ctx - len(prompt)) // len(methods)))
        times: dict[str, list[float]] = {m: [] for m in methods}
        target.sync(prompt[:-1])
        token = prompt[-1]
        with _native(sampling) as native:
            try:
                for i in range(n):
                    for method in rotated(methods, i):
                        target.append([token], outputs=1)
                        chained = chain if method == "ours" else None
                        request = DraftRequest(
                            history=list(target.tokens),
                            k=0,
                            sampling=sampling,
                            pq=True,
                            p_min=0.0,
                            rng=rng,
                            chain=chained,
                        )
                        nothing = Proposal()  # the step has its (empty) proposal before its sampling lap
                        t0 = time.perf_counter()
                        if method == "llama.cpp":
                            token = native.sample(target.ctx)
                        else:
                            token = accept_or_reject(nothing, target.ctx, request)[1]
                        times[method].append(time.perf_counter() - t0)
            finally:
                if chain is not None:
                    chain.close()
            verified = _verified_costs(engine, prompt, sampling, native, n, k)
        target.rollback_to(0)
        median = {m: statistics.median(t) * 1e6 for m, t in times.items()}
        out.append(SamplingCost(temperature, n, median["ours"], median["llama.cpp"], median.get("numpy"), k, *verified))
    return out


def _native(sampling: SamplingParams) -> NativeSampler:
    return NativeSampler(
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        min_p=sampling.min_p,
        repeat_penalty=sampling.repeat_penalty,
        frequency_penalty=sampling.frequency_penalty,
        presence_penalty=sampling.presence_penalty,
        repeat_last_n=sampling.repeat_last_n,
    )


def _verified_costs(
    engine: Engine, prompt: list[int], sampling: SamplingParams, native: NativeSampler, passes: int, k: int
) -> tuple[float, float]:
    """(ours, llama.cpp's) median µs per row of a k-draft verify pass: `sampling_costs`'s second half."""
    target = engine.target
    rng = np.random.default_rng(1)
    chain = target_chain(target.ctx, sampling, rng)  # what a speculative generation uses
    passes = max(1, min(passes, (target.ctx.n_ctx - len(prompt)) // (2 * (k + 1))))
    times: dict[str, list[float]] = {"ours": [], "llama.cpp": []}
    target.sync(prompt[:-1])
    token = prompt[-1]
    try:
        for i in range(passes):
            for method in rotated(list(times), i):
                drafts = [prompt[(i + j) % len(prompt)] for j in range(k)]  # any tokens: the cost is the rows'
                n_past = len(target.tokens)
                target.append([token, *drafts], outputs=k + 1)
                history = list(target.tokens[: n_past + 1])
                request = DraftRequest(
                    history=history, k=k, sampling=sampling, pq=True, p_min=0.0, rng=rng, chain=chain
                )
                t0 = time.perf_counter()
                if method == "llama.cpp":
                    for row in range(k + 1):
                        native.sample(target.ctx, row)
                else:
                    verified_rows(drafts, target.ctx, request)
                times[method].append((time.perf_counter() - t0) / (k + 1))
                target.rollback_to(n_past + 1)
                token = drafts[0]
    finally:
        if chain is not None:
            chain.close()
    return statistics.median(times["ours"]) * 1e6, statistics.median(times["llama.cpp"]) * 1e6
