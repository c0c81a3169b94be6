"""`localspec bench`'s measuring: one whole bench from its plan (suite.py), interleaved runs (run.py), the exactness
checks (exactness.py), the sampling yardstick (yardstick.py), the report, llama-server as the peer, the RPC relay, and
the servers' workloads: clients at once (clients.py) and agents taking turns (agents.py).

It imports the core, llama, models and the leaves; printing and flags are the CLI's (`localspec.cli.bench`).
"""
