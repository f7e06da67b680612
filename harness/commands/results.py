"""`attnbench results export|import|compare|retract`: run records between stores."""

from __future__ import annotations

import argparse
import sys

NAME = "results"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="move run records between stores: export to a JSON-lines file, import (merge) them, compare two")
    verbs = p.add_subparsers(dest="results_command", required=True)
    # one block per sub-verb, in the order `results --help` lists them; each has its handler in SUBVERBS
    q = verbs.add_parser("export", help="every record of --runs-dir as one JSON-lines file, sorted by key")
    q.add_argument("out", metavar="OUT.jsonl")
    q.add_argument("--runs-dir", default=None, help="the store to export (default: $ATTNBENCH_RUNS or runs)")
    q = verbs.add_parser("import", help="merge records into a store: identical ones deduplicated, other finished executions of a key kept "
                                        "beside it, genuine conflicts (another spec, finished vs failed) kept as conflicts")
    q.add_argument("sources", nargs="+", metavar="FILE.jsonl|DIR",
                   help="files from `results export`, runs folders (or their records/ folders), or folders of runs folders (a SLURM job array's output)")
    q.add_argument("--into", default=None, help="the store to merge into (default: $ATTNBENCH_RUNS or runs; the committed records: leaderboards)")
    q = verbs.add_parser("compare", help="per task and metric: how many keys two stores (or exports) share, how many agree exactly, the largest difference; "
                                         "exit 0 when every shared value is identical, 3 when some differ, 4 when they share no finished key, 1 on an unreadable record")
    q.add_argument("a", metavar="A", help="a store (runs folder) or an export file")
    q.add_argument("b", metavar="B", help="a store (runs folder) or an export file")
    q = verbs.add_parser("retract", help="set aside records that a fix showed wrong (made by a since-fixed code path): kept with the reason in "
                                         "records/retracted/, never shown or imported again; the key runs again, or its next execution takes its place")
    q.add_argument("keys", nargs="*", metavar="KEY", help="run keys to retract (or select them with the options below)")
    q.add_argument("--because", required=True, metavar="TEXT", help="why these records are wrong, and which commit fixed it")
    q.add_argument("--made-at", metavar="COMMIT", help="select the records made at this commit (a prefix of Record.commit)")
    q.add_argument("--suite", dest="retract_suite", metavar="NAME", help="select the records planned by this suite")
    q.add_argument("--seed-batched", action="store_true", help="select only records trained in a seed batch")
    q.add_argument("--dry-run", action="store_true", help="list what would be retracted; change nothing")
    q.add_argument("--runs-dir", default=None, help="the store (default: $ATTNBENCH_RUNS or runs; the committed records: leaderboards)")
    q = verbs.add_parser("checkpoints", help="list the mid-run checkpoints of --runs-dir (what a killed run or seed batch resumes from); "
                                             "--prune deletes the orphaned ones (every run they hold recorded, or older than --older-than)")
    q.add_argument("--prune", action="store_true", help="delete the orphaned checkpoints")
    q.add_argument("--older-than", type=float, default=None, metavar="DAYS", help="with --prune: also checkpoints older than DAYS")
    q.add_argument("--runs-dir", default=None, help="the runs folder (default: $ATTNBENCH_RUNS or runs)")
    return p


def main(args) -> int:
    """Each sub-verb's exit status: `export` and `import` exit 1 when a record could not be read (the rest is
    still exported or imported), else 0; `retract` and `compare` have their own codes (see each)."""
    return SUBVERBS[args.results_command](args)


def _export_results(args) -> int:
    from harness.results.exchange import export_records
    from harness.results.store import RecordStore

    transfer = export_records(RecordStore(args.runs_dir), args.out)
    summary = f"exported {transfer.counts['record']} record(s)" + (
        f" and {transfer.counts['conflicting copy']} conflicting cop(ies)" if transfer.counts["conflicting copy"] else "")
    if transfer.counts["other execution"]:
        summary += f", {transfer.counts['other execution']} other execution(s) of their keys"
    print(f"attnbench results: {summary} to {args.out}")
    return _report_problems(transfer)


def _import_results(args) -> int:
    from harness.results.exchange import import_records
    from harness.results.store import RecordStore

    store = RecordStore(args.into)
    transfer = import_records(args.sources, store)
    print(f"attnbench results: into {store.root}: {transfer.counts['added']} added, {transfer.counts['same']} already there, "
          f"{transfer.counts['execution']} other execution(s), {transfer.counts['conflict']} conflict(s)"
          + (f", {transfer.counts['retracted']} retracted before (not imported: see {store.retracted_dir})" if transfer.counts["retracted"] else "")
          + (f"; other executions of a key kept in {store.executions_dir} (the boards rank one per key and report how the copies agree)"
             if transfer.counts["execution"] else "")
          + (f"; conflicts kept in {store.conflicts_dir} (the boards show them)" if transfer.counts["conflict"] else ""))
    return _report_problems(transfer)


def _report_problems(transfer) -> int:
    for problem in transfer.problems:
        print(f"attnbench results: error: unreadable record {problem}", file=sys.stderr)
    return 1 if transfer.problems else 0


def _retract_results(args) -> int:
    """Exit 2 when nothing is selected (a selector that matches nothing is more likely a typo than a wish)."""
    from harness.results.store import RecordStore, runs_dir

    if not (runs_dir(args.runs_dir) / "records").is_dir():
        print(f"attnbench: error: {runs_dir(args.runs_dir) / 'records'} does not exist; point --runs-dir at a store", file=sys.stderr)
        return 2
    if not (args.keys or args.made_at or args.retract_suite or args.seed_batched):
        print("attnbench: error: results retract needs KEYs or a selector (--made-at, --suite, --seed-batched)", file=sys.stderr)
        return 2
    store = RecordStore(args.runs_dir)
    chosen = []
    for record in store:
        spec = record.spec or {}
        if ((not args.keys or record.key in args.keys)
                and (not args.made_at or (record.commit or "").startswith(args.made_at))
                and (not args.retract_suite or (spec.get("extra") or {}).get("suite") == args.retract_suite)
                and (not args.seed_batched or (record.execution or {}).get("seed_batch"))):
            chosen.append(record)
    unknown = set(args.keys) - {path.stem for path in store.root.glob("*.json")}
    if unknown:
        print(f"attnbench: error: no record of {', '.join(sorted(unknown))} in {store.root}", file=sys.stderr)
        return 2
    if not chosen:
        print(f"attnbench: error: no record in {store.root} matches the selection; nothing retracted", file=sys.stderr)
        return 2
    for record in chosen:
        spec = record.spec or {}
        what = f"{record.key} {spec.get('task')} {spec.get('label') or spec.get('variant')} seed {spec.get('seed')} (commit {(record.commit or '?')[:12]})"
        if args.dry_run:
            print(f"would retract {what}")
            continue
        successor = store.retract(record.key, args.because)
        print(f"retracted {what}; " + (f"its execution finished {successor.finished} takes its place" if successor else "the key runs again on the next bench"))
    return 0


def _compare_results(args) -> int:
    """0: every value the two sources share is identical; 3: some differ (the table says where and by how much);
    4: they share no key finished on both sides, so nothing was compared; 1: a record could not be read."""
    from harness.results.exchange import compare_sources

    agreements, counts, transfer = compare_sources(args.a, args.b)
    print(f"attnbench results compare: {counts['shared_ok']} key(s) finished in both; {counts['only_a']} only in {args.a}, {counts['only_b']} only in {args.b}")
    if agreements:
        print(f"{'task':<24} {'metric':<28} {'shared':>6} {'identical':>9} {'max |Δ|':>12}")
        for a in agreements:
            print(f"{a.task:<24} {a.metric:<28} {a.shared:>6} {a.identical:>9} {a.max_abs_diff:>12.6g}")
    for problem in transfer.problems:
        print(f"attnbench results: error: unreadable record {problem}", file=sys.stderr)
    if transfer.problems:
        return 1
    if not counts["shared_ok"]:
        return 4
    return 0 if all(a.identical == a.shared for a in agreements) else 3


def _checkpoint_results(args) -> int:
    from harness.results.checkpoints import describe

    print(describe(args.runs_dir, args.older_than, do_prune=args.prune))
    return 0


SUBVERBS = {"export": _export_results, "import": _import_results, "compare": _compare_results, "retract": _retract_results,
            "checkpoints": _checkpoint_results}
"""Each sub-verb's handler; a new sub-verb adds its parser in `add_parser` and its handler here."""
