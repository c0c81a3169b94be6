"""The speculative decoding core: parameters and the option table, laws (laws.py) and the sampling transform that
builds them, verification, the drafters behind one protocol (a draft model, n-gram lookup, a draft with another
vocabulary through the bridge, the target's own MTP head), the draft-length policy, stats, the KV owner, the step
and the one generation loop, the GPU placement plan and the loading policy, context shifting, chat sessions and a
reasoning model's thinking.

It imports only `localspec.core`, `localspec.llama` and `localspec.errors`: no UI, no pydantic, no files of ours.
"""
