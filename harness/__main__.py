"""`python -m harness ...`: the `attnbench` command (harness/cli.py), for environments where the console script
is not on PATH (a bare checkout, a cluster module's Python)."""

import sys

from harness.cli import main

if __name__ == "__main__":  # imported (the import-graph test imports every module), it runs nothing
    sys.exit(main())
