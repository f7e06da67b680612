"""`attnbench probe`: a pretrained model's attention."""

from __future__ import annotations

import argparse

NAME = "probe"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="probe a pretrained model's attention (fenchel: Fig. 4 of the Fenchel-duality paper on all-MiniLM-L6-v2)")
    p.add_argument("which", choices=["fenchel"])
    p.add_argument("--dataset", choices=["sst2", "rte"], default="sst2", help="GLUE dev set whose first examples are probed (default: sst2; rte pairs are ~3x longer and take ~8x the time)")
    p.add_argument("--sentences", type=int, default=64, help="how many dev examples (default: 64)")
    p.add_argument("--max-length", type=int, default=128, help="tokens per example, after truncation (default: 128)")
    p.add_argument("--out", default="leaderboards/probes", help="folder for fenchel-minilm.{md,csv,png}")
    p.add_argument("--data-root", default=None, help="local data folder holding glue/ (default: $ATTNBENCH_DATA)")
    return p


def main(args) -> int:
    from harness.studies.probe import run_fenchel_probe

    run_fenchel_probe(dataset=args.dataset, sentences=args.sentences, max_length=args.max_length, out_dir=args.out,
                      data_root=args.data_root)
    return 0
