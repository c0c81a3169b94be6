"""`python -m localspec` and the `localspec` console script: the command line, behind a Ctrl+C guard.

The console script calls `run` here (pyproject's [project.scripts]), not `localspec.cli.main`: importing the command
line takes a while (argparse, every subcommand's module), and a Ctrl+C meanwhile exits 130 quietly, as one later does.
"""

import sys


def run() -> int:
    """Import the command line and run it; a Ctrl+C while the imports still run (or one `main` lets through) exits
    130 without a traceback."""
    try:
        from localspec.cli.main import main

        return main()
    except KeyboardInterrupt as e:
        code = getattr(e, "exit_code", 130)  # `Interrupted`: 143 for SIGTERM
        print("localspec: terminated" if code == 143 else "localspec: interrupted", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(run())
