"""The `localspec` command: one module per subcommand, plus the flags, the argument checks and progress lines.

It may import every other layer; nothing imports it except `localspec.__main__` and the console script.
"""
