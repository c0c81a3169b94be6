"""The prompt cache in RAM (core/promptcache.py, issue 56): a sequence that gives its cells to another prompt saves
them, and the prompt coming back is restored, not read again — on real llama.cpp for a plain target, the draft, a
recurrent (mamba) and a hybrid (gated delta net + attention) memory. A restored state must answer as reading the
prompt does: the next row's logits within batch noise (a restored state holds cells decoded in other batch shapes),
and the greedy answer the same. The budget and the rules of reuse as pure logic. On disk (`--cache-dir`), real files:
a new engine restores what an earlier one saved, a damaged file or a full disk is one warning, the directory keeps its
size, and a state is restored only into the model that saved it."""

from __future__ import annotations

import contextlib
import errno
import logging
import os

import numpy as np
import pytest
from support import GREEDY, run_greedy
from support.tinymodels import write_mtp_model

from localspec.core.engine import Engine
from localspec.core.kv import KVSequence
from localspec.core.params import SpeculativeParams
from localspec.core.promptcache import GAIN_MIN, PromptCache
from localspec.core.promptdisk import SUFFIX, DiskTier
from localspec.errors import LocalspecError
from localspec.llama.context import Context
from localspec.llama.model import Model

BATCH_NOISE = 1e-3
A = [5 + (7 * i) % 190 for i in range(150)]  # two long prompts that share a short start
B = A[:10] + [9 + (11 * i) % 180 for i in range(160)]


def test_the_budget_drops_the_least_recently_used_and_covered_prefixes():
    cache = PromptCache(budget=300)
    cache.save("t", A, b"x" * 100, trims=True)
    cache.save("t", B, b"y" * 100, trims=True)
    assert cache.best("t", A + [1], held=0, trims=True)[1] == len(A)  # A used: B is now the older
    cache.save("t", list(range(100)), b"z" * 150, trims=True)  # over budget: B goes, not A
    assert cache.best("t", B, held=0, trims=True) is None  # evicted (and A shares too little with it)
    assert cache.best("t", A, held=0, trims=True)[1] == len(A) and cache.used == 250
    cache.save("t", A + [1, 2, 3], b"w" * 100, trims=True)  # A's entry is a prefix of this: covered, replaced
    assert len(cache) == 2 and cache.used == 250
    assert cache.best("d", A, held=0, trims=True) is None  # another namespace's states are not this one's
    cache.save("t", A[:10], b"v", trims=True)  # too short to be worth keeping
    cache.save("t", A, b"u" * 400, trims=True)  # larger than the whole budget
    assert len(cache) == 2


def test_a_memory_that_cannot_trim_restores_only_whole_prefixes():
    cache = PromptCache(budget=10_000)
    cache.save("t", A, b"s" * 10, trims=False)
    assert cache.best("t", A[:120] + [3] * 40, held=0, trims=False) is None  # A's state holds tokens past these
    assert cache.best("t", A[:120] + [3] * 40, held=0, trims=True)[1] == 120
    assert cache.best("t", A + [3] * 40, held=0, trims=False)[1] == len(A)
    assert cache.best("t", A + [3], held=len(A) - GAIN_MIN + 1, trims=True) is None  # spares too little


def _next_row(seq: KVSequence, prompt: list[int]) -> np.ndarray:
    """Read `prompt` as a generation does (all but its last token, the anchor, then the last with its row)."""
    seq.sync(prompt[:-1])
    seq.anchor()
    seq.append(prompt[-1:], outputs=1)
    return seq.ctx.logits(-1).copy()


@pytest.mark.parametrize("which", ["target", "recurrent", "hybrid"])
def test_a_prompt_that_comes_back_is_restored_and_answers_as_read(tiny_models, tmp_path, which):
    path = {"target": tiny_models.target, "recurrent": tiny_models.recurrent}.get(which) or write_mtp_model(
        tmp_path / "hybrid.gguf", seed=3, output_scale=0.4
    )
    with Model(path) as model, Context(model, n_ctx=512) as ctx, Context(model, n_ctx=512) as fresh_ctx:
        seq, fresh = KVSequence(ctx), KVSequence(fresh_ctx)
        seq.use_cache(PromptCache(budget=2**30), "target")
        first = _next_row(seq, A)
        _next_row(seq, B)  # B takes the cells: A is saved first
        decoded = seq.n_decoded
        again = _next_row(seq, A)  # restored: only its last token is decoded again
        assert seq.n_restored == len(A) - 1 and seq.n_decoded - decoded == 1
        seq.check()
        reread = _next_row(fresh, A)
        assert np.abs(again - reread).max() < BATCH_NOISE and np.abs(again - first).max() < BATCH_NOISE
        if which == "target":  # plain KV restores a state longer than the prompt and trims it
            _next_row(seq, B)
            before = seq.n_restored
            shorter = _next_row(seq, A[:100])
            assert seq.n_restored - before == 99
            assert np.abs(shorter - _next_row(fresh, A[:100])).max() < BATCH_NOISE


def test_alternating_prompts_give_the_same_greedy_answers_restored(tiny_models):
    """Two long prompts taking turns on a pair (target and draft both cached): each turn after the first restores
    both models' states, and every answer is the one a fresh engine gives."""
    spec = SpeculativeParams(draft_max=4, adaptive=False)
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=1024, cache_ram=2**30) as engine:
        answers, restored, drafted = {}, [], []
        for turn in range(4):
            prompt = A if turn % 2 == 0 else B
            gen = engine.generate(prompt, sampling=GREEDY, spec=spec, max_tokens=16)
            tokens = [e.token for e in gen if e.token is not None]
            answers.setdefault(turn % 2, tokens)
            assert tokens == answers[turn % 2], turn
            restored.append(gen.stats.prefill_restored)
            drafted.append(gen.stats.draft_prefill_decoded)
        draft = engine.drafter.caches[0]
        assert restored[2:] == [len(A) - 1, len(B) - 1] and restored[:2] == [0, 0]
        assert draft.n_restored > 0 and max(drafted[2:]) < GAIN_MIN  # the draft restored too
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=1024, cache_ram=0) as fresh:
        assert run_greedy(fresh, A, k=4, n=16).tokens == answers[0]
        assert fresh.prompt_cache.budget == 0 and fresh.target.n_restored == 0


def test_two_chats_taken_in_turns_restore_instead_of_reading_again(tiny_models):
    """What the chat app does on F4 (another saved chat) and on a branch: a second conversation takes the caches, and
    going back restores the first's state — the next turn reads its new message, not the whole chat again."""
    from localspec.core.session import ChatSession

    words = " ".join(["the man said that the water was hot and"] * 12)
    with Engine.load(tiny_models.target, tiny_models.draft_noisy, n_ctx=1024, cache_ram=2**30) as engine:
        first = ChatSession(engine, system=f"first: {words}")
        second = ChatSession(engine, system=f"second: {words[::-1]}")
        for gen in (first.send("hello", max_tokens=4), second.send("hello", max_tokens=4)):
            list(gen)
        back = first.send("and then", max_tokens=4)
        list(back)
        assert back.stats.prefill_restored > 100 and back.stats.prefill_decoded < 32, back.stats


@pytest.mark.parametrize("chunk", [None, 64])
def test_a_hybrid_model_restores_two_chats_in_turns_also_when_the_prompt_is_read_in_parts(tmp_path, chunk):
    """Issue 64 item 4: on a hybrid memory (which cannot cut a state back) two chats taken in turns restore the state
    kept after each one's last prompt; read in parts (`serve`: `read_prompt`, other streams step between parts), the
    prompt cache must be asked with the whole prompt, not its first part — it read the whole chat again before."""
    from localspec.core.session import ChatSession

    hybrid = write_mtp_model(tmp_path / "hybrid.gguf", seed=3, output_scale=0.4)
    words = " ".join(["the man said that the water was hot and"] * 12)
    with Engine.load(hybrid, drafter="none", n_ctx=1024, cache_ram=2**30) as engine:
        chats = [ChatSession(engine, system=f"first: {words}"), ChatSession(engine, system=f"second: {words[::-1]}")]
        reads = []
        for turn in range(2):
            for chat in chats:
                gen = chat.send(f"question {turn}", max_tokens=4)
                if chunk is not None:
                    list(gen.read_prompt(chunk))
                list(gen)
                reads.append((gen.stats.prefill_decoded, gen.stats.prefill_restored))
        assert all(read > 100 for read, _ in reads[:2])
        assert all(read < 32 and restored > 100 for read, restored in reads[2:]), reads


def test_a_sliding_window_state_is_never_cut_back_after_a_restore(tiny_gemma4):
    """A sliding-window target drafting (`swa_full`: its cache keeps every cell) saves states whose window layers
    hold the window's cells alone (llama.cpp saves no more): restored and cut back into the window, the cells before
    the cut were missing and the output left the target's at the 6th token. Such a state is restored whole or not at
    all, and a rollback asks the cells, not the flag: the answer is the one an engine without a cache gives."""
    long = "the man said that the water was hot and the people who came to the house were there"

    def third_answer(cache_ram: int) -> tuple[list[int], int]:
        with Engine.load(tiny_gemma4.target, drafter="ngram", n_ctx=256, n_threads=1, cache_ram=cache_ram) as engine:
            first = engine.tokenize(long)
            answer = run_greedy(engine, first, k=3, n=100).tokens
            run_greedy(engine, first + answer[:10] + engine.tokenize(" the man", add_special=False), k=3, n=30)
            again = run_greedy(engine, first + answer[:90], k=3, n=40)
            engine.check_invariants()
            return again.tokens, engine.target.n_restored

    cached, _ = third_answer(2**30)
    uncached, restored = third_answer(0)
    assert restored == 0 and cached == uncached


# The cache on disk (`--cache-dir`): states that outlive the engine, files checked before they are restored.

LOAD = {"drafter": "none", "n_ctx": 1024}


def _answer(engine: Engine, prompt: list[int]):
    gen = engine.generate(prompt, sampling=GREEDY, spec=SpeculativeParams(draft_max=4, adaptive=False), max_tokens=16)
    return [e.token for e in gen if e.token is not None], gen.stats


def _saved_to(directory, model, **load) -> list[int]:
    """Run A then B on an engine keeping its cache in `directory` (B takes the cells: A's state is saved), and wait
    for the files; A's answer, read (the reference a restored state must give)."""
    with Engine.load(model, cache_dir=directory, **{**LOAD, **load}) as engine:
        tokens, _ = _answer(engine, A)
        _answer(engine, B)
        engine.prompt_cache.flush()
    return tokens


def _files(directory, namespace: str) -> list:
    """The state files in `directory` whose identity (right after the fixed header) starts with `namespace`."""
    return [p for p in sorted(directory.glob("*" + SUFFIX)) if p.read_bytes()[:300].find(namespace.encode()) == 30]


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.slow
def test_a_new_engine_restores_from_the_directory_and_answers_as_read(tiny_models, tmp_path):
    """A restart: the pair's states (target and draft) saved by one engine are restored by the next from the files,
    and the greedy answer is the one reading the prompt gives."""
    pair = {"drafter": "model", "draft_path": tiny_models.draft_noisy}
    first = _saved_to(tmp_path, tiny_models.target, **pair)
    assert len(_files(tmp_path, "target\n")) == 1 and len(_files(tmp_path, "draft:")) == 1
    with Engine.load(tiny_models.target, cache_dir=tmp_path, cache_ram=0, **{**LOAD, **pair}) as engine:
        tokens, stats = _answer(engine, A)
        assert stats.prefill_restored == len(A) - 1 and stats.prefill_decoded < GAIN_MIN
        assert engine.drafter.caches[0].n_restored > 0  # the draft's state came back too
    assert tokens == first


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_damaged_file_is_one_warning_removed_and_the_prompt_read(tiny_models, tmp_path, caplog, damage):
    read = _saved_to(tmp_path, tiny_models.target)
    (path,) = _files(tmp_path, "target\n")
    data = bytearray(path.read_bytes())
    if damage == "flipped":  # in the state: found when it is the one to restore
        data[-100:-90] = bytes(255 - b for b in data[-100:-90])
    else:  # found at start, from the header
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))
    with Engine.load(tiny_models.target, cache_dir=tmp_path, **LOAD) as engine:
        tokens, stats = _answer(engine, A)
    assert tokens == read and stats.prefill_restored == 0
    (line,) = _warnings(caplog)
    assert str(path) in line and "prompt cache" in line, line
    assert not path.exists()


def test_a_full_disk_is_one_warning_and_ram_still_restores(tiny_models, tmp_path, caplog, monkeypatch):
    """ENOSPC part way through a write (the first 4 KiB land): one line naming the directory, the half-written temp
    file gone, no more writes, and the RAM tier restores as before."""
    write, written = os.write, []

    def full_disk(fd: int, data) -> int:
        if sum(written) >= 4096:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(write(fd, bytes(data[:4096])))
        return written[-1]

    monkeypatch.setattr(os, "write", full_disk)
    with Engine.load(tiny_models.target, cache_dir=tmp_path, **LOAD) as engine:
        answers = [_answer(engine, prompt) for prompt in (A, B, A, B)]
        engine.prompt_cache.flush()
        assert not engine.prompt_cache.disk.writable
    monkeypatch.undo()
    assert [stats.prefill_restored for _, stats in answers] == [0, 0, len(A) - 1, len(B) - 1]
    assert answers[2][0] == answers[0][0] and answers[3][0] == answers[1][0]
    (line,) = _warnings(caplog)
    assert str(tmp_path) in line and "is full" in line and "RAM only" in line, line
    assert written and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_another_models_states_in_the_same_directory_are_never_restored(tiny_models, tmp_path):
    """Two targets, one directory: each finds only its own states, after the other wrote there."""
    target, other = tiny_models.target, tiny_models.draft_noisy
    read = {target: _saved_to(tmp_path, target)}
    with Engine.load(other, cache_dir=tmp_path, **LOAD) as engine:
        read[other], stats = _answer(engine, A)
        _answer(engine, B)
        engine.prompt_cache.flush()
    assert stats.prefill_restored == 0 and read[other] != read[target]  # the target's state would answer as it
    assert len(_files(tmp_path, "target\n")) == 2  # one each
    for model in (target, other):
        with Engine.load(model, cache_dir=tmp_path, **LOAD) as engine:
            tokens, stats = _answer(engine, A)
        assert stats.prefill_restored == len(A) - 1 and tokens == read[model], model.name


def _disk(tmp_path, size: int) -> tuple[PromptCache, DiskTier]:
    """A cache that keeps nothing in RAM, all on disk, for namespace "t" of a stand-in model file."""
    model = tmp_path / "model.gguf"
    if not model.exists():
        model.write_bytes(b"GGUF")
    disk = DiskTier(tmp_path / "cache", size)
    cache = PromptCache(budget=0, disk=disk)
    cache.identify("t", model)
    return cache, disk


def test_the_directory_keeps_its_size_the_least_recently_used_file_removed(tmp_path):
    c = [[100 + i] + A[1:] for i in range(4)]  # four prompts that share nothing at their start
    cache, disk = _disk(tmp_path, size=25_000)  # two 10 kB states and their headers (under 1 kB each) fit, not three
    for tokens in c[:2]:
        cache.save("t", tokens, bytes([tokens[0]]) * 10_000, trims=True)
    cache.flush()
    assert cache.best("t", c[0], held=0, trims=True)[0].state == b"d" * 10_000  # c[0] read: c[1] is now the older
    cache.save("t", c[2], b"x" * 10_000, trims=True)
    cache.flush()
    assert len(disk) == 2 and cache.best("t", c[1], held=0, trims=True) is None
    assert sum(p.stat().st_size for p in disk.directory.iterdir()) <= 25_000
    again, _ = _disk(tmp_path, size=25_000)  # a restart reads the same two from their headers
    assert [again.best("t", t, held=0, trims=True)[1] for t in (c[0], c[2])] == [len(A), len(A)]
    cache.save("t", c[3], b"z" * 30_000, trims=True)  # larger than the directory: stays out
    cache.flush()
    assert len(disk) == 2 and cache.best("t", c[3], held=0, trims=True) is None
    assert all(p.suffix == SUFFIX for p in disk.directory.iterdir())  # no temp file left


def test_a_changed_model_file_or_another_namespace_restores_nothing(tmp_path):
    cache, disk = _disk(tmp_path, size=2**20)
    cache.save("t", A[:100], b"s" * 100, trims=True)
    cache.save("t", A, b"s" * 100, trims=True)  # A[:100]'s state is cut back from this one: its file goes
    cache.flush()
    assert len(disk) == 1 and len(list(disk.directory.iterdir())) == 1
    restart, _ = _disk(tmp_path, size=2**20)
    assert restart.best("t", A, held=0, trims=True)[1] == len(A)
    restart.identify("d", tmp_path / "model.gguf")
    assert restart.best("d", A, held=0, trims=True) is None  # the same file under another namespace
    (tmp_path / "model.gguf").write_bytes(b"GGUF v2")  # re-downloaded: another size and mtime
    changed, _ = _disk(tmp_path, size=2**20)
    assert changed.best("t", A, held=0, trims=True) is None


def test_a_file_that_is_not_ours_is_removed_and_others_files_are_never_touched(tmp_path, caplog):
    cache, disk = _disk(tmp_path, size=2**20)
    cache.save("t", A, b"s" * 100, trims=True)
    cache.flush()
    (path,) = disk.directory.glob("*" + SUFFIX)
    path.write_bytes(b"GGUF" + path.read_bytes()[4:])  # another program's file under our name
    mine = disk.directory / "notes.txt"
    mine.write_bytes(b"x" * 2**21)  # larger than the directory's size: not ours to count or remove
    restart, disk = _disk(tmp_path, size=2**20)
    (line,) = _warnings(caplog)
    assert f"removed {path} (not a prompt state of this localspec)" in line, line
    assert len(disk) == 0 and restart.best("t", A, held=0, trims=True) is None
    restart.save("t", A, b"s" * 100, trims=True)
    restart.flush()
    assert len(disk) == 1 and mine.read_bytes() == b"x" * 2**21


def test_a_directory_that_cannot_be_made_is_one_line_at_start(tmp_path):
    from localspec.cli.checks import check_run_args
    from localspec.cli.main import build_parser

    blocker = tmp_path / "file"
    blocker.write_text("")
    parse = build_parser().parse_args
    with pytest.raises(LocalspecError, match=r"^--cache-dir .*file/cache cannot be used \(.*\): give a directory"):
        check_run_args(parse(["generate", "hi", "--cache-dir", f"{blocker}/cache"]))
    with pytest.raises(LocalspecError, match="'8X' after the last colon is not a size"):
        check_run_args(parse(["generate", "hi", "--cache-dir", f"{tmp_path}/c:8X"]))
    flags = check_run_args(parse(["generate", "hi", "--cache-dir", f"{tmp_path}/a:b/c:2G"]))
    assert (flags.cache_dir, flags.cache_dir_size) == (f"{tmp_path}/a:b/c", 2 * 2**30)
    assert (tmp_path / "a:b" / "c").is_dir()


def test_two_processes_sharing_a_directory_keep_its_size(tmp_path, monkeypatch):
    """Two servers, one directory (issue 63): one writes while the other's write is under way, and the size still
    holds once both are done; a file the other removes while this one counts is no error (no give-up, no warning)."""
    c = [[100 + i] + A[1:] for i in range(4)]
    first, first_disk = _disk(tmp_path, size=25_000)  # two 10 kB files fit, not three
    second, second_disk = _disk(tmp_path, size=25_000)  # another process: its own index, the same directory
    first.save("t", c[0], b"a" * 10_000, trims=True)
    first.flush()
    replace, interleaved = os.replace, []

    def meanwhile(src, dst):  # the second writes its file while the first's is still a temp file
        if not interleaved:
            interleaved.append(dst)
            second.save("t", c[2], b"c" * 10_000, trims=True)
            second.flush()
        return replace(src, dst)

    monkeypatch.setattr(os, "replace", meanwhile)
    first.save("t", c[1], b"b" * 10_000, trims=True)
    first.flush()
    monkeypatch.undo()
    assert interleaved and sum(p.stat().st_size for p in first_disk.directory.iterdir()) <= 25_000
    assert first.best("t", c[0], held=0, trims=True) is None  # the oldest went: the others' files counted too

    scandir, others = os.scandir, set(os.listdir(first_disk.directory))

    def vanishing(path):  # the other process removes each of its files right after it is listed
        with scandir(path) as listing:
            for item in list(listing):
                if item.name in others:
                    os.unlink(item.path)
                    others.discard(item.name)
                yield item

    monkeypatch.setattr(os, "scandir", lambda path: contextlib.closing(vanishing(path)))
    second.save("t", c[3], b"d" * 10_000, trims=True)
    second.flush()
    monkeypatch.undo()
    assert second_disk.writable and second.best("t", c[3], held=0, trims=True) is not None


def test_many_damaged_files_are_one_warning_the_rest_in_the_log(tmp_path, caplog):
    cache, disk = _disk(tmp_path, size=2**20)
    for i in range(3):
        (disk.directory / f"{i:032x}{SUFFIX}").write_bytes(b"LSPROMPT garbage")
    caplog.set_level(logging.INFO, "localspec.core.promptdisk")
    DiskTier(disk.directory, 2**20)
    (line,) = _warnings(caplog)
    assert "prompt cache: removed" in line and "any other damaged file: in the log alone" in line, line
    removed = [r for r in caplog.records if r.levelno == logging.INFO and "prompt cache: removed" in r.getMessage()]
    assert len(removed) == 2 and not list(disk.directory.glob("*" + SUFFIX))


@pytest.mark.parametrize(
    ("size", "expected"),
    [("12Q", None), ("-1", None), ("G", None), ("", None), ("0", None), ("2G", 2 * 2**30), ("8 M", 8 * 2**20)],
)
def test_a_bad_size_after_the_colon_is_refused_not_made_a_folder(tmp_path, size, expected):
    """`--cache-dir DIR:SIZE` with a SIZE that is not one is one line naming the forms, and no folder is made."""
    from localspec.cli.checks import check_run_args
    from localspec.cli.main import build_parser

    args = build_parser().parse_args(["generate", "hi", "--cache-dir", f"{tmp_path}/c:{size}"])
    if expected is None:
        with pytest.raises(LocalspecError, match=r"is not a size: write DIR:SIZE with SIZE like 8G, 512M") as e:
            check_run_args(args)
        assert "\n" not in str(e.value) and list(tmp_path.iterdir()) == []
    else:
        flags = check_run_args(args)
        assert (flags.cache_dir, flags.cache_dir_size) == (f"{tmp_path}/c", expected)


@pytest.mark.parametrize("name", ["a:b/c", "cache:old", "c:12Q/", "C:"])
def test_a_colon_that_is_not_a_size_belongs_to_the_directory(tmp_path, monkeypatch, name):
    from localspec.cli.checks import check_run_args
    from localspec.cli.main import build_parser

    monkeypatch.chdir(tmp_path)
    flags = check_run_args(build_parser().parse_args(["generate", "hi", "--cache-dir", name]))
    assert flags.cache_dir_size is None and (tmp_path / name).is_dir()
