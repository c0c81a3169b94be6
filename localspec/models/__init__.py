"""Models on this machine: the models.toml catalog (pydantic), the Hub, the offline demo pair, pairs as files,
and loading a pair into an `Engine` with flag → pair → default precedence.

It imports `localspec.core`, `localspec.llama`, `localspec.errors` and `localspec.paths`; never the UI or the CLI.
"""
