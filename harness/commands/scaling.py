"""`attnbench scaling`: a suite at several worker counts."""

from __future__ import annotations

import argparse

from harness.commands.arguments import add_common

NAME = "scaling"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="run a suite with 1, 2, ... workers in one command and print the speed-up")
    p.add_argument("--suite", default="quick")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts, the first is the baseline (default: 1,2)")
    p.add_argument("--variants", default=None, metavar="PATTERN", help="only variants matching these comma-separated globs")
    p.add_argument("--seeds", dest="seed_counts", default=None, metavar="N[,M...]",
                   help="run this many seeds instead of the suite's; several (e.g. 1,20) run the suite once per count and "
                        "print each count's wall time against the first's, same workers")
    p.add_argument("--no-seed-batch", dest="seed_batch", action="store_false",
                   help="run every seed alone, as bench --no-seed-batch (default: seeds of one configuration as seed batches)")
    add_common(p)
    return p


def main(args) -> int:
    from harness.studies.scaling import measure_scaling

    counts = [int(n) for n in args.workers.split(",")]  # checked by check_counts
    seeds = None if args.seed_counts is None else [int(n) for n in args.seed_counts.split(",")]  # checked by check_counts
    measure_scaling(args.suite, counts, variant_filter=args.variants, seeds=seeds, seed_batch=args.seed_batch,
                    data_root=args.data_root, cache_dir=args.cache_dir)
    return 0
