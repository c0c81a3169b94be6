"""`localspec generate`: the scripting face of the engine — complete a prompt (or stdin), N times, as text or JSON.

The prompt is read as text (bytes that are not UTF-8 become U+FFFD, with a note), wrapped in the chat template
with --chat, and fitted to the context (--truncate drops its start). Signals end it between steps. With --chat, a
reasoning model's thinking is split from its answer (DESIGN §10): it streams to stderr, and --json has it apart.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import numpy as np

from localspec.errors import ContextError, InvalidParamsError, WorkerLostError
from localspec.models.flags import RunFlags
from localspec.paths import Paths
from localspec.progress import StatusLine

from .checks import check_run_args, read_images
from .flags import add_model_args, add_sampling_args
from .interrupts import SignalGuard
from .textinput import clean, read_stream, replaced_notice


def register(sub) -> None:
    """Add `generate` to the `localspec` command."""
    gen = sub.add_parser(
        "generate",
        help="complete a prompt (stdin when PROMPT is absent)",
        description="Complete a prompt with exact speculative decoding: the text on stdout, one stats line on stderr. "
        "Docs: docs/usage.md.",
    )
    gen.add_argument(
        "prompt",
        nargs="?",
        help="the prompt; read from stdin when absent (bytes that are not UTF-8 become U+FFFD, with a note)",
    )
    add_model_args(gen)
    add_sampling_args(gen)
    gen.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="a picture before the prompt (repeatable; PNG, JPEG, GIF or BMP): needs a pair that reads images "
        "(--mmproj, or a pair with mmproj in models.toml)",
    )
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--system", help="system prompt (with --chat)")
    gen.add_argument("--n", type=int, default=1, help="independent completions of the same prompt")
    gen.add_argument("--json", action="store_true", help="one JSON object per completion per line")
    shape = gen.add_mutually_exclusive_group()
    shape.add_argument(
        "--json-schema", metavar="FILE", help="the answer is JSON that validates against this JSON schema"
    )
    shape.add_argument("--grammar", metavar="FILE", help="the answer matches this grammar (Lark or llama.cpp's GBNF)")
    gen.add_argument(
        "--truncate",
        action="store_true",
        help="drop the start of a prompt too long for the context (default: an error)",
    )
    gen.set_defaults(func=run)


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


def run(args: argparse.Namespace, paths: Paths) -> int:
    """`localspec generate`: check the flags, load, complete the prompt N times (exit 130 / 143 on a signal)."""
    run = check_run_args(args)
    with SignalGuard() as guard:  # SIGINT / SIGTERM: exit 130 / 143, caches consistent
        return _generate_guarded(args, run, paths, guard)


def _generate_guarded(args: argparse.Namespace, run: RunFlags, paths: Paths, guard: SignalGuard) -> int:
    from localspec.models.loading import open_engine, sampling_params, speculative_params

    prompt, notices = _read_prompt(args)
    images = tuple(image for _, image in read_images(args.image))
    grammar = _grammar(args)
    with open_engine(run, paths) as (engine, defaults):
        guard.check()  # a signal during loading that a llama.cpp log callback swallowed
        for note in (defaults.notice, engine.drafting_note, *(engine.plan.warnings if engine.plan else ())):
            if note:
                print(f"localspec: note: {note}", file=sys.stderr)
        sampling, spec = sampling_params(run.overrides, defaults), speculative_params(run.overrides, defaults)
        splitter = None
        if args.chat:
            from localspec.core.session import ChatFormat, Message

            user = Message("user", prompt, images=images)
            messages = ([Message("system", run.system)] if run.system else []) + [user]
            fmt = ChatFormat(
                engine.target_model, run.chat_template or defaults.chat_template, images=engine.image_tokens
            )
            think = _think(fmt, run, defaults, args)
            tokens = fmt.tokens(messages, think=think)
            splitter = functools.partial(fmt.splitter, think)
        elif images:  # the pictures first, then the text (BOS as the model wants)
            pictures = [t for image in images for t in engine.image_tokens(image)]
            tokens = [*engine.tokenize(""), *pictures, *engine.tokenize(prompt, add_special=False)]
        else:
            tokens = engine.tokenize(prompt)
        if images and args.truncate and len(tokens) >= engine.n_ctx:
            raise ContextError(
                f"the prompt and its images are {len(tokens)} tokens but the context holds {engine.n_ctx}, and "
                "--truncate does not cut a picture: shorten the prompt, or raise --n-ctx"
            )
        tokens, truncated = _fit_prompt(
            tokens, engine.n_ctx, args.truncate, run.max_tokens, engine.target_model.info.bos
        )
        notices += truncated
        for note in notices:
            print(f"localspec: note: {note}", file=sys.stderr)
        rng = np.random.default_rng(sampling.seed)  # one stream: the N completions are independent draws
        for i in range(args.n):
            gen = engine.generate(
                tokens, sampling=sampling, spec=spec, max_tokens=run.max_tokens, stop=run.stop, rng=rng, grammar=grammar
            )
            gen.notices.extend(notices)
            gen.on_prefill = _prefill_line(StatusLine())
            guard.generation = gen  # a signal now ends it between steps
            split = splitter() if splitter is not None else None
            try:
                _run_one(gen, split, args, last=i == args.n - 1 or guard.signum is not None, printed=len(notices))
            except WorkerLostError as e:
                raise e.instead(_after_loss(args, i)) from None
            guard.generation = None
            guard.check()
    return 0


def _grammar(args: argparse.Namespace):
    """The grammar --json-schema or --grammar names (None: free text).

    Raises:
        InvalidParamsError: the file cannot be read, or the schema is not JSON.
    """
    from localspec.core.grammar import Grammar

    path = args.json_schema or args.grammar
    if path is None:
        return None
    flag = "--json-schema" if args.json_schema else "--grammar"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidParamsError(f"{flag} {path}: cannot read it ({e.__class__.__name__}: {e})") from None
    return Grammar.output_schema(text) if args.json_schema else Grammar("grammar", text)


def _think(fmt, run: RunFlags, defaults, args: argparse.Namespace) -> bool | None:
    """The thinking switch for this run: --think, else the pair's `thinking`; refused where the model cannot follow it.

    Raises:
        InvalidParamsError: the model's template has no switch (or the model does not think).
    """
    from localspec.core.thinking_support import choose_thinking, thinking_choice

    flag, pair = thinking_choice(run.think, "flag"), thinking_choice(defaults.thinking, "pair", args.pair)
    return choose_thinking(fmt.thinking, fmt.model.path.name, flag, pair)


def _run_one(gen, split, args: argparse.Namespace, *, last: bool, printed: int) -> None:
    """Run one completion: a JSON line, or streamed text, then its new notes and a stats line on stderr.

    `split`: the thinking/answer split (None without --chat): thinking streams to stderr, the answer to stdout.
    `printed`: how many of `gen.notices` (the prompt's) were already shown.
    """
    if args.json:
        for event in gen:
            if split is not None:
                split.feed(event, gen.stats)
        print(json.dumps(_completion_json(gen, split)), flush=True)
        return
    thinking = False
    for event in gen:
        pieces = split.feed(event, gen.stats) if split is not None else [("answer", event.text, False)]
        for part, text, _ in pieces:
            if part == "thinking":
                thinking = True
                sys.stderr.write(text)
                sys.stderr.flush()
                continue
            if thinking:  # the thinking ended: its own line on stderr
                thinking = False
                sys.stderr.write("\n")
                sys.stderr.flush()
            sys.stdout.write(text)
            sys.stdout.flush()
    if thinking:
        sys.stderr.write("\n")
    sys.stdout.write("\n" if last else "\n\n")
    sys.stdout.flush()
    for note in gen.notices[printed:]:
        print(f"localspec: note: {note}", file=sys.stderr)
    print(gen.stats.summary(), file=sys.stderr)
    if split is not None and split.thought:
        print(_parts_summary(split.parts()), file=sys.stderr)


def _parts_summary(parts) -> str:
    """One stderr line with the thinking and answer numbers."""

    def one(name: str, part) -> str:
        line = f"{name} {part.tokens} tokens"
        if part.drafted:
            line += f" (acceptance {part.acceptance_rate:.0%}, {part.tokens_per_pass:.2f} tokens/pass)"
        return line

    return ", ".join(one(name, part) for name, part in parts.items())


def _after_loss(args: argparse.Namespace, i: int) -> str:
    """What to do after a worker was lost in completion `i`, and what was printed of it."""
    which = f"completion {i + 1} of {args.n}" if args.n > 1 else "the completion"
    if args.json:
        return f"run the command again ({which} was cut short: --json printed nothing for it)"
    sys.stdout.write("\n")
    sys.stdout.flush()
    return f"run the command again ({which} was cut short: its text so far is printed above)"


def _prefill_line(line: StatusLine):
    """Progress of reading a long prompt, on one stderr line that the last step erases."""

    def show(model: str, done: int, total: int) -> None:
        if done < total:
            line.show(f"localspec: reading the prompt into the {model}: {done:,}/{total:,} tokens")
        else:
            line.clear()

    return show


def _completion_json(gen, split) -> dict:
    """One completion as JSON: with --chat, `text` is the answer and `reasoning` the thinking (markers out)."""
    return {
        "text": split.answer if split is not None else gen.text,
        "reasoning": split.reasoning if split is not None else "",
        "prompt_tokens": len(gen.prompt),
        "tokens": gen.tokens,
        "from_draft": gen.from_draft,
        "finish_reason": gen.finish_reason,
        "drafter": gen.engine.drafter.kind,
        "notices": gen.notices,
        "stats": gen.stats.to_dict(),
        "placement": gen.engine.plan.to_dict() if gen.engine.plan else None,
        "parts": {name: part.to_dict() for name, part in split.parts().items()} if split is not None else None,
    }
