"""`attnbench claims`: the claims board as Markdown."""

from __future__ import annotations

import argparse

from harness.commands.arguments import add_common

NAME = "claims"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="print the claims board (harness/claims.yaml against the records) as Markdown; writes nothing")
    p.add_argument("--claims-file", default=None, help="a claims file other than harness/claims.yaml")
    add_common(p)
    return p


def main(args) -> int:
    from harness.report.claims import CLAIMS_FILE, build_claims_board, load_claims, render_claims_markdown

    board = build_claims_board(load_claims(args.claims_file or CLAIMS_FILE), args.runs_dir, args.data_root)
    print(render_claims_markdown(board), end="")
    return 0
