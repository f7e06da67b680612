"""Answers that need no registry: `list`, `describe`, and a mistyped suite, name or --set value, read from the
cached catalogue (harness/plan/catalogue.py), so that they come back before torch would have loaded."""

from __future__ import annotations

import sys

from harness.commands.arguments import parse_sets


def answer_from_catalogue(args) -> int | None:
    """`list`, `describe` and a mistyped name or --set value of `run`/`tune`, answered from the cached
    catalogue (harness/plan/catalogue.py) without importing torch; None: the command goes the full way."""
    if getattr(args, "suite", None) and args.command in ("bench", "leaderboard", "scaling", "tune"):
        from harness.plan.suite import SuiteError, suite_path

        try:
            for name in args.suite if isinstance(args.suite, list) else [args.suite]:
                suite_path(name)
        except SuiteError as exc:
            print(f"attnbench: error: {exc}", file=sys.stderr)
            return 2
    if getattr(args, "plugin", None) or args.command not in ("list", "describe", "run", "tune"):
        return None
    from harness.plan import catalogue

    known = catalogue.load()
    if known is None:
        return None
    if args.command == "list":
        print("".join(known["list"][what] for what in (("variants", "tasks", "suites") if args.what == "all" else (args.what,))), end="")
        return 0
    if args.command == "describe":
        if args.name in known["describe"]:
            print(known["describe"][args.name])
            return 0
        from harness.plan.describe import unknown_task_or_variant

        print(f"attnbench: error: {unknown_task_or_variant(args.name, [*known['tasks'], *known['variants']])}", file=sys.stderr)
        return 2
    if args.task is None or args.variant is None:
        return None
    try:
        params, attention = parse_sets(args.set)
    except ValueError:
        return None  # the full path words it
    problem = catalogue.check_run(known, args.task, args.variant, params, attention)
    if problem:
        print(f"attnbench: error: {problem}", file=sys.stderr)
        return 2
    return None
