"""Which record the mechanism evidence of a run is read from: every value measured at the evaluated weights of the
record a board shows, whatever its key, and only what that record lacks from another execution that evaluated the
same weights.

A key run more than once (a re-execution to record diagnostics, another CPU class) has one shown execution, the one
whose numbers the boards print (store.chosen_execution). Its test pass ran on the weights the stopping rule kept, so
every `test/...` value it carries is evidence at the evaluated weights: `test/diag/<name>` and, in records made
before that key existed, `test/attn/<name>` (modules/attention/mechanism.py reads both). Where the shown record lacks
a test value, an execution that evaluated the same weights (store.same_evaluated_weights: same kept epoch, same
monitored value, same test metrics) supplies it; an execution on another trajectory never does. The shown record's
own values are never replaced, so cross-CPU matching cannot narrow the evidence to the subset of seeds that happened
to match: it only adds to seeds that had none."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

from harness.results.record import Record
from harness.results.store import chosen_execution, same_evaluated_weights

TEST_PREFIX = "test/"


def evidence_record(copies: Iterable[Record]) -> Record:
    """The shown execution of a key, its diagnostics completed with the test-pass values it lacks from the other
    executions that evaluated the same weights, earliest first (each fills only what is still missing). Its
    `execution` notes `evidence_from` (those executions' finish times) when something was borrowed."""
    copies = list(copies)
    chosen = chosen_execution(copies)
    merged = dict(chosen.diagnostics or {})
    donors = []
    others = [r for r in copies if r is not chosen and same_evaluated_weights(r, chosen)]
    while others:
        donor = chosen_execution(others)
        others.remove(donor)
        have = {_name(k) for k in merged if k.startswith(TEST_PREFIX)}
        borrowed = {k: v for k, v in (donor.diagnostics or {}).items() if k.startswith(TEST_PREFIX) and _name(k) not in have}
        if borrowed:
            merged.update(borrowed)
            donors.append(donor.finished)
    if not donors:
        return chosen
    return dataclasses.replace(chosen, diagnostics=merged, execution={**(chosen.execution or {}), "evidence_from": donors})


def _name(key: str) -> str:
    """A test-pass key's diagnostic: 'test/diag/qk_distance' and 'test/attn/qk_distance' are both 'qk_distance' (the
    same value at the same weights), so a shown record holding either keeps its own."""
    for prefix in ("test/diag/", "test/attn/"):
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def evidence_records(records: Mapping[str, Record], executions: Mapping[str, Iterable[Record]] | None) -> dict[str, Record]:
    """Per key of `records`, the record to read mechanism evidence from (`evidence_record` over its executions)."""
    executions = executions or {}
    return {key: evidence_record(executions[key]) if executions.get(key) else record for key, record in records.items()}
