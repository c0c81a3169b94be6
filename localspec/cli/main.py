"""The `localspec` command: argument parsing, logging set-up, and one-line errors.

Subcommands live where their work is: `generate` here (the scripting face of the engine), the pair
commands in `pairs_cli`, the chat app in `tui` (each adds its parsers through `register`). Every
`LocalspecError` ends as one line on stderr and exit code 1; llama.cpp's own log goes to the log file,
never over the user's terminal.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

import numpy as np

from localspec.errors import ContextError, LocalspecError
from localspec.paths import Paths, get_paths
from localspec.progress import StatusLine

from . import bench, chat, pairs, worker
from .checks import RunArgs, check_run_args
from .flags import add_model_args, add_sampling_args
from .interrupts import SignalGuard
from .textinput import clean, one_line, read_stream, replaced_notice

log = logging.getLogger("localspec.cli")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + error
        self.exit(2, f"localspec: error: {one_line(message)} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="localspec", description="Local chat with exact speculative decoding on llama.cpp.")
    parser.add_argument("-v", "--verbose", action="store_true", help="also log to stderr")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    gen = sub.add_parser("generate", help="complete a prompt (stdin when PROMPT is absent)")
    gen.add_argument(
        "prompt",
        nargs="?",
        help="the prompt; read from stdin when absent (bytes that are not UTF-8 become U+FFFD, with a note)",
    )
    add_model_args(gen)
    add_sampling_args(gen)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--system", help="system prompt (with --chat)")
    gen.add_argument("--n", type=int, default=1, help="independent completions of the same prompt")
    gen.add_argument("--json", action="store_true", help="one JSON object per completion per line")
    gen.add_argument(
        "--truncate",
        action="store_true",
        help="drop the start of a prompt too long for the context (default: an error)",
    )
    gen.set_defaults(func=_generate)
    pairs.register(sub)
    bench.register(sub)
    chat.register(sub)
    worker.register(sub)
    return parser


def _read_prompt(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The prompt as valid text, and a note when bytes had to be replaced."""
    if args.prompt is not None:
        prompt, replaced = clean(args.prompt)
    else:
        prompt, replaced = read_stream(getattr(sys.stdin, "buffer", None))
    return prompt, [replaced_notice(replaced, "the prompt")] if replaced else []


def _fit_prompt(
    tokens: list[int], n_ctx: int, truncate: bool, max_tokens: int, bos: int
) -> tuple[list[int], list[str]]:
    """The prompt's tokens if they fit the context; with --truncate, its end (and BOS) made to fit."""
    if len(tokens) < n_ctx:
        return tokens, []
    if not truncate:
        raise ContextError(
            f"the prompt is {len(tokens)} tokens but the context holds {n_ctx}: shorten it, raise "
            "--n-ctx, or pass --truncate to drop its start"
        )
    head = tokens[:1] if tokens[0] == bos else []
    keep = n_ctx - min(max_tokens, n_ctx // 2) - len(head)
    kept = head + tokens[len(tokens) - keep :]
    return kept, [
        f"the prompt was truncated: kept its last {len(kept)} of {len(tokens)} tokens to fit the {n_ctx}-token context"
    ]


def _generate(args: argparse.Namespace, paths: Paths) -> int:
    run = check_run_args(args)
    with SignalGuard() as guard:  # SIGINT / SIGTERM: exit 130 / 143, caches consistent
        return _generate_guarded(args, run, paths, guard)


def _generate_guarded(args: argparse.Namespace, run: RunArgs, paths: Paths, guard: SignalGuard) -> int:
    from localspec.models.loading import open_engine, sampling_params, speculative_params

    prompt, notices = _read_prompt(args)
    with open_engine(run, paths) as (engine, defaults):
        guard.check()  # a signal during loading that a llama.cpp log callback swallowed
        if defaults.notice:
            print(f"localspec: note: {defaults.notice}", file=sys.stderr)
        sampling, spec = sampling_params(run.overrides, defaults), speculative_params(run.overrides, defaults)
        if args.chat:
            from localspec.core.session import ChatFormat, Message

            messages = ([Message("system", run.system)] if run.system else []) + [Message("user", prompt)]
            tokens = ChatFormat(engine.target_model, run.chat_template or defaults.chat_template).tokens(messages)
        else:
            tokens = engine.tokenize(prompt)
        tokens, truncated = _fit_prompt(
            tokens, engine.n_ctx, args.truncate, run.max_tokens, engine.target_model.info.bos
        )
        notices += truncated
        for note in notices:
            print(f"localspec: note: {note}", file=sys.stderr)
        rng = np.random.default_rng(sampling.seed)  # one stream: the N completions are independent draws
        for i in range(args.n):
            gen = engine.generate(
                tokens, sampling=sampling, spec=spec, max_tokens=run.max_tokens, stop=run.stop, rng=rng
            )
            gen.notices.extend(notices)
            gen.on_prefill = _prefill_line(StatusLine())
            guard.generation = gen  # a signal now ends it between steps
            _run_one(gen, args, last=i == args.n - 1 or guard.signum is not None, printed=len(notices))
            guard.generation = None
            guard.check()
    return 0


def _run_one(gen, args: argparse.Namespace, *, last: bool, printed: int) -> None:
    """Run one completion: a JSON line, or streamed text, then its new notes and a stats line on stderr.

    `printed`: how many of `gen.notices` (the prompt's) were already shown.
    """
    if args.json:
        for _ in gen:
            pass
        print(json.dumps(_completion_json(gen)), flush=True)
        return
    for event in gen:
        sys.stdout.write(event.text)
        sys.stdout.flush()
    sys.stdout.write("\n" if last else "\n\n")
    sys.stdout.flush()
    for note in gen.notices[printed:]:
        print(f"localspec: note: {note}", file=sys.stderr)
    print(gen.stats.summary(), file=sys.stderr)


def _prefill_line(line: StatusLine):
    """Progress of reading a long prompt, on one stderr line that the last step erases."""

    def show(model: str, done: int, total: int) -> None:
        if done < total:
            line.show(f"localspec: reading the prompt into the {model}: {done:,}/{total:,} tokens")
        else:
            line.clear()

    return show


def _completion_json(gen) -> dict:
    return {
        "text": gen.text,
        "prompt_tokens": len(gen.prompt),
        "tokens": gen.tokens,
        "from_draft": gen.from_draft,
        "finish_reason": gen.finish_reason,
        "notices": gen.notices,
        "stats": gen.stats.to_dict(),
    }


_HANDLER_MARK = "_localspec_handler"  # set on the handlers setup_logging adds, so a later call replaces them


def setup_logging(verbose: bool, paths: Paths) -> None:
    """Log to the log file (llama.cpp's lines included); to stderr too with --verbose.

    Idempotent: the handlers an earlier call added are kept when they still fit (same file, same
    --verbose) and replaced otherwise, so calling `main()` again never logs a line twice.
    """
    root = logging.getLogger("localspec")
    root.setLevel(logging.DEBUG)
    root.propagate = False
    wanted = (str(paths.log_file), verbose)
    ours = [h for h in root.handlers if hasattr(h, _HANDLER_MARK)]
    if ours and all(getattr(h, _HANDLER_MARK) == wanted for h in ours):
        return
    for handler in ours:
        root.removeHandler(handler)
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
        root.addHandler(handler)


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
        return args.func(args, paths)
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
