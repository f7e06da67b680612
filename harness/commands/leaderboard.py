"""`attnbench leaderboard`: a suite's board regenerated from its records, or a board of whatever a runs folder
holds; with --claims also the claims page."""

from __future__ import annotations

import argparse
import sys

from harness.commands.arguments import add_common

NAME = "leaderboard"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="regenerate a suite's leaderboard from its records, or a board of whatever --runs-dir holds")
    p.add_argument("--suite", nargs="+", default=None, metavar="SUITE",
                   help="one or more suites (one process for all: `make leaderboard` renders every board in one go); "
                        "without it: every record of --runs-dir, one table per task and parameter set, as <out>/leaderboard.*")
    p.add_argument("--out", default=None, help="where the boards go (default: leaderboards with --suite, else the runs folder)")
    p.add_argument("--allow-empty", action="store_true",
                   help="write a board of missing runs when the records hold no run of the suite (default: refuse, exit 2)")
    p.add_argument("--params", choices=["default", "tuned"], default="default", help="tuned: list tuned rows next to the defaults")
    p.add_argument("--params-dir", default="leaderboards/params")
    p.add_argument("--force", action="store_true", help="overwrite the board even if it has more finished records than the records give")
    p.add_argument("--skip-unrecorded", action="store_true",
                   help="leave the board as it is, with a note, when the records hold no run of the suite (`make leaderboard` on a fresh clone)")
    p.add_argument("--claims", action="store_true",
                   help="also write claims.{md,html} to --out: the papers' claims (harness/claims.yaml) against the same records")
    add_common(p)
    return p


def main(args) -> int:
    """Exit 2 when a board is refused (it would shrink, or the store holds none of its runs), else 1 when a
    record could not be read (the board still counts it, as `results export` does), else 0."""
    from harness.report.leaderboard import BoardWouldShrink, NothingRecorded, write_leaderboard, write_records_board
    from harness.results.store import runs_dir

    tuned = args.params_dir if args.params == "tuned" else None
    refused = 0
    written = []
    # RecordStore makes its folder; a refused board must leave none behind, or the next `results compare` on a
    # mistyped folder finds an empty store there instead of saying it does not exist
    no_store = not (runs_dir(args.runs_dir) / "records").is_dir()
    if args.suite is None and not args.claims:  # --claims alone renders only the claims page
        if tuned:
            raise ValueError("--params tuned lists a suite's tuned rows: name the --suite (a board of records shows the tuned runs it holds anyway)")
        if no_store:
            print(f"attnbench: error: {runs_dir(args.runs_dir) / 'records'} does not exist; no board written. Point --runs-dir "
                  f"at a folder with records/ (the committed records: --runs-dir leaderboards)", file=sys.stderr)
            return 2
        try:
            written.append(write_records_board(runs=args.runs_dir, out_dir=args.out, data_root=args.data_root, force=args.force))
        except (BoardWouldShrink, NothingRecorded) as exc:
            print(f"attnbench: error: {exc}", file=sys.stderr)
            refused += 1
    for suite in args.suite or []:
        if no_store and not args.allow_empty:
            if args.skip_unrecorded:
                print(f"attnbench leaderboard: {suite}: no record of its runs in {runs_dir(args.runs_dir) / 'records'}; board left as it is")
            else:
                print(f"attnbench: error: {runs_dir(args.runs_dir) / 'records'} does not exist, so it holds no record of suite {suite}; "
                      f"no board written. Point --runs-dir at the folder its runs went to (the committed records: --runs-dir "
                      f"leaderboards), or pass --allow-empty to write a board of missing runs", file=sys.stderr)
                refused += 1
            continue
        # One suite's refusal does not stop the others: each board is written or kept on its own merits.
        try:
            paths = write_leaderboard(suite, runs=args.runs_dir, out_dir=args.out or "leaderboards", data_root=args.data_root,
                                      tuned_params_dir=tuned, force=args.force, skip_unrecorded=args.skip_unrecorded,
                                      allow_empty=args.allow_empty, snapshot=not args.plugin)
        except (BoardWouldShrink, NothingRecorded) as exc:
            print(f"attnbench: error: {exc}", file=sys.stderr)
            refused += 1
            continue
        if not paths:
            print(f"attnbench leaderboard: {suite}: no record of its runs in {runs_dir(args.runs_dir) / 'records'}; board left as it is")
        written.append(paths)
    for paths in written:
        for path in paths:
            print(path)
    if args.claims:
        from harness.report.leaderboard import write_claims_board

        for path in write_claims_board(args.runs_dir, args.out or "leaderboards", args.data_root):
            print(path)
    if refused:
        return 2
    unreadable = {key for paths in written for key in getattr(paths, "unreadable", {})}
    if unreadable:
        print(f"attnbench leaderboard: error: {len(unreadable)} unreadable record(s) in {runs_dir(args.runs_dir) / 'records'} "
              f"(counted on the boards); repair or delete them and re-run; exit status 1", file=sys.stderr)
        return 1
    return 0
