"""The window sizes the chat app lays itself out for; its stylesheet is `chat.tcss` beside this file.

Layout: messages and the prompt on the left, the stats panel on the right. The `-provenance` class on
the screen swaps every answer's Markdown (and its thinking) for its draft-coloured text; a reasoning model's
thinking is a dimmed, foldable block above the answer. The app's breakpoints put one width
and one height class on each screen: below `STATS_WIDTH` columns the stats panel is hidden, below
`TALL_HEIGHT` rows the header goes and the prompt box shrinks, and below `MIN_WIDTH` × `MIN_HEIGHT` the whole
chat gives way to one line that says how big the window must be (the chat goes on underneath, nothing is lost).
"""

MIN_WIDTH = 20  # columns: the least the chat is drawn in (the prompt box keeps a few columns to type in)
MIN_HEIGHT = 8  # rows: footer, status, a 3-row prompt box and two rows of messages
STATS_WIDTH = 80  # columns: the stats panel (40) shows only when the chat keeps as much beside it
TALL_HEIGHT = 16  # rows: the header shows, and the prompt box may grow to 10 rows

HORIZONTAL_BREAKPOINTS = [(0, "-too-narrow"), (MIN_WIDTH, "-narrow"), (STATS_WIDTH, "-wide")]
VERTICAL_BREAKPOINTS = [(0, "-too-short"), (MIN_HEIGHT, "-short"), (TALL_HEIGHT, "-tall")]
TOO_SMALL = f"Make this window at least {MIN_WIDTH}×{MIN_HEIGHT}"
