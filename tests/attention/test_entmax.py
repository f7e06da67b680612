"""sparsemax / entmax15 / entmax against independent references: a numpy sort-based sparsemax (Martins &
Astudillo 2016, Alg. 1), the `entmax` package's bisection, finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from entmax import entmax_bisect

from modules.attention import DenseGroups, SegmentGroups, build_attention
from modules.attention.variants.entmax import GroupedEntmax

HEADS = 3
# entmax reads only the logits: its tests pass no queries or keys (q=None, k=None).


def sparsemax_reference(z: np.ndarray) -> np.ndarray:
    """Martins & Astudillo (2016), Algorithm 1, one row at a time."""
    z_sorted = np.sort(z)[::-1]
    cumulative = np.cumsum(z_sorted)
    ranks = np.arange(1, len(z) + 1)
    support = ranks[1 + ranks * z_sorted > cumulative].max()
    tau = (cumulative[support - 1] - 1) / support
    return np.maximum(z - tau, 0.0)


def random_graph(num_nodes=12, seed=0):
    """In-degrees 0 (node 0), 1 (node 1) and up to num_nodes-1 (node 2); the rest random."""
    g = torch.Generator().manual_seed(seed)
    dst, src = [1], [5]
    dst += [2] * (num_nodes - 1)
    src += [j for j in range(num_nodes) if j != 2]
    for i in range(3, num_nodes):
        k = int(torch.randint(1, num_nodes, (1,), generator=g))
        nbrs = torch.randperm(num_nodes, generator=g)[:k].tolist()
        dst += [i] * k
        src += nbrs
    perm = torch.randperm(len(dst), generator=g)  # edges in no particular order
    dst, src = torch.tensor(dst)[perm], torch.tensor(src)[perm]
    return SegmentGroups(dst=dst, src=src, num_nodes=num_nodes)


def kernel(name, **overrides):
    torch.manual_seed(0)
    return build_attention({"name": name, **overrides}, num_heads=HEADS, head_dim=4).double()


def per_destination(weights: torch.Tensor, groups: SegmentGroups, node: int, head: int):
    return weights[groups.dst == node, head]


def package_on_padded(logits, groups, alpha):
    rows, unpad = groups.pad(logits, float("-inf"))
    empty = torch.isneginf(rows).all(-1, keepdim=True)
    return unpad(entmax_bisect(rows.masked_fill(empty, 0.0), alpha, n_iter=80))


@pytest.mark.parametrize("solver", ["newton", "pad"])
@pytest.mark.parametrize("name,alpha", [("sparsemax", 2.0), ("entmax15", 1.5), ("entmax", 1.3)])
def test_segment_path_matches_the_package_on_padded_rows(name, alpha, solver):
    groups = random_graph()
    logits = torch.randn(groups.dst.numel(), HEADS, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 2
    attention = kernel(name, alpha=alpha, segment_solver=solver)
    weights = attention.normalize(logits, groups, q=None, k=None).weights
    if attention.alpha_logit is not None:  # the learned α went through float32 (the parameter's dtype)
        alpha = attention.alpha().detach().view(-1, 1)
    reference = package_on_padded(logits, groups, alpha)
    torch.testing.assert_close(weights, reference, atol=1e-9, rtol=0)
    assert (weights == 0).any(), "sparse maps should give some edges exactly zero weight"


def test_sparsemax_matches_the_sort_based_reference_dense_and_segment():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, HEADS, 5, 7, dtype=torch.float64, generator=g) * 3
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 4:] = False
    dense = kernel("sparsemax").normalize(logits, DenseGroups(mask), q=None, k=None).weights
    for b in range(2):
        valid = 7 if b == 0 else 4
        for h in range(HEADS):
            for i in range(5):
                expected = np.zeros(7)
                expected[:valid] = sparsemax_reference(logits[b, h, i, :valid].numpy())
                np.testing.assert_allclose(dense[b, h, i].numpy(), expected, atol=1e-12)
    groups = random_graph(seed=3)
    seg_logits = torch.randn(groups.dst.numel(), HEADS, dtype=torch.float64, generator=g) * 3
    segment = kernel("sparsemax").normalize(seg_logits, groups, q=None, k=None).weights
    for node in range(1, groups.num_nodes):
        for h in range(HEADS):
            expected = sparsemax_reference(per_destination(seg_logits, groups, node, h).numpy())
            np.testing.assert_allclose(per_destination(segment, groups, node, h).numpy(), expected, atol=1e-12)


def test_entmax15_matches_bisection_at_alpha_1_5_and_masked_rows_are_zero():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, HEADS, 4, 6, dtype=torch.float64, generator=g) * 2
    mask = torch.ones(2, 1, 4, 6, dtype=torch.bool)
    mask[1, :, :, 3:] = False
    mask[1, :, 2] = False  # a query with no key at all
    weights = kernel("entmax15").normalize(logits, DenseGroups(mask), q=None, k=None).weights
    reference = entmax_bisect(logits.masked_fill(~mask, float("-inf"))[0], 1.5, n_iter=80)
    torch.testing.assert_close(weights[0], reference, atol=1e-10, rtol=0)
    reference = entmax_bisect(logits[1, :, [0, 1, 3], :3], 1.5, n_iter=80)
    torch.testing.assert_close(weights[1, :, [0, 1, 3], :3], reference, atol=1e-10, rtol=0)
    assert torch.isfinite(weights).all()
    assert (weights[1, :, 2] == 0).all() and (weights[1, :, :, 3:] == 0).all()
    assert (weights == 0).any(), "1.5-entmax should give exact zeros"


@pytest.mark.parametrize("alpha", [2.0, 1.5, 1.3])
def test_newton_solver_is_exact_on_a_graph_with_dense_rows_too(alpha):
    """The Groups-generic Newton solver on dense groups (not used there by default) against the package."""
    logits = torch.randn(2, HEADS, 4, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) * 3
    weights = GroupedEntmax.apply(logits, alpha, DenseGroups(None), 100)
    torch.testing.assert_close(weights, entmax_bisect(logits, alpha, n_iter=80), atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax"])
def test_gradcheck_of_the_segment_newton_path(name):
    groups = random_graph(num_nodes=7, seed=6)
    attention = kernel(name).eval()
    logits = torch.randn(groups.dst.numel(), HEADS, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: attention.normalize(x, groups, q=None, k=None).weights, (logits,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("segment", [True, False])
def test_learned_alpha_gets_the_finite_difference_gradient(segment):
    attention = kernel("entmax", alpha=1.4)
    g = torch.Generator().manual_seed(8)
    if segment:
        groups = random_graph(num_nodes=8, seed=9)
        logits = torch.randn(groups.dst.numel(), HEADS, dtype=torch.float64, generator=g)
    else:
        groups = DenseGroups(torch.tensor([True, True, True, True, False])[None, None, None])
        logits = torch.randn(2, HEADS, 3, 5, dtype=torch.float64, generator=g)
    probe = torch.randn(logits.shape, dtype=torch.float64, generator=g)

    def loss():
        return (attention.normalize(logits, groups, q=None, k=None).weights * probe).sum()

    loss().backward()
    grad = attention.alpha_logit.grad.clone()
    assert grad.abs().min() > 0, "every head's alpha should receive a gradient"
    with torch.no_grad():
        for h in range(HEADS):
            attention.alpha_logit[h] += 1e-6
            up = loss().item()
            attention.alpha_logit[h] -= 2e-6
            down = loss().item()
            attention.alpha_logit[h] += 1e-6
            assert grad[h].item() == pytest.approx((up - down) / 2e-6, rel=1e-4, abs=1e-8)


def test_learned_alpha_starts_at_the_config_and_is_reported():
    attention = kernel("entmax", alpha=1.7).eval()
    torch.testing.assert_close(attention.alpha(), torch.full((HEADS,), 1.7, dtype=torch.float64))
    groups = random_graph()
    result = attention.normalize(torch.randn(groups.dst.numel(), HEADS, dtype=torch.float64), groups, q=None, k=None)
    assert result.diagnostics["alpha"].item() == pytest.approx(1.7)
    assert {"entropy", "support"} <= set(result.diagnostics)


def test_sparsemax_keeps_fewer_keys_than_entmax15_and_softmax_keeps_all():
    groups = random_graph(seed=10)
    logits = torch.randn(groups.dst.numel(), HEADS, dtype=torch.float64, generator=torch.Generator().manual_seed(11)) * 2
    support = {n: groups.support(kernel(n).normalize(logits, groups, q=None, k=None).weights).item() for n in ("sparsemax", "entmax15")}
    keys_per_node = groups.support(torch.ones_like(logits)).item()
    assert support["sparsemax"] <= support["entmax15"] < keys_per_node


def test_names_fix_whether_alpha_is_learned_and_configs_are_checked():
    with pytest.raises(ValueError):
        build_attention({"name": "sparsemax", "learn_alpha": True}, num_heads=2, head_dim=4)
    with pytest.raises(ValueError):
        build_attention({"name": "entmax", "alpha": 2.0}, num_heads=2, head_dim=4)  # 1 + sigmoid < 2
    with pytest.raises(ValueError):
        build_attention({"name": "entmax15", "alpha": 0.9}, num_heads=2, head_dim=4)
    assert build_attention("sparsemax", num_heads=2, head_dim=4).alpha() == 2.0
    assert build_attention("entmax15", num_heads=2, head_dim=4).alpha() == 1.5
    assert not list(build_attention("sparsemax", num_heads=2, head_dim=4).parameters())
