"""Kernels read where they sit (AttentionSite) through the interface: fenchel's T5 position prior only for
self-attention over a token sequence, the paper's uniform u on image grids, cross-attention and pooling
(§4.2), the degree prior on graphs."""

from __future__ import annotations

import pytest
import torch

from modules.attention import AttentionSite, build_attention

from .conftest import make_problem

HEADS, DIM = 2, 4
SCALE = DIM**-0.5


def fenchel_at(site: AttentionSite, **config):
    torch.manual_seed(0)
    kernel = build_attention({"name": "fenchel", **config}, num_heads=HEADS, head_dim=DIM, site=site).double().eval()
    with torch.no_grad():
        kernel.position_bias.weight.normal_()
        kernel.degree_weight.normal_()
    return kernel


@pytest.mark.parametrize("site", [AttentionSite("vision-language", "self"), AttentionSite("vision-language", "cross"),
                                  AttentionSite("vision-language", "pool"), AttentionSite("any")])
def test_position_prior_is_uniform_off_sequences(site):
    p = make_problem()
    kernel = fenchel_at(site)
    logits = kernel.score(p.q, p.k, p.dense, scale=SCALE)
    result = kernel.normalize(logits, p.dense, q=p.q, k=p.k)
    torch.testing.assert_close(result.weights, p.dense.softmax(logits))
    assert result.diagnostics["prior_std"] == 0
    # the fused path agrees (it would add the bucket bias if it read the layout instead of the site)
    fused, _ = kernel(p.q, p.k, p.v, p.dense, scale=SCALE, need_weights=False)
    real = p.key_valid[:, None, :, None].expand_as(fused)
    torch.testing.assert_close(fused[real], p.dense.aggregate(p.dense.softmax(logits), p.v)[real])


def test_position_prior_applies_at_sequence_sites():
    p = make_problem()
    kernel = fenchel_at(AttentionSite("text", "self", sequence=True))
    logits = kernel.score(p.q, p.k, p.dense, scale=SCALE)
    weights = kernel.normalize(logits, p.dense, q=p.q, k=p.k).weights
    assert (weights - p.dense.softmax(logits)).abs().max() > 1e-2


def test_position_prior_falls_back_to_degree_on_graphs():
    p = make_problem()
    q, k = p.nodes(p.q), p.nodes(p.k)
    kernel = fenchel_at(AttentionSite("graph"))
    logits = kernel.score(q, k, p.segment, scale=SCALE)
    weights = kernel.normalize(logits, p.segment, q=q, k=k).weights
    degree = torch.bincount(p.segment.src, minlength=p.segment.num_nodes).double().clamp_min(1)
    expected = p.segment.softmax(logits + degree.log()[p.segment.src, None] * kernel.degree_weight)
    torch.testing.assert_close(weights, expected)
