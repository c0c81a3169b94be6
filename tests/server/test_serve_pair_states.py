"""What `serve` says of a pair that cannot answer yet (issue 63): a pair whose files are here but damaged is not
"available" in /v1/models — it says which file and how to mend it, and a request for it is that one line — and a
pair whose load waits under --max-loaded for another pair to finish is said to wait for room, naming that pair, in
/health and in a request's 503 (not "still loading"). In process: the `Pairs` the server's routes read."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from localspec.models.flags import RunFlags
from localspec.server.api import ApiError
from localspec.server.pairs import Pairs


def _damaged_pairs(paths, tiny_models) -> None:
    """Add "broken" (a truncated target), "garbage" (a text file named .gguf) and make the Hub pair "remote" present
    in the HF cache but cut to garbage, as a download that went wrong leaves it."""
    with paths.config_file.open("a", encoding="utf-8") as f:
        f.write(
            f'[pairs.broken]\ntarget = {{ path = "{tiny_models.truncated}" }}\n'
            f'[pairs.garbage]\ntarget = {{ path = "{tiny_models.not_gguf}" }}\n'
        )
    from huggingface_hub import constants

    repo = paths.config_file.parent.parent / "hf-cache" / "models--localspec-test--Missing-GGUF"
    assert str(repo.parent) == constants.HF_HUB_CACHE
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "cut").write_bytes(tiny_models.target.read_bytes()[:5000])
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    for quant in ("Q4_K_M", "Q8_0"):
        (repo / "snapshots" / ("0" * 40) / f"Missing-{quant}.gguf").symlink_to("../../blobs/cut")


def test_a_damaged_pair_is_listed_as_damaged_with_its_fix_not_available(chat_home, tiny_models):
    _damaged_pairs(chat_home, tiny_models)
    pairs = Pairs(RunFlags(pair="tiny"), chat_home, names=("tiny", "broken", "garbage", "remote"))
    try:
        pairs.start()
        assert {"tiny", "broken", "garbage", "remote"} <= set(pairs.model_ids())
        assert pairs.facts("tiny")["available"] is True and pairs.facts("tiny")["damaged"] is None
        fixes = {
            "broken": f"replace {tiny_models.truncated}",
            "garbage": f"replace {tiny_models.not_gguf}",
            "remote": "run `localspec pull remote` again",
        }
        for name, fix in fixes.items():
            facts = pairs.facts(name)
            assert facts["available"] is False and not facts["loaded"], (name, facts)
            assert "truncated or corrupt" in facts["damaged"] and f": {fix}" in facts["damaged"], facts["damaged"]
            assert "\n" not in facts["damaged"] and "re-download it" not in facts["damaged"]
            with pytest.raises(ApiError) as refused:
                pairs.name_of(name)
            assert refused.value.status == 503 and refused.value.code == "model_load_failed"
            assert refused.value.message == f"could not load '{name}': {facts['damaged']}"
    finally:
        pairs.close()


async def _until(get, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while not (value := get()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return value


def test_a_pair_waiting_for_room_says_so_and_names_the_pair_it_waits_for(chat_home):
    """--max-loaded 1, "tiny" answering a long request: "tiny-same" waits for it, and /health and a request's 503
    say so (not "still loading"); once "tiny" is done it is unloaded and "tiny-same" loads."""
    pairs = Pairs(RunFlags(pair="tiny"), chat_home, names=("tiny", "tiny-same"), max_loaded=1, load_timeout=30)
    release = threading.Event()

    def long_request(served):
        while not release.wait(0.02):
            yield

    try:
        pairs.start()
        _, held = pairs.submit("tiny", None, work=long_request)

        async def scenario():
            loading = asyncio.ensure_future(pairs.ready("tiny-same"))
            waiting = await _until(lambda: pairs.health().get("tiny-same", {}).get("waiting"))
            assert waiting == {"for": "room", "limit": "--max-loaded 1", "pairs": ["tiny"]}
            assert pairs.health()["tiny"]["waiting"] is None
            pairs.load_timeout = 0.2
            with pytest.raises(ApiError) as late:
                await pairs.ready("tiny-same")
            assert late.value.status == 503 and late.value.code == "no_room", late.value.message
            assert late.value.message == (
                "the model 'tiny-same' is not loaded yet: it waits for room (--max-loaded 1): for tiny to finish its "
                "requests and unload; retry shortly"
            )
            release.set()
            assert await loading == "tiny-same"

        asyncio.run(scenario())
        held.result(30)
        health = pairs.health()
        assert set(health) == {"tiny-same"} and health["tiny-same"]["waiting"] is None
    finally:
        release.set()
        pairs.close()
