"""`NativeSampler`, bench's yardstick, samples the row it is given with the settings it was built with."""

from __future__ import annotations

import numpy as np

from localspec.llama.context import Context
from localspec.llama.model import Model
from localspec.llama.sampler import NativeSampler


def test_llama_cpps_chain_samples_the_last_row_under_its_settings(tiny_models):
    with Model(tiny_models.target) as model, Context(model, n_ctx=256, n_threads=1) as ctx:
        ctx.decode([1, 5, 9, 13, 2], 0, outputs=5)
        rows = [ctx.logits(i).copy() for i in range(5)]
        assert len({int(np.argmax(r)) for r in rows}) > 1  # the rows differ: reading the wrong one would show
        with NativeSampler(temperature=0, top_k=40, top_p=0.95, min_p=0.05) as greedy:
            assert [greedy.sample(ctx, i) for i in range(5)] == [int(np.argmax(r)) for r in rows]
            assert greedy.sample(ctx) == int(np.argmax(rows[-1]))  # -1: the last row
        # T > 0 with top-k 3: always one of the row's three best, and more than one of them over many draws.
        top3 = set(np.argsort(-rows[-1])[:3].tolist())
        with NativeSampler(temperature=5.0, top_k=3, top_p=1.0, min_p=0.0, seed=7) as hot:
            drawn = {hot.sample(ctx) for _ in range(200)}
        assert drawn <= top3 and len(drawn) > 1
