"""The committed table of every built-in variant's (version, source hash): a built-in's run keys hold only its
explicit `version`, so an edit of its code that is not paired with a version bump would let old records
answer for new code. tests/attention/test_versions.py fails on such an edit; this module checks the table and
appends to it.

    python -m modules.attention.source_versions                    # check (exit 1 with what to do)
    python -m modules.attention.source_versions --update           # record the current versions (after a bump)
    python -m modules.attention.source_versions --update --unchanged-results fenchel-exact
        # an edit that changes no result of that variant (a refactor, another variant in the same file):
        # its current version is recorded with the new hash too

The table is append-only history: one row per (variant, version, source hash) ever recorded, so a version
cannot silently stand for two pieces of code. The hash covers the files defining the variant's class and its
variant base classes (modules/registry.py's source_digest: comments, formatting and docstrings excluded), not
the shared kernel interface or helpers it imports.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TABLE = Path(__file__).with_name("source_versions.json")
COMMAND = "python -m modules.attention.source_versions --update"


def current() -> list[dict[str, str]]:
    """(variant, version, source hash, file) of every built-in variant registered now."""
    from modules.registry import BUILTIN_ROOT, is_builtin, source_digest, source_files

    from .kernel import AttentionKernel
    from .registry import attention_entry, list_attentions

    rows = []
    for name in list_attentions():
        cls = attention_entry(name).cls
        if is_builtin(cls):
            files = [str(f.relative_to(BUILTIN_ROOT.parent)) for f in source_files(cls, AttentionKernel)]
            rows.append({"variant": name, "version": str(cls.version), "source": source_digest(cls, AttentionKernel),
                         "file": ", ".join(files)})
    return rows


def load_table(path: Path = TABLE) -> list[dict[str, str]]:
    return json.loads(path.read_text()) if path.is_file() else []


def _recorded(table: list[dict[str, str]]) -> dict[tuple[str, str], set[str]]:
    recorded: dict[tuple[str, str], set[str]] = {}
    for r in table:
        recorded.setdefault((r["variant"], r["version"]), set()).add(r["source"])
    return recorded


def _problem(row: dict[str, str], recorded: dict[tuple[str, str], set[str]]) -> str | None:
    sources = recorded.get((row["variant"], row["version"]))
    if sources is None:
        return f"{row['variant']} version {row['version']} is not in {TABLE.name}: record it with `{COMMAND}`"
    if row["source"] not in sources:
        return (f"the source of {row['variant']} ({row['file']}) changed since its version {row['version']} was recorded: bump "
                f"its class's `version` (so that its old records are not reused for the new code), then run `{COMMAND}`; "
                f"if the edit changes none of {row['variant']}'s results, run `{COMMAND} --unchanged-results {row['variant']}`")
    return None


def problems(table: list[dict[str, str]], now: list[dict[str, str]]) -> list[str]:
    """What is wrong with `now` against the recorded table, each with the fix."""
    recorded = _recorded(table)
    return [p for p in (_problem(row, recorded) for row in now) if p]


def update(table: list[dict[str, str]], now: list[dict[str, str]], unchanged: set[str]) -> tuple[list[dict[str, str]], list[str]]:
    """The table with `now`'s new versions appended (and new hashes of `unchanged` variants), and what was
    refused: a changed source under a recorded version that is not declared unchanged."""
    recorded = _recorded(table)
    rows, refused = list(table), []
    for row in now:
        problem = _problem(row, recorded)
        if problem is None:
            continue
        if (row["variant"], row["version"]) in recorded and row["variant"] not in unchanged:
            refused.append(problem)
        else:
            rows.append({k: row[k] for k in ("variant", "version", "source")})
    return sorted(rows, key=lambda r: (r["variant"], int(r["version"]) if r["version"].isdigit() else 0, r["version"], r["source"])), refused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modules.attention.source_versions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="append the current built-in versions to the table")
    parser.add_argument("--unchanged-results", nargs="+", default=[], metavar="VARIANT",
                        help="with --update: record these variants' new source hashes under their current versions")
    args = parser.parse_args(argv)
    table, now = load_table(), current()
    if not args.update:
        found = problems(table, now)
        for line in found:
            print(f"error: {line}", file=sys.stderr)
        return 1 if found else 0
    rows, refused = update(table, now, set(args.unchanged_results))
    for line in refused:
        print(f"error: {line}", file=sys.stderr)
    if rows != table:
        TABLE.write_text("[\n" + ",\n".join(json.dumps(row) for row in rows) + "\n]\n")  # a row per line: diffs show rows
        print(f"{TABLE}: {len(rows) - len(table)} row(s) added")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
