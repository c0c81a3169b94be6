"""`localspec chat`: the chat subcommand's flags, turned into the app's `ChatOptions`, and the app run.

Everything Textual is in `localspec.tui`, which never imports the CLI: this module is the one bridge.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import signal
import sys

from localspec.errors import ConfigError, InvalidParamsError
from localspec.models.flags import RunFlags
from localspec.paths import Paths

from .checks import check_run_args
from .flags import add_model_args, add_sampling_args

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    """Add `chat` to the `localspec` command."""
    chat = subparsers.add_parser(
        "chat",
        help="chat in the terminal, watching speculative decoding work",
        description="Chat in the terminal with a pair, its speculative decoding shown live in a stats panel. "
        "Docs: docs/usage.md.",
    )
    add_model_args(chat)
    add_sampling_args(chat)
    chat.add_argument("--system", help="system prompt of new conversations")
    chat.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar="COMMAND_OR_URL",
        help="an MCP server whose tools the model may call (asked each time): a command line, run over stdio, or "
        "an http(s):// URL (streamable HTTP); repeat for more; beside those of mcp.toml in the config folder",
    )
    chat.set_defaults(func=_chat)


def chat_options(run: RunFlags, paths: Paths, mcp=None):
    """The app's `ChatOptions` from the `chat` subcommand's checked flags (and its MCP servers)."""
    from localspec.tui.settings import ChatOptions

    # ChatOptions has a field for each checked flag (and more the app alone sets: folders, test knobs).
    return ChatOptions(**{f.name: getattr(run, f.name) for f in dataclasses.fields(run)}, paths=paths, mcp=mcp)


def _chat(args: argparse.Namespace, paths: Paths) -> int:
    from localspec.tui.app import make_app
    from localspec.tui.mcp_client import MCP_FILE, load_mcp_config

    run = check_run_args(args)  # a bad flag first: it is the more specific error
    notes = list(getattr(args, "notes", ()))
    try:
        mcp = load_mcp_config(paths.config_dir / MCP_FILE, tuple(args.mcp))
    except ConfigError as e:  # the chat goes on without tools, and says why in its screen
        notes.append(f"no MCP tools: {e}")
        mcp = None
    options = chat_options(run, paths, mcp)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):  # the app would draw into a pipe and wait for keys forever
        raise InvalidParamsError(
            "chat needs a terminal for its screen and keys: from a script use `localspec generate --chat` or "
            "`localspec serve`"
        )
    # The CLI's notes (a crash of the last run) were printed before the app took the screen: show them in it too.
    app = make_app(options, notices=tuple(notes))
    app.run()
    if app.signalled is not None:  # the answer was saved as stopped and the terminal restored (SIGHUP: no terminal)
        log.info("chat ended by %s", signal.Signals(app.signalled).name)
        with contextlib.suppress(OSError):
            print(f"localspec: {'terminated' if app.signalled == signal.SIGTERM else 'hung up'}", file=sys.stderr)
    return app.return_code or 0
