"""The Textual chat app over the engine (`app.make_app` builds it for `localspec chat` and the tests).

Workers drive the engine and post messages; only handlers touch widgets. Importing the package does not import
Textual or load anything. It imports the core, models and the leaves — never the CLI (`localspec.cli.chat`
turns the flags into `settings.ChatOptions`).
"""
