"""`localspec serve` and the target's own MTP head: a target that carries one drafts with it by default; the response
names the drafter, a request may turn it off and back on, and the greedy answer is the plain one. A request switches
to a models.toml pair that is a target alone (its head drafts), and a request for `mtp` where the head is not loaded
is refused in one line that says why and what to do."""

from __future__ import annotations

import openai
import pytest
from support.server import start_server
from support.tinymodels import write_mtp_model

from localspec.core.params import DEFAULT_MODEL_DRAFTER

HI = [{"role": "user", "content": "the man said that the water was hot and"}]


@pytest.fixture(scope="module")
def mtp_path(tmp_path_factory):
    return write_mtp_model(tmp_path_factory.mktemp("mtp") / "tiny-mtp.gguf", seed=1)


@pytest.fixture(scope="module")
def server(tmp_path_factory, mtp_path):
    home = tmp_path_factory.mktemp("serve-mtp-home")
    running = start_server(home, "--target", str(mtp_path), "--n-ctx", "512")
    yield running
    running.stop()
    assert "Traceback" not in running.stderr() and "Traceback" not in running.log()


def answer(client, model: str, drafter: str | None):
    extra = {"draft_max": 3, "adaptive": False} | ({"drafter": drafter} if drafter else {})
    return client.chat.completions.create(model=model, messages=HI, temperature=0, max_tokens=40, extra_body=extra)


def test_the_head_drafts_by_default_and_a_request_can_refuse_it(server):
    client = server.client()
    head, plain, again = (answer(client, "tiny-mtp.gguf", d) for d in (None, "none", "mtp"))
    assert head.model_extra["localspec"]["drafter"] == "mtp" and head.model_extra["timings"]["draft_n"] > 0
    assert plain.model_extra["localspec"]["drafter"] == "none" and plain.model_extra["timings"]["draft_n"] == 0
    assert again.model_extra["localspec"]["drafter"] == "mtp" and again.model_extra["timings"]["draft_n"] > 0
    assert head.choices[0].message.content == plain.choices[0].message.content == again.choices[0].message.content


@pytest.fixture(scope="module")
def pairs_server(tmp_path_factory, mtp_path, tiny_models):
    """`serve --pair tiny` with a models.toml that also has "mtp-alone", a target alone that carries a head."""
    home = tmp_path_factory.mktemp("serve-alone-home")
    (home / "models.toml").write_text(
        f'[pairs.tiny]\ntarget = {{ path = "{tiny_models.target}" }}\n'
        f'draft = {{ path = "{tiny_models.draft_noisy}" }}\nn_ctx = 512\n'
        f'[pairs."mtp-alone"]\ntarget = {{ path = "{mtp_path}" }}\nn_ctx = 512\n',
        encoding="utf-8",
    )
    running = start_server(home, "--pair", "tiny")
    yield running
    running.stop()
    assert "Traceback" not in running.stderr() and "Traceback" not in running.log()


def test_a_request_switches_to_a_target_alone_and_its_head_drafts(pairs_server):
    client = pairs_server.client()
    assert answer(client, "tiny", None).model_extra["localspec"]["drafter"] == DEFAULT_MODEL_DRAFTER
    head, plain = answer(client, "mtp-alone", None), answer(client, "mtp-alone", "none")
    assert head.model == "mtp-alone" and head.model_extra["localspec"]["drafter"] == "mtp"
    assert head.model_extra["timings"]["draft_n"] > 0 and plain.model_extra["timings"]["draft_n"] == 0
    assert head.choices[0].message.content == plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as refused:  # back on the pair with a draft: its target has no head
        answer(client, "tiny", "mtp")
    message = refused.value.body["message"]
    assert "the target target.gguf has none: ask for 'ngram' or 'none'" in message and "\n" not in message
    assert refused.value.body["param"] == "drafter"


@pytest.mark.slow
def test_a_server_started_without_the_head_refuses_mtp_in_one_line(tmp_path, mtp_path):
    running = start_server(tmp_path, "--target", str(mtp_path), "--n-ctx", "512", "--drafter", "none")
    try:
        client = running.client()
        with pytest.raises(openai.BadRequestError) as refused:
            answer(client, "tiny-mtp.gguf", "mtp")
        message = refused.value.body["message"]
        assert "\n" not in message and refused.value.body["code"] == "unsupported_value"
        assert "which this server did not load (it started with the drafter 'none')" in message
        assert message.endswith("or restart it with --drafter mtp")
        plain = answer(client, "tiny-mtp.gguf", None)  # the server goes on as it was started
        assert plain.model_extra["localspec"]["drafter"] == "none" and plain.choices[0].message.content
    finally:
        running.stop()
    assert "Traceback" not in running.stderr()
