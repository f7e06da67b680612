"""The contract every registered attention variant keeps (DESIGN.md section 6.2).

Parametrised over the registry: a new variant is covered without editing this file."""

from __future__ import annotations

import pytest
import torch

from modules.attention import AttentionKernel, attention_entry, build_attention, list_attentions, suggest_config

from .conftest import make_problem

VARIANTS = list_attentions()
HEADS, DIM = 2, 4
SCALE = DIM**-0.5


def kernel_for(name: str, **overrides) -> AttentionKernel:
    torch.manual_seed(0)
    kernel = build_attention({"name": name, **overrides}, num_heads=HEADS, head_dim=DIM).double()
    return kernel


def dense_weights(kernel, p):
    logits = kernel.score(p.q, p.k, p.dense, scale=SCALE)
    return kernel.normalize(logits, p.dense, q=p.q, k=p.k)


def segment_weights(kernel, p):
    q, k = p.nodes(p.q), p.nodes(p.k)
    logits = kernel.score(q, k, p.segment, scale=SCALE)
    return kernel.normalize(logits, p.segment, q=q, k=k)


def assert_distribution(weights, groups, valid=None):
    assert torch.isfinite(weights).all()
    assert (weights >= 0).all()
    sums = groups.reduce(weights, "sum")
    torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-6, rtol=0)
    if valid is not None:
        assert (weights.masked_select(~valid.expand_as(weights)) == 0).all()


def test_builtin_variants_registered():
    assert "softmax" in VARIANTS


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_weights_are_distributions_and_masked_keys_get_zero(name, mode):
    p = make_problem()
    kernel = kernel_for(name).train(mode == "train")
    assert_distribution(dense_weights(kernel, p).weights, p.dense, p.dense.valid)
    assert_distribution(segment_weights(kernel, p).weights, p.segment)


@pytest.mark.parametrize("name", VARIANTS)
def test_dense_and_segment_forms_agree(name):
    p = make_problem()
    kernel = kernel_for(name).eval()
    dense = dense_weights(kernel, p).weights
    segment = segment_weights(kernel, p).weights
    torch.testing.assert_close(segment, p.dense_at_edges(dense), atol=1e-6, rtol=1e-5)
    # the full forward (aggregation included) agrees too
    out_dense, _ = kernel(p.q, p.k, p.v, p.dense, scale=SCALE)
    out_seg, _ = kernel(p.nodes(p.q), p.nodes(p.k), p.nodes(p.v), p.segment, scale=SCALE)
    torch.testing.assert_close(out_seg, p.nodes(out_dense), atol=1e-6, rtol=1e-5)


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
    for mode in (True, False):
        kernel.train(mode)
        for result in (dense_weights(kernel, p), segment_weights(kernel, p)):
            for key, value in result.aux_losses.items():
                assert value.dim() == 0, f"aux loss {key} is not a scalar"
                assert torch.isfinite(value), f"aux loss {key} is not finite"
            for key, value in result.diagnostics.items():
                assert value.dim() == 0 and not value.requires_grad, f"diagnostic {key} must be a detached scalar"
    # every aux loss the variant returns has a weight schedule entry (or is deliberately weight 0)
    assert isinstance(kernel.loss_weights(0, epoch=0), dict)


@pytest.mark.parametrize("name", VARIANTS)
def test_float64_gradcheck(name):
    p = make_problem(batch=1, length=4, dim=DIM)
    kernel = kernel_for(name).eval()
    q = p.q.clone().requires_grad_(True)
    k = p.k.clone().requires_grad_(True)
    v = p.v.clone().requires_grad_(True)

    def f(q, k, v):
        out, _ = kernel(q, k, v, p.dense, scale=SCALE)
        return out

    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-5)


def has_reachable_limit(name: str) -> bool:
    """Names that fix a limit value otherwise (sparsemax fixes alpha=2) are a fixed member of a family
    whose free name (entmax) carries the limit test."""
    entry = attention_entry(name)
    limit = entry.cls.softmax_limit
    return limit is not None and all(entry.preset.get(k, v) == v for k, v in limit.items())


@pytest.mark.parametrize("name", [n for n in VARIANTS if has_reachable_limit(n)])
def test_reduces_to_softmax_at_its_limit(name):
    entry = attention_entry(name)
    limit = {k: v for k, v in entry.cls.softmax_limit.items() if k not in entry.preset}
    p = make_problem()
    kernel = kernel_for(name, **limit).train()
    atol = entry.cls.softmax_limit_atol
    reference = p.dense.softmax(p.dense.scores(p.q, p.k, SCALE))
    torch.testing.assert_close(dense_weights(kernel, p).weights, reference, atol=atol, rtol=0)
    torch.testing.assert_close(segment_weights(kernel, p).weights, p.dense_at_edges(reference), atol=atol, rtol=0)


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
