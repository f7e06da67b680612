"""`attnbench list`: the registered variants and tasks, and the suites.

Usually answered from the cached catalogue (from_catalogue.py) before this module's `main` runs; `main` is
the full way, taken when the sources changed or with --plugin, and it rebuilds the cache."""

from __future__ import annotations

import argparse

NAME = "list"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="list variants, tasks and suites")
    p.add_argument("what", nargs="?", choices=["variants", "tasks", "suites", "all"], default="all")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE.py")
    return p


def main(args) -> int:
    from harness.plan.describe import print_list

    print_list(args.what)
    if not args.plugin:
        from harness.plan import catalogue

        catalogue.refresh()
    return 0
