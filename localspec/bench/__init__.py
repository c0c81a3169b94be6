"""`localspec bench`'s measuring: interleaved runs, the report, llama-server as the peer, and the RPC relay.

It imports the core, llama, models and the leaves; printing and flags are the CLI's (`localspec.cli.bench`).
"""
