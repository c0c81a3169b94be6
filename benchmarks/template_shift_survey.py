"""Which chat templates can be context-shifted: does dropping the oldest turns leave the rest's tokens alone?

For each llama.cpp built-in template (and the GGUF's own, if any), renders a 12-turn chat with a system
prompt from the first user message and from a later one, and checks with `window.plan_shift` that removing
one span of the first rendering gives exactly the second. Templates that fail get block drops instead
of shifts in a chat (`ChatSession`): correct, only slower.

    python benchmarks/template_shift_survey.py MODEL.gguf
"""

from __future__ import annotations

import sys

from localspec.core.session import ChatFormat, Message
from localspec.core.window import plan_shift
from localspec.errors import ChatTemplateError
from localspec.llama.model import Model
from localspec.llama.templates import builtin_chat_templates


def survey(fmt: ChatFormat) -> str:
    messages = [Message("system", "You are terse.")]
    for i in range(12):
        messages += [Message("user", f"Question {i}: what is {i} plus {i}?"), Message("assistant", f"It is {2 * i}.")]
    messages.append(Message("user", "And the last one?"))
    old = fmt.tokens(messages)
    new = fmt.tokens(messages[:1] + messages[1 + 6 :])
    plan = plan_shift(old, old, new)
    if plan is None:
        return "no single span"
    return "exact" if plan.exact else f"differs after {plan.reused} of {len(new)} tokens"


def main() -> int:
    with Model(sys.argv[1], vocab_only=True) as model:
        names = [None] if model.chat_template() else []
        for name in names + builtin_chat_templates():
            try:
                result = survey(ChatFormat(model, name))
            except ChatTemplateError as e:
                result = f"does not render: {e}"
            print(f"{name or 'GGUF template':16s} {result}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
