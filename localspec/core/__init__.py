"""The speculative decoding core: parameters, sampling, verification, drafters, the draft-length policy, stats,
the KV owner, the one generation loop, context shifting and chat sessions.

It imports only `localspec.core`, `localspec.llama` and `localspec.errors`: no UI, no pydantic, no files of ours.
"""
