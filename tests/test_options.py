"""Every user option is accepted and bounded the same way by the command line, the server's requests, and the
engine's own params (which the chat's settings form and models.toml build): the option table
(core/options.py) is the one place its limits and choices are written. Each value sits at a bound or just past it."""

from __future__ import annotations

import json
import math

import pytest

from localspec.cli.checks import check_run_args
from localspec.cli.main import build_parser
from localspec.core.options import Option
from localspec.core.params import OPTIONS, SpeculativeParams
from localspec.core.sampling import SamplingParams
from localspec.errors import InvalidParamsError
from localspec.server.api import ApiError, parse_body
from localspec.server.chat_api import ChatRequest
from localspec.tui.settings import ChatSettings


def probes(opt: Option) -> list[tuple[object, bool]]:
    """(value, accepted) at and just past each bound, or each choice and one that is not."""
    if opt.choices:
        return [(choice, True) for choice in opt.choices] + [("bogus", False)]
    bound = opt.limit
    step = 1 if opt.kind is int else 1e-3
    found = [(bound.low, not bound.low_open), (bound.low - step, False)]
    if bound.high is not None:
        found += [(bound.high, True), (bound.high + step, False)]
    if opt.kind is float:
        found += [(math.inf, False)]
    return found


BOUNDED = [(opt, value, ok) for opt in OPTIONS if opt.limit or opt.choices for value, ok in probes(opt)]


def by_cli(opt: Option, value) -> bool:
    try:
        check_run_args(build_parser().parse_args(["generate", "hi", opt.flag, str(value)]))
    except (InvalidParamsError, SystemExit):  # SystemExit: argparse refused a choice
        return False
    return True


def by_server(opt: Option, value) -> bool:
    body = {"messages": [{"role": "user", "content": "hi"}], opt.name: value}
    if isinstance(value, float) and not math.isfinite(value):
        return False  # JSON has no infinity: the parser refuses it before any field (tested in server/)
    try:
        parse_body(json.dumps(body).encode(), ChatRequest)
    except ApiError as e:
        assert e.param == opt.name and e.code == "invalid_value", e
        return False
    return True


def by_params(opt: Option, value) -> bool:
    owner = SamplingParams if opt.name in SamplingParams.__dataclass_fields__ else SpeculativeParams
    try:
        owner(**{opt.name: value})
    except InvalidParamsError:
        return False
    return True


def by_form(opt: Option, value) -> bool:
    settings = ChatSettings()
    values = {**settings.form_values(), opt.name: str(value)}
    try:
        settings.with_values(values)
    except InvalidParamsError:
        return False
    return True


@pytest.mark.parametrize("opt, value, ok", BOUNDED, ids=lambda v: v.name if isinstance(v, Option) else repr(v))
def test_each_bound_is_the_same_for_the_flag_the_request_and_the_engine(opt, value, ok, monkeypatch):
    monkeypatch.delenv("LOCALSPEC_THREADS", raising=False)
    assert by_cli(opt, value) is ok
    assert by_server(opt, value) is (ok and not (isinstance(value, float) and math.isinf(value)))
    assert by_params(opt, value) is ok
    if opt.form or opt.name == "verify":  # the settings form's fields
        assert by_form(opt, value) is ok


def test_the_table_bounds_every_number_option():
    unbounded = [opt.name for opt in OPTIONS if opt.kind in (int, float) and opt.limit is None]
    assert unbounded == []
    assert len(BOUNDED) >= 30
