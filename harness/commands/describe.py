"""`attnbench describe NAME`: every parameter of a task or variant.

Usually answered from the cached catalogue (from_catalogue.py) before this module's `main` runs; `main` is
the full way, taken when the sources changed or with --plugin, and it rebuilds the cache."""

from __future__ import annotations

import argparse

NAME = "describe"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="every parameter of a task or variant: type, range, default (per host) and source")
    p.add_argument("name", help="a task or variant name (see `attnbench list`)")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE.py")
    return p


def main(args) -> int:
    from harness.plan import catalogue
    from harness.plan.describe import describe

    print(describe(args.name))
    if not args.plugin:
        catalogue.refresh()
    return 0
