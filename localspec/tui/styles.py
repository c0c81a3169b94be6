"""The chat app's stylesheet (Textual CSS), kept out of the app's logic.

Layout: messages and the prompt on the left, the stats panel on the right. The `-provenance` class on
the screen swaps every answer's Markdown for its draft-coloured text.
"""

CSS = """
#main { height: 1fr; }
#chat { width: 1fr; }
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
ChatMessage Markdown { margin: 0; padding: 0; }
ChatMessage .prov-body { display: none; }
Screen.-provenance ChatMessage.assistant .md-body { display: none; }
Screen.-provenance ChatMessage.assistant .prov-body { display: block; }
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
