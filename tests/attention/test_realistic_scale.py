"""Numerics at the scale real data brings: graph nodes with hundreds of incoming edges (Cora has a node with
169, PubMed hundreds), and logits near +-1000 in float32 (a sharp head late in training). Small test graphs
with a dozen keys per node hide off-by-one errors in the support count of the sort-free solvers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from entmax import entmax_bisect, sparsemax

from modules.attention import DenseGroups, SegmentGroups, build_attention

HEADS = 2
DEGREES = (300, 169, 1, 2, 40)
"""In-degree of each destination node: a hub, Cora's largest, and small ones beside them."""


def hub_graph(seed=0):
    g = torch.Generator().manual_seed(seed)
    num_nodes = max(DEGREES) + 1
    dst = torch.cat([torch.full((d,), node) for node, d in enumerate(DEGREES)])
    src = torch.cat([torch.randperm(num_nodes, generator=g)[:d] for d in DEGREES])
    order = torch.randperm(len(dst), generator=g)  # edges in no particular order
    return SegmentGroups(dst=dst[order], src=src[order], num_nodes=num_nodes)


def kernel(name, dtype, **overrides):
    torch.manual_seed(0)
    return build_attention({"name": name, **overrides}, num_heads=HEADS, head_dim=8).to(dtype)


def rows_of(values, groups, node):
    """The [degree, H] entries of one destination node, in edge order."""
    return values[groups.dst == node]


@pytest.mark.parametrize("solver", ["newton", "pad"])
@pytest.mark.parametrize("name, alpha", [("sparsemax", 2.0), ("entmax15", 1.5), ("entmax", 1.25)])
def test_entmax_family_on_nodes_with_hundreds_of_edges_matches_the_package(name, alpha, solver):
    groups = hub_graph()
    g = torch.Generator().manual_seed(1)
    # scale 0.1: near-ties among hundreds of keys, so the support has many members (about 20 for sparsemax,
    # 220 for entmax15 on the hub) and a miscount shows
    logits = torch.randn(groups.dst.numel(), HEADS, dtype=torch.float64, generator=g) * 0.1
    attention = kernel(name, torch.float64, alpha=alpha, segment_solver=solver)
    weights = attention.normalize(logits, groups, q=None, k=None).weights
    if attention.alpha_logit is not None:  # a learned alpha went through its float32 parameter
        alpha = float(attention.alpha().detach()[0])
    for node, degree in enumerate(DEGREES):
        rows = rows_of(logits, groups, node).T  # [H, degree]
        expected = sparsemax(rows, dim=-1) if name == "sparsemax" else entmax_bisect(rows, alpha, dim=-1, n_iter=100)
        got = rows_of(weights, groups, node).T
        torch.testing.assert_close(got, expected, atol=1e-9, rtol=0, msg=f"node {node} with {degree} edges")
        if degree == 300:
            support = int((got > 0).sum(-1).min())
            assert support > 10 and (name == "entmax" or support < 300), f"the hub should keep many keys but not all ({support})"


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_float32_on_a_300_edge_node_stays_within_float_error_of_the_package(name):
    groups = hub_graph(seed=2)
    logits64 = torch.randn(groups.dst.numel(), HEADS, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 0.3
    weights = kernel(name, torch.float32).normalize(logits64.float(), groups, q=None, k=None).weights
    assert weights.dtype == torch.float32
    rows = rows_of(logits64, groups, 0).T
    expected = sparsemax(rows, dim=-1) if name == "sparsemax" else entmax_bisect(rows, 1.5, dim=-1, n_iter=100)
    torch.testing.assert_close(rows_of(weights, groups, 0).T.double(), expected, atol=2e-5, rtol=0)
    torch.testing.assert_close(groups.sum(weights)[: len(DEGREES)], torch.ones(len(DEGREES), HEADS), atol=1e-5, rtol=0)


def test_sparsemax_support_on_the_hub_equals_the_sort_based_count():
    """Martins & Astudillo (2016), Alg. 1: the support size k is the largest k with 1 + k z_(k) > sum_{j<=k} z_(j)."""
    groups = hub_graph(seed=4)
    logits = torch.randn(groups.dst.numel(), HEADS, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) * 0.3
    weights = kernel("sparsemax", torch.float64).normalize(logits, groups, q=None, k=None).weights
    for h in range(HEADS):
        z = np.sort(rows_of(logits, groups, 0)[:, h].numpy())[::-1]
        ranks = np.arange(1, len(z) + 1)
        expected_support = ranks[1 + ranks * z > np.cumsum(z)].max()
        assert int((rows_of(weights, groups, 0)[:, h] > 0).sum()) == expected_support


LARGE = torch.tensor([1000.0, -1000.0, 999.0, 0.0, -999.5, 1000.0 - 30.0])
"""Near +-1000 in float32: exp overflows without the max shift; 1000 and 999 differ by one nat."""


def test_softmax_on_logits_near_1000_in_float32_is_finite_and_exact_dense_and_segment():
    expected = torch.softmax(LARGE.double(), -1)  # reference in float64
    dense_logits = LARGE.view(1, 1, 1, -1).expand(1, HEADS, 1, -1).contiguous()
    dense = kernel("softmax", torch.float32).normalize(dense_logits, DenseGroups(None), q=None, k=None).weights[0, :, 0]
    groups = SegmentGroups(dst=torch.zeros(len(LARGE), dtype=torch.long), src=torch.arange(len(LARGE)), num_nodes=len(LARGE))
    segment = kernel("softmax", torch.float32).normalize(LARGE[:, None].expand(-1, HEADS).contiguous(), groups, q=None, k=None).weights.T
    for weights in (dense, segment):
        assert weights.dtype == torch.float32 and torch.isfinite(weights).all()
        torch.testing.assert_close(weights.double(), expected.expand_as(weights), atol=1e-7, rtol=1e-6)
        # what underflows is exactly zero, not NaN or a tiny negative
        assert (weights[:, [1, 3, 4]] == 0).all()


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_softmax_with_one_clear_winner_near_1000_is_exactly_one_hot(sign):
    # every other logit at least 150 nats below the winner: exp(-150) underflows to 0 in float32 (below 1e-45)
    logits = sign * torch.tensor([1000.0, 850.0, 700.0, 800.0]) if sign > 0 else torch.tensor([-1000.0, -1150.0, -1300.0, -1200.0])
    one_hot = torch.tensor([1.0, 0.0, 0.0, 0.0]).expand(HEADS, -1)
    dense = kernel("softmax", torch.float32).normalize(logits.view(1, 1, 1, -1).expand(1, HEADS, 1, -1).contiguous(), DenseGroups(None), q=None, k=None)
    assert torch.equal(dense.weights[0, :, 0], one_hot)
    groups = SegmentGroups(dst=torch.tensor([1, 1, 1, 1]), src=torch.tensor([0, 2, 3, 4]), num_nodes=5)
    segment = kernel("softmax", torch.float32).normalize(logits[:, None].expand(-1, HEADS).contiguous(), groups, q=None, k=None)
    assert torch.equal(segment.weights.T, one_hot)


def test_sparse_maps_on_logits_near_1000_in_float32_are_finite_and_exact():
    logits = torch.tensor([1000.0, 999.5, -1000.0, 998.0]).view(1, 1, 1, -1).expand(1, HEADS, 1, -1).contiguous()
    sparse = kernel("sparsemax", torch.float32).normalize(logits, DenseGroups(None), q=None, k=None).weights[0, :, 0]
    # sparsemax([1000, 999.5, ...]) = [0.75, 0.25, 0, 0]: tau = 999.25
    assert torch.equal(sparse, torch.tensor([0.75, 0.25, 0.0, 0.0]).expand(HEADS, -1))
    ent = kernel("entmax15", torch.float32).normalize(logits, DenseGroups(None), q=None, k=None).weights[0, :, 0]
    assert torch.isfinite(ent).all()
    torch.testing.assert_close(ent.double(), entmax_bisect(logits[0, 0, 0].double() - 1000, 1.5, n_iter=100).expand(HEADS, -1), atol=1e-5, rtol=0)
