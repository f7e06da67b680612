"""harness/claims.yaml's declarations: each dated threshold is the kernel's own (the file is the judged copy of the
rule, the kernel the rule that runs), every ruled diagnostic of a variant a claim measures is dated, and the declared
test and dose-response keep their declaring commit."""

import subprocess
from pathlib import Path

import pytest

from harness.report.claims_schema import load_claims

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def claims():
    return load_claims()


def test_each_dated_threshold_is_the_kernels_declaration(claims):
    from modules.attention.mechanism import declared_mechanism

    for entry in claims.thresholds:
        declared, _ = declared_mechanism(entry.variant)
        kernel = {d.name: d for d in declared}
        assert entry.diagnostic in kernel, f"{entry.variant} declares no {entry.diagnostic}"
        rule = kernel[entry.diagnostic]
        assert (rule.rule, rule.threshold) == (entry.rule, pytest.approx(entry.threshold)), (
            f"claims.yaml dates {entry.variant}'s {entry.diagnostic} as {entry.rule} {entry.threshold}; the kernel says "
            f"{rule.rule} {rule.threshold}: date the new threshold (git log -S) in harness/claims.yaml")


def test_every_ruled_diagnostic_of_a_measured_variant_is_dated(claims):
    from modules.attention.mechanism import declared_mechanism

    from harness.plan.suite import load_suite

    labels = {c["measured_by"]["variant"] for c in claims["claims"] if c.get("measured_by") and c["measured_by"]["suite"] == "paper-gat"}
    names = {entry.label or entry.name: entry.name for entry in load_suite("paper-gat").variants}
    for label in sorted(labels):
        declared, _ = declared_mechanism(names.get(label, label))
        for d in declared:
            if d.rule:
                assert claims.threshold(names.get(label, label), d.name) is not None, \
                    f"{label}'s {d.name} rule is not dated in harness/claims.yaml (`thresholds`)"


def test_the_declarations_name_real_commits_at_their_times(claims):
    dated = [claims.mechanism_test.declared, claims.dose_response.declared, *(t.declared for t in claims.thresholds)]
    for declared in {(d.commit, d.at) for d in dated}:
        commit, at = declared
        found = subprocess.run(["git", "show", "-s", "--format=%cI", commit], cwd=REPO, capture_output=True, text=True)
        if found.returncode != 0:
            pytest.skip("a shallow clone without the declaring commits")
        assert found.stdout.strip() == at, f"{commit} was committed at {found.stdout.strip()}, claims.yaml says {at}"
