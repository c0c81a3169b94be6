"""`localspec serve --target tiny-mtp.gguf`: a target that carries its own MTP head drafts with it by default; the
response names the drafter, a request may turn it off and back on, and the greedy answer is the plain one."""

from __future__ import annotations

import pytest
from support.server import start_server
from support.tinymodels import write_mtp_model

HI = [{"role": "user", "content": "the man said that the water was hot and"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("serve-mtp-home")
    target = write_mtp_model(tmp_path_factory.mktemp("mtp") / "tiny-mtp.gguf", seed=1)
    running = start_server(home, "--target", str(target), "--n-ctx", "512")
    yield running
    running.stop()
    assert "Traceback" not in running.stderr() and "Traceback" not in running.log()


def test_the_head_drafts_by_default_and_a_request_can_refuse_it(server):
    client = server.client()

    def answer(drafter: str | None):
        extra = {"draft_max": 3, "adaptive": False} | ({"drafter": drafter} if drafter else {})
        return client.chat.completions.create(
            model="tiny-mtp.gguf", messages=HI, temperature=0, max_tokens=40, extra_body=extra
        )

    head, plain, again = answer(None), answer("none"), answer("mtp")
    assert head.model_extra["localspec"]["drafter"] == "mtp" and head.model_extra["timings"]["draft_n"] > 0
    assert plain.model_extra["localspec"]["drafter"] == "none" and plain.model_extra["timings"]["draft_n"] == 0
    assert again.model_extra["localspec"]["drafter"] == "mtp" and again.model_extra["timings"]["draft_n"] > 0
    assert head.choices[0].message.content == plain.choices[0].message.content == again.choices[0].message.content
