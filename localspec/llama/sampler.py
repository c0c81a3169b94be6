"""`NativeSampler`: llama.cpp's own sampler chain, the yardstick `localspec bench` times our host sampling against.

llama.cpp's examples and llama-server sample a row by copying it into an array of n_vocab candidates and running a
chain over it: penalties, top-k, top-p, min-p, temperature, then a draw (or the argmax at temperature 0). Generation
never uses this chain: verification needs the exact law each token was drawn from, which the chain does not hand out
(core/sampling.py builds it). `bench` only times the chain on rows decoded the same way, next to ours.
"""

from __future__ import annotations

import llama_cpp

from .context import Context


class NativeSampler:
    """llama.cpp's sampler chain for one set of sampling settings; `close()` frees it."""

    def __init__(
        self,
        *,
        temperature: float,
        top_k: int,
        top_p: float,
        min_p: float,
        repeat_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_last_n: int = 64,
        seed: int = 0,
    ) -> None:
        self._chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        links = []
        if repeat_penalty != 1.0 or frequency_penalty or presence_penalty:
            links.append(
                llama_cpp.llama_sampler_init_penalties(
                    repeat_last_n, repeat_penalty, frequency_penalty, presence_penalty
                )
            )
        if temperature <= 0:
            links.append(llama_cpp.llama_sampler_init_greedy())
        else:
            if top_k > 0:
                links.append(llama_cpp.llama_sampler_init_top_k(top_k))
            links += [
                llama_cpp.llama_sampler_init_top_p(top_p, 1),
                llama_cpp.llama_sampler_init_min_p(min_p, 1),
                llama_cpp.llama_sampler_init_temp(temperature),
                llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF),
            ]
        for link in links:
            llama_cpp.llama_sampler_chain_add(self._chain, link)  # the chain owns its links from here on

    def sample(self, ctx: Context, i: int = -1) -> int:
        """A token for row `i` of `ctx`'s last decode, as llama.cpp samples it (the chain then counts it as seen).

        On a context that samples in the graph (`device_greedy`) llama.cpp hands back the graph's token instead.
        """
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx.handle, i))

    def close(self) -> None:
        """Free the chain (idempotent)."""
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None

    def __enter__(self) -> NativeSampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
