"""The target on llama.cpp RPC workers: real `localspec worker` processes on 127.0.0.1, the real RPC client.

Greedy output over RPC equals the local target's (a divergence is allowed only at a counted near-tie, as in
test_engine); speculative over RPC equals plain over RPC; a worker killed mid-answer gives one clear error and a
reload on a new worker gives the same answer again. The failures before any model is placed (unreachable, busy,
another protocol version, no RPC in the build) are one line each.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from support import GREEDY, PROMPT, divergence

from localspec.bench.relay import DelayRelay
from localspec.core.engine import Engine
from localspec.core.params import SpeculativeParams
from localspec.errors import InvalidParamsError, RpcError, WorkerLostError
from localspec.llama import rpc
from localspec.llama.rpc import parse_rpc

PLAIN = SpeculativeParams(draft_max=0)
WORKER_WAIT = 600.0  # seconds a worker's start may take before a test fails: a bound for a hung one, not a timing
FIXED4 = SpeculativeParams(draft_max=4, adaptive=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """`localspec worker` in a subprocess, on a free port of 127.0.0.1."""

    def __init__(self, *extra: str, ignore_sigint: bool = False) -> None:
        self.port = free_port()
        self.endpoint = rpc.Endpoint("127.0.0.1", self.port)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "localspec", "worker", "--port", str(self.port), "--threads", "1", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None,
        )
        deadline = time.monotonic() + WORKER_WAIT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited: {self.proc.stderr.read()}")
            try:
                rpc.probe(self.endpoint, timeout=2)
                return
            except RpcError:
                time.sleep(0.1)
        self.proc.kill()  # its stderr then ends
        raise AssertionError(
            f"waited {WORKER_WAIT:g} s for the worker to answer an RPC probe on {self.endpoint}; its stderr: "
            + self.proc.stderr.read()
        )

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> tuple[str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # SIGINT may be ignored where pytest runs in the background
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.stdout.read(), self.proc.stderr.read()


@pytest.fixture
def worker():
    w = Worker()
    yield w
    w.stop()


def greedy(engine: Engine, prompt: list[int], spec: SpeculativeParams, n: int = 40):
    gen = engine.generate(prompt, sampling=GREEDY, spec=spec, max_tokens=n)
    list(gen)
    return gen


# --- addresses and the build ---------------------------------------------------------------------------------


def test_endpoints_parse_and_a_worker_named_twice_is_refused():
    assert rpc.Endpoint.parse(" 127.0.0.1:50052") == rpc.Endpoint("127.0.0.1", 50052)
    assert parse_rpc("a:1,b:1") == ("a:1", "b:1")
    with pytest.raises(InvalidParamsError, match="names a worker twice"):
        parse_rpc("a:1,a:1")


def test_the_installed_build_has_rpc():
    assert rpc.support() is None, "the README's set-up builds llama.cpp with -DGGML_RPC=on"


def test_a_build_without_rpc_gives_the_rebuild_command(tiny_models, monkeypatch):
    monkeypatch.setattr(rpc, "_lib", lambda: None)
    with pytest.raises(RpcError) as e:
        Engine.load(tiny_models.target, drafter="none", n_ctx=256, rpc=("127.0.0.1:1",))
    assert "no RPC backend" in str(e.value) and "reinstall-llama-backend.sh rpc" in str(e.value)


# --- failures before the model is placed ---------------------------------------------------------------------


def test_unreachable_worker_is_one_line():
    with pytest.raises(RpcError) as e:
        rpc.probe(rpc.Endpoint("127.0.0.1", free_port()), timeout=2)
    assert "cannot reach the RPC worker" in str(e.value) and "localspec worker" in str(e.value)


def _fake_worker(answer: bytes | None) -> tuple[socket.socket, threading.Thread]:
    """A TCP server that answers one HELLO with `answer` (None: accepts and says nothing)."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(64)
            if answer is not None:
                conn.sendall(len(answer).to_bytes(8, "little") + answer)
            time.sleep(3)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return server, t


def test_another_protocol_version_is_one_line():
    server, _ = _fake_worker(bytes([6, 1, 0, 0]) + bytes(24))
    with server, pytest.raises(RpcError) as e:
        rpc.probe(rpc.Endpoint("127.0.0.1", server.getsockname()[1]), timeout=2)
    assert "speaks protocol 6.1.0" in str(e.value) and "same" in str(e.value)


def test_a_busy_worker_times_out_with_the_reason():
    server, _ = _fake_worker(None)
    with server, pytest.raises(RpcError) as e:
        rpc.probe(rpc.Endpoint("127.0.0.1", server.getsockname()[1]), timeout=0.5)
    assert "one client at a time" in str(e.value)


def test_generate_with_an_unreachable_worker_prints_one_line(tiny_models):
    port = free_port()
    out = subprocess.run(
        [sys.executable, "-m", "localspec", "generate", "hi", "--target", str(tiny_models.target)]
        + ["--rpc", f"127.0.0.1:{port}", "--max-tokens", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the RPC worker" in lines[0], out.stderr


@pytest.mark.rpc
def test_generate_says_what_it_printed_when_the_worker_dies_mid_answer(tiny_models):
    """Issue #21: it said "the chat is kept … reload the pair", the chat's words, in the CLI."""
    first = Worker()
    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec", "generate", "the man said", "--target", str(tiny_models.target)]
        + ["--draft", str(tiny_models.draft_noisy), "--rpc", str(first.endpoint), "--max-tokens", "100000"]
        + ["--n-ctx", "2048", "--seed", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout.read(64), "no text before the worker was killed"  # mid-answer
        first.kill()
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        first.stop()
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, err
    assert lines[0].startswith("localspec: error: lost the RPC worker") and "chat" not in lines[0]
    assert "run the command again (the completion was cut short: its text so far is printed above)" in lines[0]
    assert out.endswith(b"\n")  # the partial text ends its line before the error


# --- the worker ----------------------------------------------------------------------------------------------


@pytest.mark.rpc
def test_worker_binds_loopback_by_default_and_warns_for_other_interfaces(worker):
    stdout, stderr = worker.stop()
    assert f"on 127.0.0.1:{worker.port}" in stdout and "warning" not in stderr
    other = Worker("--host", "0.0.0.0")
    stdout, stderr = other.stop()
    assert "warning: RPC has no authentication" in stderr and len(stderr.strip().splitlines()) <= 2


@pytest.mark.rpc
def test_worker_cache_folder_is_made_and_handed_to_llama_cpp(tmp_path):
    cache = tmp_path / "weights"
    w = Worker("--cache", str(cache))
    stdout, _ = w.stop()
    assert cache.is_dir() and f"local cache    : {cache}" in stdout


@pytest.mark.rpc
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_worker_stops_on_ctrl_c_or_sigterm_with_one_line(signum):
    # Started with SIGINT ignored, as a shell does for a background job: Ctrl+C must still stop it.
    w = Worker(ignore_sigint=True)
    w.proc.send_signal(signum)
    try:
        w.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        w.kill()
        raise AssertionError(f"the worker ignored {signal.Signals(signum).name}") from None
    assert w.proc.returncode == 0
    assert w.proc.stderr.read().strip().endswith("localspec worker: stopped")


@pytest.mark.rpc
def test_worker_on_a_busy_port_is_one_line(worker):
    out = subprocess.run(
        [sys.executable, "-m", "localspec", "worker", "--port", str(worker.port)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "cannot listen" in out.stderr


@pytest.mark.parametrize("host", ["256.1.1.1", "10.254.254.254"])
def test_worker_on_a_host_that_is_not_ours_names_the_host(host):
    out = subprocess.run(
        [sys.executable, "-m", "localspec", "worker", "--host", host, "--port", "50999"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert f"--host {host}" in out.stderr and "not an address of this machine" in out.stderr
    assert "--port" not in out.stderr  # the port is not what to change


# --- the target on a worker ----------------------------------------------------------------------------------


@pytest.mark.rpc
def test_greedy_over_rpc_equals_the_local_target_and_speculation_equals_plain(tiny_models, worker, record_property):
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512) as local:
        prompt = local.tokenize(PROMPT)
        reference = greedy(local, prompt, PLAIN).tokens
    progress: list[float] = []
    with Engine.load(
        tiny_models.target, tiny_models.draft_noisy, n_ctx=512, rpc=(str(worker.endpoint),), progress=progress.append
    ) as remote:
        assert remote.target_model.placement is not None and remote.target_model.placement.devices
        assert progress and progress[-1] == pytest.approx(1.0)
        plain = greedy(remote, prompt, PLAIN)
        spec = greedy(remote, prompt, FIXED4)
    record_property("rpc_vs_local_divergence", divergence(tiny_models.target, prompt, reference, plain.tokens))
    record_property("rpc_spec_vs_plain_divergence", divergence(tiny_models.target, prompt, plain.tokens, spec.tokens))
    assert spec.stats.drafted > 0 and spec.stats.target_passes < plain.stats.target_passes


@pytest.mark.rpc
def test_a_worker_killed_mid_answer_is_one_error_and_a_reload_answers_again(tiny_models):
    first = Worker()
    engine = Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512, rpc=(str(first.endpoint),))
    prompt = engine.tokenize(PROMPT)
    reference = greedy(engine, prompt, FIXED4).tokens
    gen = engine.generate(prompt, sampling=GREEDY, spec=FIXED4, max_tokens=200)
    events = iter(gen)
    next(events)  # mid-answer
    first.kill()
    started = time.monotonic()
    with pytest.raises(WorkerLostError) as e:
        for _ in events:
            pass
    assert time.monotonic() - started < 30
    message = str(e.value)
    assert "\n" not in message and str(first.endpoint) in message and "restart `localspec worker` there" in message
    engine.close()  # abandons the lost target's native memory instead of calling into a dead connection

    second = Worker()
    try:
        with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=512, rpc=(str(second.endpoint),)) as again:
            assert greedy(again, prompt, FIXED4).tokens == reference
            again.check_invariants()  # the reloaded caches hold exactly what their histories say
    finally:
        second.stop()


@pytest.mark.rpc
def test_a_worker_restarted_on_the_same_port_can_be_reloaded(tiny_models):
    first = Worker()
    engine = Engine.load(tiny_models.target, drafter="none", n_ctx=256, rpc=(str(first.endpoint),))
    prompt = engine.tokenize(PROMPT)
    first.kill()
    with pytest.raises(WorkerLostError):
        greedy(engine, prompt, PLAIN, n=8)
    engine.close()
    again = subprocess.Popen(
        [sys.executable, "-m", "localspec", "worker", "--port", str(first.port), "--threads", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + WORKER_WAIT
        while True:
            try:
                rpc.probe(first.endpoint, timeout=2)
                break
            except RpcError:
                assert time.monotonic() < deadline, f"waited {WORKER_WAIT:g} s for the restarted worker's probe"
                time.sleep(0.1)
        with Engine.load(tiny_models.target, drafter="none", n_ctx=256, rpc=(str(first.endpoint),)) as reloaded:
            assert len(greedy(reloaded, prompt, PLAIN, n=8).tokens) == 8
    finally:
        again.kill()
        again.wait()


# --- the relay the benchmark uses ----------------------------------------------------------------------------


@pytest.mark.rpc
def test_the_relay_adds_its_round_trip_and_counts_turns(tiny_models, worker):
    relay = DelayRelay(worker.endpoint, rtt_ms=0, max_connections=16, lifetime=120)
    with relay, Engine.load(tiny_models.target, drafter="none", n_ctx=256, rpc=(str(relay.endpoint),)) as engine:
        prompt = engine.tokenize(PROMPT)
        greedy(engine, prompt, PLAIN, n=4)
        timings = {}
        for rtt in (0, 20):
            relay.rtt_ms = rtt
            turns = relay.turns
            t0 = time.perf_counter()
            gen = greedy(engine, prompt, PLAIN, n=8)
            timings[rtt] = (time.perf_counter() - t0, relay.turns - turns, gen.stats.target_passes)
    (_, fast_turns, passes), (slow, slow_turns, _) = timings[0], timings[20]
    assert fast_turns >= passes and slow_turns == fast_turns  # a reply per token read, the same protocol
    # A lower bound only (load can slow a run down, never speed it up): each reply waits for its request, and
    # the relay holds each direction 10 ms.
    assert slow >= 0.5 * slow_turns * 0.020


@pytest.mark.rpc
def test_relay_is_bounded_in_connections(worker):
    with DelayRelay(worker.endpoint, max_connections=1, lifetime=30) as relay:
        rpc.probe(relay.endpoint, timeout=2)
        time.sleep(0.3)
        with pytest.raises(RpcError):
            rpc.probe(relay.endpoint, timeout=1)


@pytest.mark.rpc
def test_the_chat_keeps_its_history_when_the_worker_dies_and_answers_after_a_reload(tiny_models, tmp_path):
    from support.tui import PAIR_SETTINGS, roles, saved

    from localspec.models.resolved import ResolvedPair
    from localspec.tui.conversation import Conversation
    from localspec.tui.live import Chunk, Finished, stream_generation
    from localspec.tui.loading import Loaded
    from localspec.tui.settings import ChatOptions
    from localspec.tui.store import ChatStore

    def loaded(worker: Worker) -> Loaded:
        engine = Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=1024, rpc=(str(worker.endpoint),))
        return Loaded(
            engine, ResolvedPair(tiny_models.target, tiny_models.draft_noisy, "far", "far", PAIR_SETTINGS), "model"
        )

    first = Worker()
    store = ChatStore(tmp_path / "chats.sqlite3")
    conv = Conversation(ChatOptions(max_tokens=200, overrides={"seed": 1, "adaptive": False}), store)
    conv.begin_load()
    conv.attach(loaded(first))
    conv.finish(_run(conv.send("Hello there"), stream_generation, Finished, Chunk))
    done = _run(conv.send("And then?"), stream_generation, Finished, Chunk, kill=first)
    assert done.error and "lost the RPC worker" in done.error and "\n" not in done.error
    assert "reload the pair (F2): the chat is kept" in done.error
    conv.finish(done)
    assert roles(conv) == ["user", "assistant", "user", "assistant"]  # the partial answer is kept
    assert [r for r, _ in saved(conv)] == roles(conv)  # and saved
    kept = list(conv.messages)

    second = Worker()
    try:
        conv.begin_load().close()  # the lost engine is abandoned, not freed through a dead connection
        conv.attach(loaded(second))
        assert conv.messages == kept
        again = _run(conv.send("One more"), stream_generation, Finished, Chunk)
        conv.finish(again)
        assert again.error is None and again.text
        assert roles(conv)[-2:] == ["user", "assistant"] and [r for r, _ in saved(conv)] == roles(conv)
    finally:
        engine = conv.detach()
        if engine is not None:
            engine.close()
        store.close()
        second.stop()


def _run(turn, stream_generation, Finished, Chunk, kill: Worker | None = None):
    """What the app's worker thread does with a turn; `kill` ends that worker after the first streamed text."""
    done = []

    def post(item) -> None:
        if isinstance(item, Chunk) and kill is not None and kill.proc.poll() is None:
            kill.kill()
        if isinstance(item, Finished):
            done.append(item)

    stream_generation(turn.begin(), post)
    [finished] = done
    return finished


@pytest.mark.rpc
def test_bench_rpc_runs_each_setting_at_each_round_trip_through_its_own_relay(
    tiny_models, worker, capsys, localspec_home
):
    from localspec.cli.main import main

    args = ["bench", "--target", str(tiny_models.target), "--draft", str(tiny_models.draft_noisy), "--tokens", "8"]
    args += ["--rounds", "1", "--k", "2", "--temperature", "0", "--threads", "1", "--rpc", str(worker.endpoint)]
    code = main([*args, "--rtt", "0,4", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = {(r["rtt_ms"], r["setting"]): r for r in json.loads(out)["rpc"]}
    assert set(rows) == {(rtt, s) for rtt in (0.0, 4.0) for s in ("plain", "k=2", "adaptive≤2")}
    for r in rows.values():
        # a decode whose logits are not read needs no reply, so a pass can average under one round trip
        assert r["tokens_per_second"] > 0 and 0.5 <= r["round_trips_per_pass"] <= 10
    code = main([*args, "--rtt", "0,-1"])
    assert code == 1 and "--rtt values are milliseconds" in capsys.readouterr().err
