"""The contract every registered attention variant keeps (DESIGN.md section 6.2).

Parametrised over the registry: a new variant is covered without editing this file."""

from __future__ import annotations

import pytest

from modules.attention import attention_entry, list_attentions
from modules.attention import contract
from modules.attention.contract import has_reachable_limit

VARIANTS = list_attentions()


def test_builtin_variants_registered():
    """The variants of DESIGN.md section 3, each under its name."""
    builtin = {"softmax", "fenchel", "fenchel-exact", "gmm", "sparsemax", "entmax15", "entmax", "bam-weibull", "bam-lognormal",
               "align-gan", "align-ot", "align-ct"}
    assert builtin <= set(VARIANTS)


@pytest.mark.parametrize("name", VARIANTS)
def test_weights_are_distributions_and_masked_keys_get_zero(name):
    contract.check_weights_are_distributions(name)


@pytest.mark.parametrize("name", VARIANTS)
def test_dense_and_segment_forms_agree(name):
    contract.check_dense_equals_segment(name)


@pytest.mark.parametrize("name", VARIANTS)
def test_fused_fast_path_gives_the_same_output(name):
    """need_weights=False (what transformer hosts pass) may take a fused path, never other math."""
    contract.check_fused_path(name)


@pytest.mark.parametrize("name", VARIANTS)
def test_aux_losses_finite_scalars_and_diagnostics_detached(name):
    contract.check_terms(name)


@pytest.mark.parametrize("name", VARIANTS)
def test_float64_gradcheck(name):
    contract.check_gradients(name)


@pytest.mark.parametrize("name", [n for n in VARIANTS if has_reachable_limit(n)])
def test_reduces_to_softmax_at_its_limit(name):
    contract.check_softmax_limit(name)


@pytest.mark.parametrize("name", [n for n in VARIANTS if n != "softmax"])
def test_every_variant_but_softmax_declares_its_softmax_limit(name):
    assert attention_entry(name).cls.softmax_limit is not None, (
        f"{name}: set softmax_limit to the config values at which it reduces to softmax"
    )


@pytest.mark.parametrize("name", VARIANTS)
def test_config_is_frozen_and_suggest_gives_known_fields(name):
    contract.check_config(name)


# ---- padding invariance (modules/attention/contract.py says what each case holds fixed) -------------------

EXTRA_CONFIGS = {
    # non-default settings whose sums over queries or pairs padding could reach
    "gmm": [{"gamma": 0.5, "eta": 1.0, "adapt_steps": 2, "adapt_in_training": True}, {"beta": 0.5, "iterations": 2}],
    "bam-weibull": [{"prior": "fixed"}],
    "bam-lognormal": [{"prior": "fixed"}],
    "fenchel": [{"prior": "degree"}],
}
PADDING_CASES = [(name, {}) for name in VARIANTS] + [
    (name, config) for name, configs in EXTRA_CONFIGS.items() if name in VARIANTS for config in configs
]
ONE_SOFTMAX_PER_BATCH = {"bam-weibull": {"prior_scope": "neighbourhood"}, "bam-lognormal": {"prior_scope": "neighbourhood"}}
"""BAM's graph default, the authors' all-node prior, is one softmax over the batch's nodes by design (their GAT
trains on one graph; bam.py's prior_scope says so): the second-graph check runs its per-neighbourhood form,
and tests/attention/test_bam.py checks the all-node prior itself."""



@pytest.mark.parametrize("name, config", PADDING_CASES, ids=[f"{n}{c or ''}" for n, c in PADDING_CASES])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_dense_padding_leaves_real_tokens_unchanged(name, config, mode):
    contract.check_dense_padding(name, config, mode == "train")


@pytest.mark.parametrize("name, config", PADDING_CASES, ids=[f"{n}{c or ''}" for n, c in PADDING_CASES])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_isolated_nodes_leave_a_graph_unchanged(name, config, mode):
    contract.check_isolated_nodes(name, config, mode == "train")


@pytest.mark.parametrize("name, config", PADDING_CASES, ids=[f"{n}{c or ''}" for n, c in PADDING_CASES])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_second_graph_in_the_batch_leaves_the_first_unchanged(name, config, mode):
    contract.check_second_graph(name, {**config, **ONE_SOFTMAX_PER_BATCH.get(name, {})}, mode == "train")


# ---- `attnbench check`: the same checks on a plugin file -------------------------------------------------

PLUGIN = '''
from dataclasses import dataclass
from typing import ClassVar

from modules.attention import AttentionConfig, AttentionKernel, AttentionResult, register_attention


@dataclass(frozen=True)
class TemperatureConfig(AttentionConfig):
    temperature: float = 1.5


@register_attention("{name}")
class TemperatureSoftmax(AttentionKernel):
    """Softmax of logits / temperature."""

    Config = TemperatureConfig
    softmax_limit: ClassVar = {{"temperature": {limit}}}

    def normalize(self, logits, groups, *, q=None, k=None):
        return AttentionResult({weights})
'''


def _check(tmp_path, capsys, name, limit=1.0, logits="logits", weights="groups.softmax({logits} / self.config.temperature)"):
    from harness.cli import main

    path = tmp_path / f"{name}.py"
    path.write_text(PLUGIN.format(name=name, limit=limit, weights=weights.format(logits=logits)))
    code = main(["check", str(path)])
    return code, [line for line in capsys.readouterr().out.splitlines() if line.startswith((name, "attnbench check:"))]


def _status(lines, prop):
    """The status column of a `check` line: NAME  PROPERTY  pass|FAIL|skipped  (detail)."""
    line = next(line for line in lines if f"  {prop} " in line)
    return line.split()[len(prop.split()) + 1]


def test_check_passes_a_good_plugin_and_skips_with_its_reason_what_cannot_run(tmp_path, capsys):
    code, lines = _check(tmp_path, capsys, "check-good")
    assert code == 0
    # the plugin is not row-separable and declares no mechanism: those two cannot run, and are never reported passed
    cannot_run = {"query blocks": "not row_separable", "mechanism diagnostics": "no `mechanism` declared"}
    for prop in contract.PROPERTIES:
        assert _status(lines, prop) == ("skipped" if prop in cannot_run else "pass"), prop
    for prop, reason in cannot_run.items():
        assert reason in next(line for line in lines if f"  {prop} " in line)
    assert lines[-1] == "attnbench check: every property that ran holds; 2 skipped (not checked: see the reasons above)"


@pytest.mark.parametrize("name, weights, failing, message", [
    # the plugin: rows still sum to 1, but weights go negative
    ("check-negative", "groups.softmax(logits) * 2 - groups.softmax(0 * logits)", "weights are distributions", "weights go negative"),
    ("check-row-sums", "groups.softmax(logits) * 1.5", "weights are distributions", "sum to"),
    # softmax over the last axis whatever the groups mask: padded keys and a causal future get weight
    ("check-ignores-mask", "logits.softmax(-1) if logits.dim() == 4 else groups.softmax(logits)", "weights are distributions",
     "masked keys get weight"),
])
def test_check_fails_weights_that_are_not_distributions_over_the_unmasked_keys(tmp_path, capsys, name, weights, failing, message):
    code, lines = _check(tmp_path, capsys, name, weights=weights)
    assert code == 1
    line = next(line for line in lines if f"  {failing} " in line)
    assert _status(lines, failing) == "FAIL" and message in line, line
    if name == "check-ignores-mask":
        assert _status(lines, "causal mask") == "FAIL"


def test_check_names_a_wrong_softmax_limit(tmp_path, capsys):
    code, lines = _check(tmp_path, capsys, "check-bad-limit", limit=2.0)
    assert code == 1
    assert _status(lines, "softmax limit") == "FAIL"
    assert all(_status(lines, prop) in ("pass", "skipped") for prop in contract.PROPERTIES if prop != "softmax limit")


def test_check_names_broken_gradients(tmp_path, capsys):
    # weights from detached logits: forward right, no gradient reaches q and k
    code, lines = _check(tmp_path, capsys, "check-bad-grad", logits="logits.detach()")
    assert code == 1
    assert _status(lines, "gradients") == "FAIL" and _status(lines, "dense equals segment") == "pass"


def test_check_refuses_a_file_without_variants(tmp_path, capsys):
    from harness.cli import main

    empty = tmp_path / "nothing.py"
    empty.write_text("X = 1\n")
    assert main(["check", str(empty)]) == 2
    assert "registers no attention variant" in capsys.readouterr().err
