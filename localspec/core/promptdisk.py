"""A prompt cache's states on disk (`DiskTier`, `--cache-dir`), the second tier behind RAM (core/promptcache.py): a
save goes to both, a lookup asks RAM, then the files' headers, and reads the state of the winner alone (kept in RAM
from then on). One file per state, `<hash>.lsprompt`: a fixed header (magic, format, lengths, the state's CRC-32),
the identity, the tokens (int32 LE), a CRC-32 of all that, then the state as llama.cpp wrote it. The identity is the
namespace, the model file (real path, size, mtime) and the llama-cpp-python version: another model's state, or one a
changed file or build could not read, is never restored (only a namespace `identify` named goes to disk). The headers
are read once at start (the index); a file is written by a background thread to a temp file in the directory,
fsynced and renamed (a crash leaves the old file or the new, never half of one), and the directory is kept within its
size, the least recently used file (mtime, set on each use) removed first. A damaged file is removed; a full or
unwritable directory means RAM alone from then on; each cause is one warning (later damaged files are logged at
INFO). Several processes may share a directory (whole files only; each sees the others' files from its next start):
the size counts every process's files, before a write and again after it, and a file another process removed is no
error.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.metadata
import logging
import os
import stat
import struct
import threading
import time
import zlib
from collections import deque
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.errors import InvalidParamsError

from .kv import common_prefix

log = logging.getLogger(__name__)

DIR_SIZE = 4 * 2**30  # a cache directory's default size
SUFFIX = ".lsprompt"  # the files the disk tier owns in its directory (it never touches others)
TEMP = ".tmp"  # a write in progress: ".<name>.<pid>.tmp"
TEMP_STALE = 3600  # seconds after which a temp file is an interrupted write's, removed at start
PENDING_MAX = 2**30  # bytes of states waiting for the writer; past it a save stays in RAM alone
MAGIC, FORMAT = b"LSPROMPT", 1
_HEAD = struct.Struct("<8sHIIQI")  # magic, format, identity bytes, tokens, state bytes, the state's CRC-32
_CRC = struct.Struct("<I")


def open_cache_dir(path: str | os.PathLike) -> Path:
    """`path` as a cache directory: created with its parents when missing, and writable.

    Raises:
        InvalidParamsError: it cannot be created or written (one line naming it).
    """
    directory = Path(path).expanduser()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as e:
        raise InvalidParamsError(
            f"--cache-dir {directory} cannot be used ({e.strerror or e}): give a directory you can write, or leave "
            "the flag out to keep earlier prompts in RAM only"
        ) from None
    return directory


class Damaged(Exception):
    """A cache file that cannot be ours, whole: why, in a few words."""


@dataclass(frozen=True, slots=True)
class DiskEntry:
    """A state file's header: what the index keeps (the state stays on disk until it is the one restored)."""

    name: str  # the file's name in the directory
    identity: str
    tokens: list[int]
    offset: int  # where the state starts
    state_bytes: int
    state_crc: int


class DiskTier:
    """A prompt cache's states as files in `directory`, within `size` bytes (the module's docstring says how).

    Args:
        directory: created when missing.
        size: the most bytes of files kept there, the least recently used removed first.

    Raises:
        InvalidParamsError: the directory cannot be created or written.
    """

    def __init__(self, directory: str | os.PathLike, size: int = DIR_SIZE) -> None:
        self.directory = open_cache_dir(directory)
        self.size = size
        self.writable = True  # False after a write failed (said once): the cache goes on in RAM
        try:
            self.build = "llama-cpp-python " + importlib.metadata.version("llama-cpp-python")
        except importlib.metadata.PackageNotFoundError:
            self.build = "llama-cpp-python ?"
        self._lock = threading.Lock()  # the index, the queue and the writer: the engine's thread and the writer's
        self._index: dict[str, DiskEntry] = {}
        self._queue: deque[tuple[str, str, list[int], bytes, bool]] = deque()
        self._pending = 0  # bytes in the queue
        self._writer: threading.Thread | None = None
        self._stamp = 0  # the last mtime set (ns): strictly increasing, so the order of uses survives a coarse clock
        self._said: set[str] = set()  # the causes already warned of (a damaged file): once each, then INFO
        self._scan()

    def __len__(self) -> int:
        return len(self._index)

    def identity(self, namespace: str, model_path: str | os.PathLike) -> str:
        """What a state is restored only into: `namespace`, the model file as it is now, and this build."""
        st = os.stat(model_path)
        return f"{namespace}\n{os.path.realpath(model_path)}\n{st.st_size}\n{st.st_mtime_ns}\n{self.build}"

    def lookup(self, identity: str, tokens: list[int], most: int, *, trims: bool) -> tuple[DiskEntry, int] | None:
        """The file of `identity` that gives more than `most` of `tokens` (as `PromptCache.best`), and how many."""
        with self._lock:
            entries = [e for e in self._index.values() if e.identity == identity]
        found = None
        for entry in entries:
            n = common_prefix(entry.tokens, tokens)
            if (trims or n == len(entry.tokens)) and n > most:
                found, most = entry, n
        return None if found is None else (found, most)

    def read(self, entry: DiskEntry) -> bytes | None:
        """`entry`'s state, checked; None when its file is damaged (said, removed) or gone."""
        path = self.directory / entry.name
        try:
            _, state = self._open(path, state=True)
        except FileNotFoundError:  # another process sharing the directory removed it
            self._forget(entry.name)
            return None
        except Damaged as e:
            self._damaged(path, str(e))
            return None
        self._stamp_file(path)
        return state

    def touch(self, identity: str, tokens: list[int]) -> None:
        """Mark the file of these tokens, if there is one, as just used."""
        name = _file_name(identity, tokens)
        with self._lock:
            known = name in self._index
        if known:
            self._stamp_file(self.directory / name)

    def put(self, identity: str, tokens: list[int], state: bytes, *, trims: bool) -> None:
        """Write this state to its file in the background (none when it is there already, or larger than the
        directory's size, or the writer is too far behind, or it holds an image: it stays in RAM — an image's ids are
        this process's own, core/media.py)."""
        if tokens and min(tokens) < 0:
            return
        name = _file_name(identity, tokens)
        with self._lock:
            if not self.writable or len(state) >= self.size:
                return
            if name in self._index:
                known = True
            elif self._queue and self._pending + len(state) > PENDING_MAX:
                log.debug("prompt cache: %s is behind; this state stays in RAM", self.directory)
                return
            else:
                known = False
                self._queue.append((name, identity, list(tokens), state, trims))
                self._pending += len(state)
                if self._writer is None:
                    # Not a daemon: a process that ends waits for the states it saved to be on disk.
                    self._writer = threading.Thread(target=self._drain, name="prompt-cache-writer")
                    self._writer.start()
        if known:  # the same tokens of the same model: the same state
            self._stamp_file(self.directory / name)

    def flush(self) -> None:
        """Wait until the writer has written what was put."""
        with self._lock:
            writer = self._writer
        if writer is not None:
            writer.join()

    def _scan(self) -> None:
        """Read every state file's header into the index; remove damaged ones and interrupted writes."""
        try:
            names = sorted(os.listdir(self.directory))
        except OSError as e:
            self._give_up(e)
            return
        for name in names:
            path = self.directory / name
            if name.endswith(SUFFIX):
                try:
                    self._index[name], _ = self._open(path, state=False)
                except FileNotFoundError:
                    continue
                except Damaged as e:
                    self._damaged(path, str(e))
            elif name.startswith(".") and name.endswith(TEMP):
                with suppress(OSError):
                    if time.time() - path.stat().st_mtime > TEMP_STALE:
                        path.unlink()

    def _open(self, path: Path, *, state: bool) -> tuple[DiskEntry, bytes | None]:
        """A state file's header (and with `state`, its state), checked. Raises FileNotFoundError, Damaged."""
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(_HEAD.size)
                if len(head) < _HEAD.size:
                    raise Damaged(f"truncated: {size} bytes")
                magic, version, n_identity, n_tokens, n_state, state_crc = _HEAD.unpack(head)
                if magic != MAGIC or version != FORMAT:
                    raise Damaged("not a prompt state of this localspec")
                offset = _HEAD.size + n_identity + 4 * n_tokens + _CRC.size
                if size != offset + n_state:
                    raise Damaged(f"{size} bytes where its header says {offset + n_state}: cut short or not ours")
                rest = f.read(offset - _HEAD.size)
                if zlib.crc32(head + rest[: -_CRC.size]) != _CRC.unpack(rest[-_CRC.size :])[0]:
                    raise Damaged("its header's checksum is wrong")
                data = f.read(n_state) if state else None
        except FileNotFoundError:
            raise
        except OSError as e:
            raise Damaged(f"unreadable: {e.strerror or e}") from None
        if data is not None and (len(data) != n_state or zlib.crc32(data) != state_crc):
            raise Damaged("its state's checksum is wrong")
        try:
            identity = rest[:n_identity].decode("utf-8")
        except UnicodeDecodeError:
            raise Damaged("its identity is not text") from None
        tokens = np.frombuffer(rest, dtype="<i4", count=n_tokens, offset=n_identity).tolist()
        return DiskEntry(path.name, identity, tokens, offset, n_state, state_crc), data

    def _drain(self) -> None:
        """The writer thread: write the queued states until none is left (it ends then; `put` starts another)."""
        while True:
            with self._lock:
                if not self._queue or not self.writable:
                    self._queue.clear()
                    self._pending = 0
                    self._writer = None
                    return
                job = self._queue.popleft()
                self._pending -= len(job[3])
            try:
                self._write(*job)
            except Exception as e:  # never a traceback from a cache: said once, and RAM alone from then on
                self._give_up(e)

    def _write(self, name: str, identity: str, tokens: list[int], state: bytes, trims: bool) -> None:
        """Write one state file crash-safe (temp file, fsync, rename), within the size; remove what it covers."""
        ident, state_crc = identity.encode("utf-8"), zlib.crc32(state)
        head = _HEAD.pack(MAGIC, FORMAT, len(ident), len(tokens), len(state), state_crc)
        head += ident + np.asarray(tokens, dtype="<i4").tobytes()
        head += _CRC.pack(zlib.crc32(head))
        path = self.directory / name
        temp = self.directory / f".{name}.{os.getpid()}{TEMP}"
        try:
            self._trim(len(head) + len(state), keep=name)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, head)
                _write_all(fd, state)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, path)
            _fsync_dir(self.directory)
        except OSError as e:
            with suppress(OSError):
                os.unlink(temp)
            self._give_up(e)
            return
        self._stamp_file(path)
        self._trim(len(head) + len(state), keep=name)  # another process may have written meanwhile: the size holds
        with self._lock:
            self._index[name] = DiskEntry(name, identity, tokens, len(head), len(state), state_crc)
            covered = [  # a state that can be cut back serves every prefix of its tokens
                e.name
                for e in self._index.values()
                if trims and e.identity == identity and e.name != name and tokens[: len(e.tokens)] == e.tokens
            ]
        for other in covered:
            self._remove(other)

    def _trim(self, need: int, keep: str) -> None:
        """Remove the least recently used state files but `keep` until `need` more bytes fit in the size, counting the
        directory's files as they are now: every process's, its writes in progress too (another process's temp
        file is counted, never removed)."""
        files, total = [], 0
        with os.scandir(self.directory) as listing:
            for item in listing:
                ours = item.name.endswith(SUFFIX)
                if not (ours or (item.name.startswith(".") and item.name.endswith(TEMP))) or item.name == keep:
                    continue
                try:
                    st = item.stat(follow_symlinks=False)
                except FileNotFoundError:  # another process removed it (or renamed its temp file) meanwhile
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                total += st.st_size
                if ours:
                    files.append((st.st_mtime_ns, st.st_size, item.name))
        for _, size, name in sorted(files):
            if total + need <= self.size:
                break
            self._remove(name)
            total -= size

    def _remove(self, name: str) -> None:
        self._forget(name)
        with suppress(FileNotFoundError):
            os.unlink(self.directory / name)

    def _forget(self, name: str) -> None:
        with self._lock:
            self._index.pop(name, None)

    def _stamp_file(self, path: Path) -> None:
        """Set the file's mtime to now: the order the least recently used is chosen by."""
        with self._lock:
            self._stamp = max(time.time_ns(), self._stamp + 1)
            stamp = self._stamp
        with suppress(OSError):
            os.utime(path, ns=(stamp, stamp))

    def _damaged(self, path: Path, why: str) -> None:
        """Remove a damaged file: the first one a warning (the terminal sees it), the others a line in the log."""
        with self._lock:
            first = "damaged" not in self._said
            self._said.add("damaged")
        log.log(
            logging.WARNING if first else logging.INFO,
            "prompt cache: removed %s (%s); its prompt is read again when it comes back%s",
            path,
            why,
            " (any other damaged file: in the log alone)" if first else "",
        )
        self._forget(path.name)
        with suppress(OSError):
            path.unlink()

    def _give_up(self, e: Exception) -> None:
        """One warning for a directory that cannot take more, and RAM alone from then on."""
        with self._lock:
            if not self.writable:
                return
            self.writable = False
        code = getattr(e, "errno", None)
        if code in (errno.ENOSPC, errno.EDQUOT):
            what, fix = "is full", "free space there, or give it a smaller size (--cache-dir DIR:SIZE)"
        elif code in (errno.EACCES, errno.EPERM, errno.EROFS):
            what, fix = "cannot be written", "make it writable, or give another --cache-dir"
        else:
            what, fix = "could not be written", "check the disk, or give another --cache-dir"
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
        log.warning(
            "prompt cache: %s %s (%s): earlier prompts are kept in RAM only; %s", self.directory, what, reason, fix
        )


def _file_name(identity: str, tokens: list[int]) -> str:
    digest = hashlib.sha256(identity.encode("utf-8") + b"\0" + np.asarray(tokens, dtype="<i4").tobytes())
    return digest.hexdigest()[:32] + SUFFIX


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (where the system can open a directory: not on Windows)."""
    with suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
