"""`python -m localspec`: the command line (a Ctrl+C while the imports still run exits 130 quietly too)."""

import sys

try:
    from localspec.cli.main import main
except KeyboardInterrupt:
    sys.exit(130)

sys.exit(main())
