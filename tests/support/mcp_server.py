"""A small MCP server for the chat's tests, on the official SDK (`MCPServer`, mcp 2's FastMCP), over stdio.

`python mcp_server.py TOOL…` serves only the tools named, each without parameters: with one tool of no parameters a
`required` call is forced token by token (the answer's grammar leaves one way to write it), so even the tiny test
models call it for certain. `secret` answers a fixed sentence, `fail` raises, `hang` never answers, `big` answers
10 MB; `--crash` exits before speaking MCP.
"""

from __future__ import annotations

import sys
import time

SECRET = "The secret word is PINEAPPLE."


def main(names: list[str]) -> None:
    if "--crash" in names:
        print("this is not MCP", file=sys.stderr)
        sys.exit(3)
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("localspec-test")
    tools = {
        "secret": (lambda: SECRET, "The secret word of the day."),
        "fail": (_fail, "A tool that always fails."),
        "hang": (_hang, "A tool that never answers."),
        "big": (lambda: "x" * 10_000_000, "Ten megabytes of text."),
    }
    for name in names:
        function, description = tools[name]
        app.add_tool(function, name=name, description=description)
    app.run()


def _fail() -> str:
    raise ValueError("the tool broke on purpose")


def _hang() -> str:
    time.sleep(3600)
    return "never"


if __name__ == "__main__":
    main(sys.argv[1:])
