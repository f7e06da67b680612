"""Fenchel-dual attention: T5 buckets, priors, and the dual solved against scipy (independent references)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from scipy.special import logsumexp, softmax as np_softmax

from modules.attention import AttentionSite, SegmentGroups, build_attention
from modules.attention.variants.fenchel import t5_relative_position_bucket

from .conftest import make_problem

HEADS, DIM = 2, 4
SCALE = DIM**-0.5


TEXT = AttentionSite("text", "self", sequence=True)  # where the position prior applies


def kernel(name, site=TEXT, **config):
    torch.manual_seed(0)
    return build_attention({"name": name, **config}, num_heads=HEADS, head_dim=DIM, site=site).double().eval()


# ---- T5 buckets ----------------------------------------------------------------------------------
# Worked by hand for bidirectional, 32 buckets, max_distance 128: 16 buckets per direction, keys after
# the query (positive relative position) in 16..31; distances < 8 exact; else 8 + floor(8·log(n/8)/log 16),
# capped at 15. E.g. n=12: 8·log(1.5)/log(16) = 1.17 -> 9; n=90: 8·log(11.25)/log(16) = 6.98 -> 14.
T5_TABLE = {
    0: 0, -1: 1, 1: 17, -7: 7, 7: 23, -8: 8, 9: 24, -12: 9, 20: 26, -31: 11,
    45: 28, -60: 13, 90: 30, -100: 15, 127: 31, -128: 15, 1000: 31, -1000: 15,
}


def test_t5_bucket_matches_hand_table():
    rel = torch.tensor(list(T5_TABLE))
    assert t5_relative_position_bucket(rel).tolist() == list(T5_TABLE.values())


def test_position_prior_is_added_by_bucket_and_changes_weights():
    p = make_problem()
    attn = kernel("fenchel", prior="position")
    logits = attn.score(p.q, p.k, p.dense, scale=SCALE)
    before = attn.normalize(logits, p.dense, q=p.q, k=p.k).weights
    with torch.no_grad():
        attn.position_bias.weight.normal_()
    after = attn.normalize(logits, p.dense, q=p.q, k=p.k).weights
    assert (after - before).abs().max() > 1e-2
    # length 5: every distance is an exact bucket, |j - i| before the query and 16 + (j - i) after it
    table = attn.position_bias.weight.detach()
    length = p.q.shape[2]
    bias = torch.empty(HEADS, length, length, dtype=torch.float64)
    for i in range(length):
        for j in range(length):
            bias[:, i, j] = table[abs(j - i) + (16 if j > i else 0)]
    reference = p.dense.softmax(logits + bias)
    torch.testing.assert_close(after, reference)
    assert attn.normalize(logits, p.dense, q=p.q, k=p.k).diagnostics["prior_std"] > 0


def test_alpha_multiplies_the_logits_handed_in():
    p = make_problem()
    logits = torch.randn(p.segment.dst.shape[0], HEADS, dtype=torch.float64)
    attn = kernel("fenchel", prior="uniform", alpha=0.3)
    torch.testing.assert_close(attn.normalize(logits, p.segment, q=p.nodes(p.q), k=p.nodes(p.k)).weights, p.segment.softmax(0.3 * logits))
    learned = kernel("fenchel", prior="uniform", alpha=0.3, learn_alpha=True)
    assert learned.log_alpha.requires_grad
    torch.testing.assert_close(learned.normalize(logits, p.segment, q=p.nodes(p.q), k=p.nodes(p.k)).weights, p.segment.softmax(0.3 * logits))


def star_graph(leaves: int) -> SegmentGroups:
    centre = torch.zeros(leaves, dtype=torch.long)
    leaf = torch.arange(1, leaves + 1)
    nodes = torch.arange(leaves + 1)
    src = torch.cat([leaf, centre, nodes])  # leaf -> centre, centre -> leaf, self-loops
    dst = torch.cat([centre, leaf, nodes])
    return SegmentGroups(dst=dst, src=src, num_nodes=leaves + 1)


@pytest.mark.parametrize("prior", ["degree", "position"])  # position falls back to degree on graphs
def test_degree_prior_on_a_star_graph(prior):
    leaves, w = 5, 0.7
    groups = star_graph(leaves)
    attn = kernel("fenchel", prior=prior, site=AttentionSite("graph"))
    with torch.no_grad():
        attn.degree_weight.fill_(w)
    logits = torch.zeros(groups.dst.shape[0], HEADS, dtype=torch.float64)
    nodes = torch.zeros(leaves + 1, HEADS, DIM, dtype=torch.float64)
    weights = attn.normalize(logits, groups, q=nodes, k=nodes).weights
    # u ∝ degree^w; the centre is attended by all leaves and itself, a leaf by the centre and itself
    centre_mass, leaf_mass = (leaves + 1) ** w, 2**w
    centre_row = groups.dst == 0
    on_centre = centre_row & (groups.src == 0)
    torch.testing.assert_close(weights[on_centre], torch.full((1, HEADS), centre_mass / (centre_mass + leaves * leaf_mass), dtype=torch.float64))
    leaf_to_centre = (groups.dst == 1) & (groups.src == 0)
    torch.testing.assert_close(weights[leaf_to_centre], torch.full((1, HEADS), centre_mass / (centre_mass + leaf_mass), dtype=torch.float64))
    # zero weight = uniform prior
    with torch.no_grad():
        attn.degree_weight.zero_()
    torch.testing.assert_close(attn.normalize(logits, groups, q=nodes, k=nodes).weights, groups.softmax(logits))


@pytest.mark.parametrize("learn_alpha", [False, True])
def test_dense_fast_path_matches_the_weights_path(learn_alpha):
    p = make_problem()
    attn = kernel("fenchel", prior="position", alpha=0.6, learn_alpha=learn_alpha)
    with torch.no_grad():
        attn.position_bias.weight.normal_()
    slow, _ = attn(p.q, p.k, p.v, p.dense, scale=SCALE)
    fast, result = attn(p.q, p.k, p.v, p.dense, scale=SCALE, need_weights=False)
    assert result.weights is None
    torch.testing.assert_close(fast, slow)


# ---- fenchel-exact against scipy -----------------------------------------------------------------
def scipy_lambda(t: np.ndarray, z: np.ndarray, log_u: np.ndarray, alpha: float) -> np.ndarray:
    """argmax of eq. 13 for one query, by BFGS on the negated dual."""
    u = np_softmax(log_u)
    mu = u @ t

    def negated(lam):
        s = log_u + t @ lam
        value = lam @ (mu + z) - lam @ lam / (2 * alpha) - logsumexp(s)
        grad = mu + z - lam / alpha - np_softmax(s) @ t
        return -value, -grad

    res = minimize(negated, alpha * z, jac=True, method="BFGS", options={"gtol": 1e-12, "maxiter": 1000})
    return res.x


def test_exact_dual_matches_scipy_dense():
    p = make_problem()
    alpha = 0.8
    attn = kernel("fenchel-exact", prior="uniform", alpha=alpha, steps=25)
    logits = attn.score(p.q, p.k, p.dense, scale=SCALE)
    exponent, bias = attn.first_order_logits(logits, p.dense)
    templates = attn.templates(p.k)
    delta = attn.solve_dual(exponent, p.dense, templates, bias)
    weights = attn.normalize(logits, p.dense, q=p.q, k=p.k).weights
    t_all, z_all = templates.numpy(), (p.q * DIM**-0.25).numpy()
    for b in range(p.q.shape[0]):
        valid = p.key_valid[b].numpy()
        for h in range(HEADS):
            for i in range(p.q.shape[2]):
                t = t_all[b, h][valid]
                lam = scipy_lambda(t, z_all[b, h, i], np.zeros(len(t)), alpha)
                np.testing.assert_allclose(alpha * z_all[b, h, i] + delta[b, h, i].numpy(), lam, atol=1e-6)
                np.testing.assert_allclose(weights[b, h, i].numpy()[valid], np_softmax(t @ lam), atol=1e-6)


def test_exact_dual_matches_scipy_segment_with_host_logits():
    """On GAT the logits are not <t, z>: with λ = αz + δ the dual in δ is
    <δ, μ> - ||δ||²/(2α) - log Σ_i u_i exp(a_i + <t_i, δ>) with a_i the (α-scaled) host logits."""
    p = make_problem()
    g = torch.Generator().manual_seed(1)
    k = p.nodes(p.k)
    logits = torch.randn(p.segment.dst.shape[0], HEADS, generator=g, dtype=torch.float64)
    alpha = 1.5
    attn = kernel("fenchel-exact", prior="degree", alpha=alpha, steps=25)
    with torch.no_grad():
        attn.degree_weight.copy_(torch.tensor([0.5, -0.3]))
    with torch.no_grad():
        exponent, bias = attn.first_order_logits(logits, p.segment)
        templates = attn.templates(k)
        delta = attn.solve_dual(exponent, p.segment, templates, bias)
        weights = attn.normalize(logits, p.segment, q=k, k=k).weights
    degree = torch.bincount(p.segment.src).double()
    for node in range(p.segment.num_nodes):
        edges = (p.segment.dst == node).nonzero().squeeze(1)
        if edges.numel() == 0:
            continue  # a padded token: no query
        keys = p.segment.src[edges]
        for h in range(HEADS):
            t = templates[keys, h].numpy()
            a = alpha * logits[edges, h].numpy()
            log_u = attn.degree_weight[h].item() * degree[keys].log().numpy()
            mu = np_softmax(log_u) @ t

            def negated(d):
                s = log_u + a + t @ d
                return -(d @ mu - d @ d / (2 * alpha) - logsumexp(s)), -(mu - d / alpha - np_softmax(s) @ t)

            ref = minimize(negated, np.zeros(DIM), jac=True, method="BFGS", options={"gtol": 1e-12}).x
            np.testing.assert_allclose(delta[node, h].numpy(), ref, atol=1e-6)
            np.testing.assert_allclose(weights[edges, h].numpy(), np_softmax(log_u + a + t @ ref), atol=1e-6)


def test_fixed_point_agrees_with_newton():
    p = make_problem()
    newton = kernel("fenchel-exact", prior="uniform", alpha=0.5, steps=10, solver="newton")
    fixed = kernel("fenchel-exact", prior="uniform", alpha=0.5, steps=60, solver="fixed_point")
    for groups, q, k in ((p.dense, p.q, p.k), (p.segment, p.nodes(p.q), p.nodes(p.k))):
        logits = newton.score(q, k, groups, scale=SCALE)
        a = newton.normalize(logits, groups, q=q, k=k).weights
        b = fixed.normalize(logits, groups, q=q, k=k).weights
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
        assert (a - groups.softmax(logits)).abs().max() > 1e-3  # the correction is not negligible


def test_lambda_gap_shrinks_as_alpha_goes_to_zero():
    p = make_problem()
    gaps = []
    for alpha in (2.0, 1.0, 0.3, 0.1, 0.03):
        attn = kernel("fenchel-exact", prior="uniform", alpha=alpha, steps=8)
        logits = attn.score(p.q, p.k, p.dense, scale=SCALE)
        diagnostics = attn.normalize(logits, p.dense, q=p.q, k=p.k).diagnostics
        gaps.append(diagnostics["lambda_gap"].item())
        assert diagnostics["kl_to_first_order"] >= 0
    assert all(a > b for a, b in zip(gaps, gaps[1:])), gaps
    assert gaps[-1] < 0.1 * gaps[0]


def test_exact_with_zero_steps_is_fenchel():
    p = make_problem()
    exact = kernel("fenchel-exact", prior="position", alpha=0.7, steps=0)
    approx = kernel("fenchel", prior="position", alpha=0.7)
    with torch.no_grad():
        exact.position_bias.weight.normal_()
        approx.position_bias.weight.copy_(exact.position_bias.weight)
    logits = exact.score(p.q, p.k, p.dense, scale=SCALE)
    torch.testing.assert_close(exact.normalize(logits, p.dense, q=p.q, k=p.k).weights, approx.normalize(logits, p.dense, q=p.q, k=p.k).weights)


def test_bad_config_is_rejected():
    with pytest.raises(ValueError):
        build_attention({"name": "fenchel", "prior": "positional"}, num_heads=2, head_dim=4)
    with pytest.raises(ValueError):
        build_attention({"name": "fenchel-exact", "solver": "gd"}, num_heads=2, head_dim=4)


def test_newton_implicit_gradient_matches_unrolled_fixed_point_gradient():
    """Newton backpropagates through one step only (implicit function theorem); at convergence that
    equals the gradient of a long unrolled fixed-point solve (α small enough for the map to contract:
    with two keys ||Cov|| can exceed 1/0.5, and then the fixed point oscillates)."""
    p = make_problem(batch=1, length=4)
    grads = []
    for solver, steps in (("newton", 8), ("fixed_point", 80)):
        attn = kernel("fenchel-exact", prior="uniform", alpha=0.2, steps=steps, solver=solver)
        q, k = p.q.clone().requires_grad_(), p.k.clone().requires_grad_()
        out, _ = attn(q, k, p.v, p.dense, scale=SCALE)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads.append((q.grad, k.grad))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-8, rtol=1e-6)
