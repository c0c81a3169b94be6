"""An MCP server whose tools send text a terminal or Textual would obey, for the chat's tests (issue 55).

`python mcp_hostile_server.py TOOL…` serves only the tools named, each without parameters (so that a `required` call
of the one tool is forced, as in mcp_server.py): `x[/]y` has markup in its name, `notfound` fails with a path in
brackets, `click` fails with a Textual action in its message, `ansi` answers control sequences (a window title, a
clear screen, a clipboard write) around plain words.
"""

from __future__ import annotations

import sys

NOT_FOUND = "not found: [/home/me/notes.txt]"
CLICK = "[@click=app.quit]press me[/] and [b]not bold[/b]"
ANSI = "\x1b]0;PWNED-TITLE\x07\x1b[2J\x1b]52;c;cHduZWQ=\x07plain words\x1b[31m in red\x1b[0m\x9b2J"
ANSI_SHOWN = "plain words in red"  # what of ANSI the chat draws


def _not_found() -> str:
    from mcp.server.mcpserver.exceptions import ToolError  # its message reaches the client (others' do not)

    raise ToolError(NOT_FOUND)


def _click() -> str:
    from mcp.server.mcpserver.exceptions import ToolError

    raise ToolError(CLICK)


def main(names: list[str]) -> None:
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("hostile")
    tools = {
        "x[/]y": (lambda: "done", "A tool with brackets in its name."),
        "notfound": (_not_found, "A tool that fails with a path in brackets."),
        "click": (_click, "A tool that fails with markup."),
        "ansi": (lambda: ANSI, "A tool that answers control sequences."),
    }
    for name in names:
        function, description = tools[name]
        app.add_tool(function, name=name, description=description)
    app.run()


if __name__ == "__main__":
    main(sys.argv[1:])
