"""localspec: local chat with exact speculative decoding on llama.cpp.

The engine (`localspec.engine`, `localspec.session`) imports no UI and no pydantic; `localspec.backend`
is the only module that talks to llama.cpp. Importing the package does no work.
"""

__version__ = "0.1.0"
