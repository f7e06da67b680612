"""The `attnbench` command: parses arguments and hands each verb to its module in harness/commands/.

Each verb's module builds its own arguments (`add_parser`) and answers (`main`), importing what it needs
(torch, Lightning, the registries) only inside `main`, so that `--help` and a mistyped flag answer at once.
What every verb goes through stays here: the checks before anything heavy loads, the plugins, the logger,
the data root, and the errors that become exit status 2."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from harness.commands import bench, check, claims, describe, leaderboard, perf, probe, results, run, scaling, tune
from harness.commands import list as list_verb
from harness.commands.arguments import (LAUNCHERS, RENAMED, add_launcher_arguments, check_counts, early_problem,
                                        parse_seeds, parse_sets)
from harness.commands.from_catalogue import answer_from_catalogue
from harness.commands.tune import study_progress

__all__ = ["LAUNCHERS", "RENAMED", "VERBS", "VersionAction", "add_launcher_arguments", "answer_from_catalogue", "build_parser",
           "check_counts", "main", "parse_seeds", "parse_sets", "run_command", "study_progress"]

VERBS = {module.NAME: module for module in
         (list_verb, describe, check, run, bench, tune, perf, scaling, probe, leaderboard, claims, results)}
"""Every verb's module, in the order `attnbench --help` lists them."""


class VersionAction(argparse.Action):
    """--version: attnbench, torch and Lightning from the installed metadata (no import), and the commit."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the versions and the git commit, and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from harness.provenance import version_line

        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnbench", description="Benchmark attention variants on the same tasks, seeds and budgets.")
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in VERBS.values():
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run_command(argv)
    except BrokenPipeError:
        # `attnbench describe ... | head`: the reader has gone, which is not an error worth a traceback. Python
        # would report the failed flush of the buffered rest at exit, so stdout is pointed at devnull first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool stopped by a closed pipe


def run_command(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = check_counts(args)
    if problem:
        print(f"attnbench: error: {problem}", file=sys.stderr)
        return 2
    answered = answer_from_catalogue(args)
    if answered is not None:
        return answered
    # After parsing: `--help` and a usage error need none of this. SuiteError and LauncherError are ValueErrors.
    from datamodules.paths import MissingDataError
    from modules.registry import DuplicateNameError, PluginError, UnknownNameError, load_plugin_file

    try:
        for plugin in getattr(args, "plugin", []):
            load_plugin_file(plugin)
        if getattr(args, "logger", None):
            from harness.results.store import runs_dir
            from harness.run.runner import use_logger

            use_logger(args.logger, runs_dir(getattr(args, "runs_dir", None)) / "logs")
        from datamodules.paths import DATA_ENV, data_root_problem, default_data_root

        problem = None
        if getattr(args, "data_root", None):
            args.data_root = os.path.abspath(args.data_root)
            problem = data_root_problem(args.data_root, "--data-root")
        elif hasattr(args, "data_root"):
            args.data_root = default_data_root()
            problem = data_root_problem(args.data_root, f"${DATA_ENV}")
        if problem:
            raise MissingDataError(problem)
        # a malformed suite file or a task's missing data files, answered before the verb imports torch
        problem = early_problem(args)
        if problem:
            print(f"attnbench: error: {problem}", file=sys.stderr)
            return 2
        return VERBS[args.command].main(args)
    except (UnknownNameError, DuplicateNameError, PluginError, MissingDataError, ValueError) as exc:
        print(f"attnbench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnbench: interrupted; finished runs are recorded, re-run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
