"""Gaussian-mixture attention against naive numpy/scipy renderings of Movellan & Gabbur's equations.

The references use the full squared distances ‖q - ξ‖², ‖v - μ‖² and explicit priors π_u (eq. 14-15, 28-29,
33-34) on dense arrays; the kernel drops per-query constants and expands the distances, so agreement on both
layouts (dense and the graph twin) checks the algebra, not a copy of it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import logsumexp

from modules.attention import build_attention

from .conftest import make_problem

HEADS, DIM = 2, 4


def gmm_kernel(seed=1, **overrides):
    """A gmm kernel whose learned parameters are moved away from their initial values."""
    kernel = build_attention({"name": "gmm", **overrides}, num_heads=HEADS, head_dim=DIM).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        kernel.log_alpha.copy_(torch.tensor([0.35, 0.8], dtype=torch.float64).log())
        if kernel.coupling is not None:
            kernel.coupling.copy_(torch.tensor([0.3, 1.6], dtype=torch.float64))
        if kernel.offset is not None:
            kernel.offset.copy_(0.5 * torch.randn(HEADS, DIM, generator=g, dtype=torch.float64))
        if kernel.log_beta is not None:
            kernel.log_beta.copy_(kernel.log_beta + torch.tensor([0.0, 0.4], dtype=torch.float64))
    return kernel


def params(kernel):
    """Per-head α, ρ, c, β as numpy arrays shaped for [B, H, Lq, Lk] / [B, H, L, d] broadcasting."""
    alpha = kernel.log_alpha.exp().detach().numpy()[None, :, None, None]
    rho = {"magnitude": np.ones(HEADS), "uniform": np.zeros(HEADS)}.get(kernel.config.prior)
    if rho is None:
        rho = kernel.coupling.detach().numpy()
    offset = np.zeros((HEADS, DIM)) if kernel.offset is None else kernel.offset.detach().numpy()
    beta = 0.0 if kernel.log_beta is None else kernel.log_beta.exp().detach().numpy()[None, :, None, None]
    return alpha, rho[None, :, None, None], offset[None, :, None, :], beta


def sq_dist(a, b):
    return ((a[..., :, None, :] - b[..., None, :, :]) ** 2).sum(-1)


def log_prior(xi, alpha, rho, offset):
    """eq. 15's key-length link (coupled by ρ) plus the linear offset, per key -> [B, H, 1, Lk]."""
    return (rho * alpha / 2 * (xi**2).sum(-1)[:, :, None, :]) + (xi * offset).sum(-1)[:, :, None, :]


def posterior(log_joint, valid):
    """Responsibilities within each query row, masked keys excluded."""
    masked = np.where(valid, log_joint, -np.inf)
    return np.exp(masked - logsumexp(masked, axis=-1, keepdims=True))


def problem_arrays(p):
    valid = p.key_valid.numpy()[:, None, None, :]
    return p.q.numpy(), p.k.numpy(), p.v.numpy(), valid


def run_both(kernel, p, *, with_values=False):
    """(dense weights, segment weights, dense output, segment output) from the kernel."""
    if with_values:
        out_d, res_d = kernel(p.q, p.k, p.v, p.dense)
        out_s, res_s = kernel(p.nodes(p.q), p.nodes(p.k), p.nodes(p.v), p.segment)
        return res_d.weights, res_s.weights, out_d, out_s
    q, k = p.nodes(p.q), p.nodes(p.k)
    dense = kernel.normalize(kernel.score(p.q, p.k, p.dense, scale=DIM**-0.5), p.dense, q=p.q, k=p.k).weights
    segment = kernel.normalize(kernel.score(q, k, p.segment, scale=DIM**-0.5), p.segment, q=q, k=k).weights
    return dense, segment, None, None


def assert_matches(reference, p, dense, segment):
    ref = torch.from_numpy(reference)
    torch.testing.assert_close(dense, ref, atol=1e-10, rtol=1e-8)
    torch.testing.assert_close(segment, p.dense_at_edges(ref), atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("prior", ["learned", "magnitude", "uniform"])
@pytest.mark.parametrize("prior_offset", [False, True])
def test_weights_are_the_unit_posteriors_of_eq14_at_beta_zero(prior, prior_offset):
    p = make_problem(seed=3)
    kernel = gmm_kernel(prior=prior, prior_offset=prior_offset).eval()
    q, k, _, valid = problem_arrays(p)
    alpha, rho, offset, _ = params(kernel)
    reference = posterior(log_prior(k, alpha, rho, offset) - alpha / 2 * sq_dist(q, k), valid)
    assert_matches(reference, p, *run_both(kernel, p)[:2])


def naive_value_em(q, k, v, valid, alpha, rho, offset, beta, iterations):
    """eq. 13-14 with the value-length link of eq. 15 in the prior, started at v_0 = 0:
    returns the weights of the last E-step and the estimate after it."""
    log_pi = log_prior(k, alpha, rho, offset) + beta / 2 * (v**2).sum(-1)[:, :, None, :]
    query_term = log_pi - alpha / 2 * sq_dist(q, k)
    estimate = np.zeros(q.shape[:-1] + v.shape[-1:])
    for _ in range(iterations + 1):
        weights = posterior(query_term - beta / 2 * sq_dist(estimate, v), valid)
        estimate = weights @ v
    return weights, estimate


@pytest.mark.parametrize("iterations", [1, 3])
def test_em_value_iterations_match_eq13_14(iterations):
    p = make_problem(seed=4)
    kernel = gmm_kernel(beta=0.7, iterations=iterations, prior_offset=True).eval()
    q, k, v, valid = problem_arrays(p)
    alpha, rho, offset, beta = params(kernel)
    weights, estimate = naive_value_em(q, k, v, valid, alpha, rho, offset, beta, iterations)
    dense_w, segment_w, out_d, out_s = run_both(kernel, p, with_values=True)
    assert_matches(weights, p, dense_w, segment_w)
    torch.testing.assert_close(out_d, torch.from_numpy(estimate), atol=1e-10, rtol=1e-8)
    torch.testing.assert_close(p.real_nodes(out_s), p.real_nodes(p.nodes(torch.from_numpy(estimate))), atol=1e-10, rtol=1e-8)
    # normalize without values gives the t = 0 (β-free) weights
    weights0, _ = naive_value_em(q, k, v, valid, alpha, rho, offset, beta, 0)
    assert_matches(weights0, p, *run_both(kernel, p)[:2])


def test_em_iterations_increase_the_mixture_likelihood_and_reach_a_fixed_point():
    p = make_problem(seed=5, length=6)
    q, k, v, valid = problem_arrays(p)

    def log_likelihood(kernel, estimate):
        """log p(q, v) up to constants: logsumexp_u log π_u - α/2‖q-ξ_u‖² - β/2‖v-μ_u‖² (eq. 9)."""
        alpha, rho, offset, beta = params(kernel)
        log_pi = log_prior(k, alpha, rho, offset) + beta / 2 * (v**2).sum(-1)[:, :, None, :]
        joint = log_pi - alpha / 2 * sq_dist(q, k) - beta / 2 * sq_dist(estimate, v)
        return logsumexp(np.where(valid, joint, -np.inf), axis=-1)

    values = []
    for iterations in range(6):
        kernel = gmm_kernel(beta=3.0, iterations=iterations).eval()
        out, _ = kernel(p.q, p.k, p.v, p.dense)
        values.append(log_likelihood(kernel, out.detach().numpy()))
    values = np.stack(values)
    valid_rows = np.broadcast_to(valid.any(-1), values.shape[1:])
    steps = np.diff(values, axis=0)[:, valid_rows]
    assert (steps >= -1e-10).all(), "an EM step decreased log p(q, v)"
    assert steps.sum() > 1e-3, "EM did not move the estimate"

    kernel = gmm_kernel(beta=3.0, iterations=200).eval()
    out, result = kernel(p.q, p.k, p.v, p.dense)
    # eq. 13 at the fixed point: v* = Σ_u w_u(v*) μ_u
    torch.testing.assert_close(out, torch.matmul(result.weights, p.v), atol=1e-8, rtol=0)
    assert result.diagnostics["em_step"] < 1e-8


def naive_adaptation(q, k, valid, alpha, rho, offset, *, gamma=None, eta=None, steps=1):
    """Key adaptation (eq. 28-29) and/or prior adaptation (eq. 33-34), written as in the paper. The batch
    of queries is the real tokens of a sequence: `valid` [B, 1, 1, L] is self-attention's key padding, so a
    padded token is no query either."""
    real_queries = np.swapaxes(valid, -1, -2)  # [B, 1, L, 1]
    xi, log_pi = k, log_prior(k, alpha, rho, offset)
    pi0 = np.exp(log_pi)
    mean_pi0 = (np.where(valid, pi0, 0).sum(-1, keepdims=True)) / valid.sum(-1, keepdims=True)
    eta_u = None if eta is None else eta * pi0 / mean_pi0  # η ∝ π⁰, per query's key set
    for _ in range(steps):
        w = posterior(log_pi - alpha / 2 * sq_dist(q, xi), valid) * real_queries  # [B, H, Lq, Lk]
        w_bar = w.sum(-2)  # eq. 34, [B, H, Lk]
        if gamma is not None:
            with np.errstate(invalid="ignore", divide="ignore"):
                q_bar = np.einsum("bhik,bhid->bhkd", w, q) / w_bar[..., None]  # eq. 29
            a = alpha[..., 0]  # [1, H, 1] -> broadcast over keys, with a trailing feature axis below
            adapted = gamma / (a + gamma)[..., None] * k + (a / (a + gamma))[..., None] * q_bar  # eq. 28
            xi = np.where(w_bar[..., None] > 0, adapted, k)
        if eta is not None:
            unnormalised = w_bar[:, :, None, :] * (1 + eta_u)  # eq. 33
            total = np.where(valid, unnormalised, 0).sum(-1, keepdims=True)
            with np.errstate(divide="ignore"):  # masked keys: log 0, excluded by `posterior`
                log_pi = np.log(unnormalised / total)
        else:
            log_pi = log_prior(xi, alpha, rho, offset)  # the prior stays linked to the key length
    return posterior(log_pi - alpha / 2 * sq_dist(q, xi), valid)


@pytest.mark.parametrize(
    "adaptation",
    [
        {"gamma": 0.5},
        {"gamma": 0.0, "adapt_steps": 3},
        {"eta": 2.0},
        {"eta": 0.0, "adapt_steps": 2},
        {"gamma": 1.5, "eta": 0.7, "adapt_steps": 2},
    ],
)
@pytest.mark.parametrize("prior_offset", [False, True])
def test_inference_time_adaptation_matches_eq28_and_eq33(adaptation, prior_offset):
    p = make_problem(seed=6)
    kernel = gmm_kernel(prior_offset=prior_offset, **adaptation).eval()
    q, k, _, valid = problem_arrays(p)
    alpha, rho, offset, _ = params(kernel)
    reference = naive_adaptation(
        q, k, valid, alpha, rho, offset,
        gamma=adaptation.get("gamma"), eta=adaptation.get("eta"), steps=adaptation.get("adapt_steps", 1),
    )
    assert_matches(reference, p, *run_both(kernel, p)[:2])


def test_adaptation_is_off_in_training_unless_asked():
    p = make_problem(seed=7)
    q, k, _, valid = problem_arrays(p)
    plain = gmm_kernel().train()
    adapting = gmm_kernel(gamma=0.5, eta=1.0).train()
    torch.testing.assert_close(run_both(adapting, p)[0], run_both(plain, p)[0])
    always = gmm_kernel(gamma=0.5, eta=1.0, adapt_in_training=True).train()
    alpha, rho, offset, _ = params(always)
    reference = naive_adaptation(q, k, valid, alpha, rho, offset, gamma=0.5, eta=1.0)
    assert_matches(reference, p, *run_both(always, p)[:2])


@pytest.mark.parametrize("prior", ["learned", "magnitude"])
@pytest.mark.parametrize("training", [False, True])
def test_fused_path_equals_the_weights_path_with_gradients(prior, training):
    p = make_problem(seed=8, length=6)
    kernel = gmm_kernel(prior=prior, prior_offset=prior == "learned").train(training)
    outputs, grads = [], []
    for need_weights in (True, False):
        inputs = [x.clone().requires_grad_(True) for x in (p.q, p.k, p.v)]
        out, result = kernel(*inputs, p.dense, need_weights=need_weights)
        assert (result.weights is None) == (not need_weights)
        upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype)
        kernel.zero_grad()
        (out * upstream).sum().backward()
        outputs.append(out.detach())
        grads.append([x.grad for x in inputs] + [t.grad.clone() for t in kernel.parameters()])
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-10, rtol=1e-8)
    for fused, reference in zip(grads[1], grads[0]):
        torch.testing.assert_close(fused, reference, atol=1e-10, rtol=1e-8)


def test_on_gat_logits_the_gaussian_term_is_added_and_vanishes_as_alpha_goes_to_zero():
    from torch_geometric.utils import softmax as pyg_softmax

    p = make_problem(seed=9)
    h = p.nodes(p.q)
    host = torch.randn(p.edge_b.shape[0], HEADS, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    groups = p.segment
    kernel = gmm_kernel(prior="uniform").eval()
    alpha = kernel.log_alpha.exp()
    hi, hj = h.index_select(0, groups.dst), h.index_select(0, groups.src)
    expected = pyg_softmax(host - alpha / 2 * (hi - hj).square().sum(-1), groups.dst, num_nodes=groups.num_nodes)
    torch.testing.assert_close(kernel.normalize(host, groups, q=h, k=h).weights, expected)

    tiny = build_attention({"name": "gmm", "alpha_init": 1e-12}, num_heads=HEADS, head_dim=DIM).double()
    torch.testing.assert_close(
        tiny.normalize(host, groups, q=h, k=h).weights, pyg_softmax(host, groups.dst, num_nodes=groups.num_nodes)
    )


@pytest.mark.parametrize(
    "config",
    [{"beta": 0.5, "iterations": 2}, {"gamma": 0.5, "eta": 1.0, "prior_offset": True}, {"beta": 0.3, "gamma": 1.0, "prior": "uniform"}],
)
def test_non_default_configs_keep_the_contract(config):
    p = make_problem(seed=10)
    kernel = gmm_kernel(**config).eval()
    dense, segment, out_d, out_s = run_both(kernel, p, with_values=True)
    sums = p.dense.reduce(dense, "sum")
    torch.testing.assert_close(sums, torch.ones_like(sums))
    assert (dense.masked_select(~p.dense.valid.expand_as(dense)) == 0).all()
    torch.testing.assert_close(segment, p.dense_at_edges(dense))
    torch.testing.assert_close(p.real_nodes(out_s), p.real_nodes(p.nodes(out_d)))

    small = make_problem(batch=1, length=4, seed=11)
    inputs = [x.clone().requires_grad_(True) for x in (small.q, small.k, small.v)]
    assert torch.autograd.gradcheck(lambda q, k, v: kernel(q, k, v, small.dense)[0], inputs, eps=1e-6, atol=1e-5, fast_mode=True)


@pytest.mark.parametrize("bad", [{"beta": -1.0}, {"prior": "flat"}, {"alpha_init": 0.0}, {"iterations": -1}, {"gamma": -0.1}])
def test_bad_configs_are_rejected(bad):
    with pytest.raises(ValueError):
        build_attention({"name": "gmm", **bad}, num_heads=HEADS, head_dim=DIM)


def test_default_alpha_is_the_transformer_scale():
    kernel = build_attention("gmm", num_heads=HEADS, head_dim=16)
    torch.testing.assert_close(kernel.log_alpha.exp(), torch.full((HEADS,), 1 / math.sqrt(16)))
