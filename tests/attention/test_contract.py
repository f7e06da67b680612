"""The contract every registered attention variant keeps (DESIGN.md section 6.2).

Parametrised over the registry: a new variant is covered without editing this file."""

from __future__ import annotations

import math

import pytest
import torch

from modules.attention import attention_entry, build_attention, list_attentions, suggest_config
from modules.attention import contract
from modules.attention.contract import HEADS, DIM, SCALE, dense_weights, has_reachable_limit, kernel_for, make_problem, segment_weights

VARIANTS = list_attentions()


def assert_distribution(weights, groups, valid=None):
    assert torch.isfinite(weights).all()
    assert (weights >= 0).all()
    sums = groups.reduce(weights, "sum")
    if groups.valid_queries is not None:  # nodes without edges (padded tokens' twins) have no distribution
        sums = sums[groups.valid_queries.expand_as(sums)]
    torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-6, rtol=0)
    if valid is not None:
        assert (weights.masked_select(~valid.expand_as(weights)) == 0).all()


def test_builtin_variants_registered():
    """The variants of DESIGN.md section 3, each under its name."""
    builtin = {"softmax", "fenchel", "fenchel-exact", "gmm", "sparsemax", "entmax15", "entmax", "bam-weibull", "bam-lognormal",
               "align-gan", "align-ot", "align-ct"}
    assert builtin <= set(VARIANTS)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_weights_are_distributions_and_masked_keys_get_zero(name, mode):
    p = make_problem()
    kernel = kernel_for(name).train(mode == "train")
    assert_distribution(dense_weights(kernel, p).weights, p.dense, p.dense.valid)
    assert_distribution(segment_weights(kernel, p).weights, p.segment)


@pytest.mark.parametrize("name", VARIANTS)
def test_dense_and_segment_forms_agree(name):
    contract.check_dense_equals_segment(name)


@pytest.mark.parametrize("name", VARIANTS)
def test_fused_fast_path_gives_the_same_output(name):
    """need_weights=False (what transformer hosts pass) may take a fused path, never other math."""
    p = make_problem()
    kernel = kernel_for(name).eval()
    with_weights, _ = kernel(p.q, p.k, p.v, p.dense, scale=SCALE, need_weights=True)
    fused, _ = kernel(p.q, p.k, p.v, p.dense, scale=SCALE, need_weights=False)
    valid = p.key_valid[:, None, :, None].expand_as(fused)  # padded query rows are free to differ
    torch.testing.assert_close(fused[valid], with_weights[valid], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", VARIANTS)
def test_aux_losses_finite_scalars_and_diagnostics_detached(name):
    p = make_problem()
    kernel = kernel_for(name)
    returned = set()
    for mode in (True, False):
        kernel.train(mode)
        for result in (dense_weights(kernel, p), segment_weights(kernel, p)):
            for key, value in result.aux_losses.items():
                assert value.dim() == 0, f"aux loss {key} is not a scalar"
                assert torch.isfinite(value), f"aux loss {key} is not finite"
                if mode:
                    returned.add(key)
            for key, value in result.diagnostics.items():
                assert value.dim() == 0 and not value.requires_grad, f"diagnostic {key} must be a detached scalar"
                assert torch.isfinite(value), f"diagnostic {key} is not finite"
    # every aux loss the variant returns in training has a weight schedule entry (which may be 0 at some
    # steps, as an annealed KL is at first), and every weight is a finite non-negative number
    for step in (0, 1, 10_000):
        weights = kernel.loss_weights(step, epoch=step)
        assert returned <= set(weights), f"aux losses {sorted(returned - set(weights))} have no weight entry"
        assert all(isinstance(w, (int, float)) and math.isfinite(w) and w >= 0 for w in weights.values()), weights


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
    import dataclasses

    import optuna

    config = kernel_for(name).config
    fields = [f.name for f in dataclasses.fields(config)]
    if fields:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(config, fields[0], None)
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    suggested = suggest_config(name, trial)
    assert set(suggested) <= set(fields)
    build_attention({"name": name, **suggested}, num_heads=HEADS, head_dim=DIM)


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
        return AttentionResult(groups.softmax({logits} / self.config.temperature))
'''


def _check(tmp_path, capsys, name, limit=1.0, logits="logits"):
    from harness.cli import main

    path = tmp_path / f"{name}.py"
    path.write_text(PLUGIN.format(name=name, limit=limit, logits=logits))
    code = main(["check", str(path)])
    return code, [line for line in capsys.readouterr().out.splitlines() if line.startswith(name)]


def _status(lines, prop):
    """The status column of a `check` line: NAME  PROPERTY  pass|FAIL|n/a  (detail)."""
    line = next(line for line in lines if f"  {prop} " in line)
    return line.split()[len(prop.split()) + 1]


def test_check_passes_a_good_plugin_on_every_property(tmp_path, capsys):
    code, lines = _check(tmp_path, capsys, "check-good")
    assert code == 0
    for prop in contract.PROPERTIES:
        assert _status(lines, prop) == "pass", prop


def test_check_names_a_wrong_softmax_limit(tmp_path, capsys):
    code, lines = _check(tmp_path, capsys, "check-bad-limit", limit=2.0)
    assert code == 1
    assert _status(lines, "softmax limit") == "FAIL"
    assert all(_status(lines, prop) == "pass" for prop in contract.PROPERTIES if prop != "softmax limit")


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
