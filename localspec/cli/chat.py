"""`localspec chat`: the chat subcommand's flags, turned into the app's `ChatOptions`, and the app run.

Everything Textual is in `localspec.tui`, which never imports the CLI: this module is the one bridge.
"""

from __future__ import annotations

import argparse

from localspec.paths import Paths

from .flags import add_model_args, add_sampling_args, overrides_from_args


def register(subparsers) -> None:
    """Add `chat` to the `localspec` command."""
    chat = subparsers.add_parser("chat", help="chat in the terminal, watching speculative decoding work")
    add_model_args(chat)
    add_sampling_args(chat)
    chat.add_argument("--system", help="system prompt of new conversations")
    chat.set_defaults(func=_chat)


def chat_options(args: argparse.Namespace, paths: Paths):
    """The app's `ChatOptions` from the `chat` subcommand's flags (already checked by `check_run_args`)."""
    from localspec.tui.settings import ChatOptions

    return ChatOptions(
        pair=args.pair,
        target=args.target,
        draft=args.draft,
        drafter=args.drafter,
        n_ctx=args.n_ctx,
        n_gpu_layers=args.n_gpu_layers,
        threads=args.threads,
        rpc=tuple(args.rpc or ()),
        chat_template=args.chat_template,
        system=args.system,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop or ()),
        overrides=overrides_from_args(args),
        paths=paths,
    )


def _chat(args: argparse.Namespace, paths: Paths) -> int:
    from localspec.tui.app import make_app

    app = make_app(chat_options(args, paths))
    app.run()
    return app.return_code or 0
