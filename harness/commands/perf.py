"""`attnbench perf`: kernel and seed-batch timings."""

from __future__ import annotations

import argparse

from harness.commands.arguments import add_common

NAME = "perf"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="forward+backward time of every variant relative to softmax (dense and graph)")
    p.add_argument("--variants", default=None, metavar="PATTERN", help="only variants matching this glob")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own choice)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to time the kernels (default: cpu)")
    p.add_argument("--seed-batch", type=int, default=None, metavar="S",
                   help="instead: seeds/s of S seeds trained as one seed batch vs one lone run, per variant on Cora, and the peak-memory ratio")
    p.add_argument("--epochs", type=int, default=20, help="with --seed-batch: epochs per seed (default: 20)")
    add_common(p)
    return p


def main(args) -> int:
    from harness.studies.perf import measure

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.seed_batch is not None:
        from harness.studies.seed_batch_perf import measure_seed_batch

        if args.seed_batch < 1 or args.epochs < 1:
            raise ValueError("--seed-batch and --epochs take positive integers, e.g. --seed-batch 20 --epochs 20")
        rows = measure_seed_batch(args.variants, args.seed_batch, args.epochs, args.data_root, args.cache_dir)
        return 1 if any(row["failed"] for row in rows) else 0
    measure(args.variants, args.repeats, data_root=args.data_root, cache_dir=args.cache_dir, device=args.device)
    return 0
