"""The chat app's stylesheet (Textual CSS) and the window sizes it lays itself out for.

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

CSS = """
#too-small { display: none; width: 1fr; height: 1fr; content-align: center middle; text-align: center; }
Screen.-too-narrow #too-small, Screen.-too-short #too-small { display: block; }
Screen.-too-narrow #main, Screen.-too-short #main { display: none; }
Screen.-too-narrow Header, Screen.-too-short Header, Screen.-short Header { display: none; }
Screen.-too-narrow Footer, Screen.-too-short Footer { display: none; }
Screen.-too-narrow #stats, Screen.-narrow #stats { display: none; }
Screen.-short PromptInput { max-height: 3; }
#main { height: 1fr; }
#chat { width: 1fr; min-width: 20; }
#messages { height: 1fr; padding: 0 1; }
#stats { width: 40; height: 1fr; padding: 0 1; border-left: vkey $panel-lighten-2; overflow-y: auto; }
#stats.-hidden { display: none; }
#status { height: 1; padding: 0 1; color: $text-muted; }
#progress { height: 1; padding: 0 1; display: none; }
#progress.-on { display: block; }
PromptInput { height: auto; min-height: 3; max-height: 10; }
ChatMessage { height: auto; margin: 0 0 1 0; padding: 0 1; }
ChatMessage:focus { background: $boost; }
ChatMessage.user { border-left: thick $accent; }
ChatMessage.assistant { border-left: thick $success; }
ChatMessage.system { border-left: thick $warning; color: $text-muted; }
ChatMessage .caption { color: $text-muted; }
ChatMessage .prov-body { display: none; }
Screen.-provenance ChatMessage.assistant .md-body { display: none; }
Screen.-provenance ChatMessage.assistant .prov-body { display: block; }
ChatMessage .thinking { background: transparent; border-top: none; padding: 0; margin: 0 0 1 0; }
ChatMessage .thinking.-empty { display: none; }
ChatMessage .thinking CollapsibleTitle { padding: 0; color: $text-muted; }
ChatMessage .thinking Contents { padding: 0 0 0 2; }
ChatMessage .think-body { color: $text-muted; text-style: italic; }
ChatMessage .think-prov { display: none; color: $text-muted; }
Screen.-provenance ChatMessage .think-body { display: none; }
Screen.-provenance ChatMessage .think-prov { display: block; }
ConfirmScreen, TextPromptScreen, PairScreen, SettingsScreen, HistoryScreen { align: center middle; }
.dialog { width: 72; max-width: 95%; height: auto; max-height: 95%; padding: 1 2; border: thick $primary;
          background: $surface; }
.dialog.wide { width: 110; }
.dialog DataTable { height: auto; max-height: 20; }
.dialog TextArea { height: 8; }
#form { grid-size: 2; grid-columns: 26 1fr; grid-rows: 1; grid-gutter: 1 0; height: auto; margin: 1 0; }
.buttons { height: auto; align-horizontal: right; }
#error { color: $error; height: auto; }
.hint { color: $text-muted; }
"""
