"""`localspec chat`: the Textual chat app over the engine.

This package registers the `chat` subcommand; everything Textual lives below it (`app` builds the app
with `make_app`). Importing the package does not import Textual or load anything. It takes its flags
from `localspec.flags` and never imports `localspec.cli`.
"""

from __future__ import annotations

import argparse

from localspec.cli.flags import add_model_args, add_sampling_args
from localspec.paths import Paths


def register(subparsers) -> None:
    """Add `chat` to the `localspec` command."""
    from .settings import DEFAULT_MAX_TOKENS

    chat = subparsers.add_parser("chat", help="chat in the terminal, watching speculative decoding work")
    add_model_args(chat)
    add_sampling_args(chat)
    chat.add_argument("--system", help="system prompt of new conversations")
    chat.set_defaults(func=_chat, max_tokens=DEFAULT_MAX_TOKENS)


def _chat(args: argparse.Namespace, paths: Paths) -> int:
    from .app import make_app
    from .settings import ChatOptions

    app = make_app(ChatOptions.from_args(args, paths))
    app.run()
    return app.return_code or 0
