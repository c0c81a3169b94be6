"""Where localspec keeps its files: the user's models.toml, the data folder, logs and the chat database.

Every path comes from `get_paths()`, which honours one environment variable, `LOCALSPEC_HOME` (everything
under one folder: tests and power users), and otherwise asks platformdirs. Nothing is created here: code
that writes a file creates its folder first. Downloaded model weights are not ours: they live in the
shared Hugging Face cache (`HF_HUB_CACHE` / `HF_HOME`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "localspec"
HOME_ENV = "LOCALSPEC_HOME"


@dataclass(frozen=True, slots=True)
class Paths:
    """The folders localspec reads and writes (none of them is guaranteed to exist)."""

    config_dir: Path
    data_dir: Path
    log_dir: Path

    @property
    def config_file(self) -> Path:
        """The user's models.toml overlay (adds and overrides bundled pairs)."""
        return self.config_dir / "models.toml"

    @property
    def demo_dir(self) -> Path:
        """Where the demo pair's derived full-precision target is written."""
        return self.data_dir / "demo"

    @property
    def db_path(self) -> Path:
        """The SQLite database of saved chats."""
        return self.data_dir / "chats.sqlite3"

    @property
    def rpc_cache_dir(self) -> Path:
        """Where `localspec worker --cache` keeps the weights clients sent, so a reload skips the transfer."""
        return self.data_dir / "rpc-cache"

    @property
    def log_file(self) -> Path:
        """The application log."""
        return self.log_dir / "localspec.log"


def get_paths(environ: Mapping[str, str] | None = None) -> Paths:
    """Compute localspec's folders.

    Args:
        environ: the environment to read (default `os.environ`).

    Returns:
        With `LOCALSPEC_HOME` set: config in it, data in `data/`, logs in `logs/`. Otherwise the
        platformdirs user config, data and log folders for the app name "localspec".
    """
    env = os.environ if environ is None else environ
    home = env.get(HOME_ENV)
    if home:
        root = Path(home).expanduser().absolute()
        return Paths(config_dir=root, data_dir=root / "data", log_dir=root / "logs")
    return Paths(
        config_dir=Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)),
        data_dir=Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)),
        log_dir=Path(platformdirs.user_log_dir(APP_NAME, appauthor=False)),
    )


def folder_problem(path: Path) -> str | None:
    """Why files cannot be created in `path` (which may not exist yet), or None when they can.

    The nearest existing ancestor decides: a regular file there, or no write permission, is a problem.
    (Root passes the permission test everywhere but on a read-only file system.)
    """
    for folder in (path, *path.parents):
        try:
            if not folder.exists():
                continue
        except (OSError, ValueError) as e:
            return f"cannot look at {folder}: {e.strerror or e}"
        if not folder.is_dir():
            return f"{folder} is a file, not a folder"
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"{folder} is not writable"
        return None
    return f"no part of {path} exists"
