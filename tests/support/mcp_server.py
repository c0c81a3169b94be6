"""A small MCP server for the chat's tests, on the official SDK (`MCPServer`, mcp 2's FastMCP), over stdio.

`python mcp_server.py TOOL…` serves only the tools named, each without parameters: with one tool of no parameters a
`required` call is forced token by token (the answer's grammar leaves one way to write it), so even the tiny test
models call it for certain. `secret` answers a fixed sentence, `fail` raises, `hang` never answers, `big` answers
10 MB, `wide` has a description of some 16,000 characters (its tools alone overflow a small context); `--crash`
exits before speaking MCP, `--silent` never answers anything, not even `initialize` (nor reads its stdin: it outlives
its stdin closing), `--no-listing` starts but never answers `tools/list`; `--pidfile PATH` writes its process id
there first.
"""

from __future__ import annotations

import os
import sys
import time

SECRET = "The secret word is PINEAPPLE."
WIDE = "A tool whose description is long. " * 480


def main(args: list[str]) -> None:
    if "--pidfile" in args:
        at = args.index("--pidfile")
        with open(args[at + 1], "w") as f:
            f.write(str(os.getpid()))
        del args[at : at + 2]
    if "--crash" in args:
        print("this is not MCP", file=sys.stderr)
        sys.exit(3)
    if "--silent" in args:
        time.sleep(3600)
    from mcp.server.mcpserver import MCPServer

    app = (_no_listing_server() if "--no-listing" in args else MCPServer)("localspec-test")
    tools = {
        "secret": (lambda: SECRET, "The secret word of the day."),
        "fail": (_fail, "A tool that always fails."),
        "hang": (_hang, "A tool that never answers."),
        "big": (lambda: "x" * 10_000_000, "Ten megabytes of text."),
        "wide": (lambda: "wide", WIDE),
    }
    for name in args:
        if not name.startswith("--"):
            function, description = tools[name]
            app.add_tool(function, name=name, description=description)
    app.run()


def _fail() -> str:
    raise ValueError("the tool broke on purpose")


def _hang() -> str:
    time.sleep(3600)
    return "never"


def _no_listing_server() -> type:
    import anyio
    from mcp.server.mcpserver import MCPServer

    class NoListing(MCPServer):
        async def list_tools(self):  # tools/list is received and never answered
            await anyio.sleep_forever()

    return NoListing


if __name__ == "__main__":
    main(sys.argv[1:])
