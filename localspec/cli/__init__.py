"""The `localspec` command: one module per subcommand, plus the flags and the argument checks.

The progress line it writes is `localspec.progress`'s.

It may import every other layer; nothing imports it except `localspec.__main__` and the console script.
"""
