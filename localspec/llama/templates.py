"""Chat templates: a GGUF's own Jinja template (through llama-cpp-python's formatter) or one of llama.cpp's
built-in templates by name. Which one a conversation uses is `core.session.ChatFormat`'s decision.
Templates may read variables besides the messages (Qwen3's `enable_thinking`): `template_variables` says which.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import llama_cpp
from llama_cpp import llama_chat_format

from localspec.errors import ChatTemplateError

from .log import init


def render_jinja_chat(
    template: str,
    messages: list[dict[str, str]],
    *,
    bos: str,
    eos: str,
    add_generation_prompt: bool = True,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """Render a conversation with a GGUF/Hugging Face Jinja chat template.

    Args:
        template: the Jinja source.
        messages: role/content dicts (an assistant's may carry `reasoning_content`).
        bos: the text of the BOS token, for templates that write it.
        eos: the text of the EOS token.
        add_generation_prompt: end with the assistant's turn opened.
        variables: more template variables (e.g. `enable_thinking`).

    Raises:
        ChatTemplateError: the template does not render.
    """
    formatter = llama_chat_format.Jinja2ChatFormatter(
        template, eos_token=eos, bos_token=bos, add_generation_prompt=add_generation_prompt
    )
    try:
        return formatter(messages=messages, **dict(variables or {})).prompt
    except Exception as e:  # Jinja raises many types; a template bug must not crash the app
        raise ChatTemplateError(f"the chat template failed to render: {e} — pass --chat-template NAME") from e


def template_variables(template: str) -> frozenset[str]:
    """The variables a Jinja template reads without setting them (`messages`, `enable_thinking`, …).

    A template that does not parse reads nothing: rendering it reports the error.
    """
    # the formatter's own extensions, so that a template it renders also parses here
    extensions = [llama_chat_format.Jinja2ChatFormatter.IgnoreGenerationTags, jinja2.ext.loopcontrols]
    try:
        return frozenset(
            jinja2.meta.find_undeclared_variables(jinja2.Environment(extensions=extensions).parse(template))
        )
    except jinja2.TemplateError:
        return frozenset()


def builtin_chat_templates() -> list[str]:
    """Names of llama.cpp's built-in chat templates (chatml, llama3, gemma, …)."""
    init()
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    arr = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(arr, n)
    return sorted(name.decode() for name in arr)


def render_builtin_chat(name: str, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
    """Render a conversation with one of llama.cpp's built-in templates by name.

    Raises:
        ChatTemplateError: unknown template name.
    """
    names = builtin_chat_templates()
    if name not in names:
        raise ChatTemplateError(f"unknown chat template {name!r}: choose one of {', '.join(names)}")
    keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
    chat = (llama_cpp.llama_chat_message * len(keep))(*[llama_cpp.llama_chat_message(r, c) for r, c in keep])
    size = 1024 + 2 * sum(len(r) + len(c) for r, c in keep)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(keep), add_generation_prompt, buf, size)
    if n > size:
        buf = ctypes.create_string_buffer(n)
        n = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(keep), add_generation_prompt, buf, n)
    if n < 0:
        raise ChatTemplateError(f"llama.cpp could not apply chat template {name!r}")
    return buf.raw[:n].decode("utf-8", errors="replace")
