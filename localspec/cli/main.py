"""The `localspec` command: argument parsing, logging set-up, and one-line errors.

Each subcommand lives in its own module (`generate`, `chat`, `bench`, `pairs`, `worker`, `serve`), which adds its
parser through `register`; this module builds the parser and dispatches. Every
`LocalspecError` ends as one line on stderr and exit code 1; llama.cpp's own log goes to the log file,
never over the user's terminal.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from localspec.errors import LocalspecError
from localspec.llama.log import LOG_NAME
from localspec.paths import Paths, get_paths

from . import bench, chat, generate, pairs, serve, worker
from .crashes import RunMark, restore_terminal, take_crashes
from .textinput import one_line

log = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + error
        if message.endswith("expected one argument"):  # the value began with '-' and was taken for a flag
            message += " (a value that starts with '-' goes after '=': --flag=VALUE)"
        self.exit(2, f"localspec: error: {one_line(message)} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="localspec",
        description="Local chat with exact speculative decoding on llama.cpp. Docs: README.md and docs/.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="also log to stderr")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    generate.register(sub)
    pairs.register(sub)
    bench.register(sub)
    chat.register(sub)
    worker.register(sub)
    serve.register(sub)
    return parser


_HANDLER_MARK = "_localspec_handler"  # set on the handlers setup_logging adds, so a later call replaces them


def setup_logging(verbose: bool, paths: Paths) -> None:
    """Log ours and llama.cpp's lines (its own channel, `llama.cpp`) to the log file; to stderr too with --verbose.

    Idempotent: the handlers an earlier call added are kept when they still fit (same file, same
    --verbose) and replaced otherwise, so calling `main()` again never logs a line twice.
    """
    loggers = [logging.getLogger(name) for name in ("localspec", LOG_NAME)]
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
    wanted = (str(paths.log_file), verbose)
    ours = [h for h in loggers[0].handlers if hasattr(h, _HANDLER_MARK)]
    if ours and all(getattr(h, _HANDLER_MARK) == wanted for h in ours):
        return
    for logger in loggers:
        for handler in [h for h in logger.handlers if hasattr(h, _HANDLER_MARK)]:
            logger.removeHandler(handler)
    for handler in ours:
        handler.close()
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        paths.log_file.parent.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(paths.log_file, encoding="utf-8", errors="backslashreplace")
        handler.setLevel(logging.INFO)
    except (OSError, ValueError):
        handler = logging.NullHandler()  # `localspec doctor` reports an unwritable log folder
    handlers = [handler]
    if verbose:
        handlers.append(logging.StreamHandler(sys.stderr))
        handlers[-1].setLevel(logging.INFO)
    for handler in handlers:
        handler.setFormatter(fmt)
        setattr(handler, _HANDLER_MARK, wanted)
        for logger in loggers:
            logger.addHandler(handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `localspec` console script."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")  # no encoding error on a non-UTF-8 terminal
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:  # --help, or a usage error already printed as one line
            return int(e.code or 0)
        paths = get_paths()  # the one place the environment picks the folders; handed down from here
        setup_logging(args.verbose, paths)
        args.notes = []  # what an earlier run left to tell (the chat shows it in its screen too)
        if args.command != "doctor":  # doctor puts it in its report
            for crash in take_crashes(paths):
                if crash.left_the_terminal:
                    restore_terminal(sys.stderr)
                log.warning("%s", crash.describe())
                print(f"localspec: note: {crash.describe()}", file=sys.stderr)
                args.notes.append(crash.describe())
        mark = RunMark(paths, one_line(" ".join(["localspec", *(sys.argv[1:] if argv is None else argv)]))[:120])
        try:
            return args.func(args, paths)
        finally:
            mark.close()
    except LocalspecError as e:
        log.info("error: %s", e)
        print(f"localspec: error: {one_line(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        code = getattr(e, "exit_code", 130)
        log.info("stopped by %s", "SIGTERM" if code == 143 else "SIGINT")
        print("localspec: terminated" if code == 143 else "localspec: interrupted", file=sys.stderr)
        return code
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
