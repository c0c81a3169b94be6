"""Chat templates: a GGUF's own Jinja template (through llama-cpp-python's formatter) or one of llama.cpp's
built-in templates by name. Which one a conversation uses is `core.session.ChatFormat`'s decision.
"""

from __future__ import annotations

import ctypes

import llama_cpp
from llama_cpp import llama_chat_format

from localspec.errors import ChatTemplateError

from .log import init


def render_jinja_chat(
    template: str, messages: list[dict[str, str]], *, bos: str, eos: str, add_generation_prompt: bool = True
) -> str:
    """Render a conversation with a GGUF/Hugging Face Jinja chat template.

    Raises:
        ChatTemplateError: the template does not render.
    """
    formatter = llama_chat_format.Jinja2ChatFormatter(
        template, eos_token=eos, bos_token=bos, add_generation_prompt=add_generation_prompt
    )
    try:
        return formatter(messages=messages).prompt
    except Exception as e:  # Jinja raises many types; a template bug must not crash the app
        raise ChatTemplateError(f"the chat template failed to render: {e} — pass --chat-template NAME") from e


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
