"""`attnbench check FILE.py`: the attention contract on the variants a plugin file registers."""

from __future__ import annotations

import argparse

NAME = "check"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="run the attention contract on the variants a plugin file registers: every property "
                                   "the test suite checks of the built-ins (weights are distributions with zeros on masked keys, "
                                   "causal mask, softmax limit, padding invariance, bf16 autocast, gradients, ...); exit 1 on a failure")
    p.add_argument("file", metavar="FILE.py", help="a plugin file that registers attention variants")
    p.add_argument("--variant", action="append", default=None, metavar="NAME", help="only these of the file's variants (repeatable)")
    return p


def main(args) -> int:
    """The contract checks of modules/attention/contract.py, one line per variant and property."""
    from modules.attention import list_attentions
    from modules.attention.registry import ATTENTIONS
    from modules.registry import load_plugin_file

    before = set(list_attentions())
    load_plugin_file(args.file)
    found = sorted(set(list_attentions()) - before)
    try:
        return _check_variants(args, found)
    finally:  # checked, not installed: a caller in the same process (a notebook, the tests) keeps its registry
        for name in found:
            ATTENTIONS.unregister(name)


def _check_variants(args, found: list[str]) -> int:
    from modules.attention.contract import FAIL, SKIPPED, check_variant, format_outcomes

    if not found:
        raise ValueError(f"{args.file} registers no attention variant: decorate an AttentionKernel subclass with "
                         f"@register_attention(\"my-name\") (docs/guides/adding-a-variant.md)")
    unknown = sorted(set(args.variant or []) - set(found))
    if unknown:
        raise ValueError(f"--variant {', '.join(unknown)}: {args.file} registers {', '.join(found)}")
    failed = skipped = 0
    for name in args.variant or found:
        outcomes = check_variant(name)
        print(format_outcomes(outcomes), flush=True)
        failed += sum(o.status == FAIL for o in outcomes)
        skipped += sum(o.status == SKIPPED for o in outcomes)
    # a skipped property was not checked: the summary never counts it as holding
    unchecked = f"; {skipped} skipped (not checked: see the reasons above)" if skipped else ""
    print(f"attnbench check: {failed} failed propert{'y' if failed == 1 else 'ies'}{unchecked}" if failed else
          f"attnbench check: every property that ran holds{unchecked}" if skipped else "attnbench check: every property holds")
    return 1 if failed else 0
