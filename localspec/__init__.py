"""localspec: local chat with exact speculative decoding on llama.cpp.

Layers, each a folder that says what it owns: `llama` (every native call) ← `core` (the engine) ← `models`
(pairs on disk) ← `bench` (speed measured side by side), `tui` (the chat app), `server` (the OpenAI-compatible
HTTP API) ← `cli` ← `__main__`; `errors`, `paths` and `progress` (the stderr progress line) are leaves.
Importing the package does no work.
"""

__version__ = "0.1.0"
