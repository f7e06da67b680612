"""bam-weibull / bam-lognormal: closed-form KLs against numerical integration, samplers against scipy,
the KL aux against per-pair references, evaluation modes, annealing and the contextual prior."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, special, stats

from modules.attention import build_attention
from modules.attention.variants.bam import (
    lognormal_kl,
    lognormal_rsample,
    softmax_and_log,
    weibull_gamma_kl,
    weibull_rsample,
)

from .conftest import make_problem

HEADS, DIM = 2, 4
SCALE = DIM**-0.5
NAMES = ["bam-weibull", "bam-lognormal"]
PRIORS = ["fixed", "contextual"]


def kernel(name, **overrides):
    torch.manual_seed(0)
    return build_attention({"name": name, **overrides}, num_heads=HEADS, head_dim=DIM).double()


def kl_by_quadrature(p, q) -> float:
    """KL(p || q) = integral of p log(p / q) for frozen scipy distributions, over p's effective support."""
    lo, hi = p.ppf(1e-15), p.isf(1e-15)

    def integrand(x):
        return math.exp(p.logpdf(x)) * (p.logpdf(x) - q.logpdf(x))

    value, _ = integrate.quad(integrand, lo, hi, points=[p.median()], limit=500, epsabs=1e-12, epsrel=1e-10)
    return value


@pytest.mark.parametrize(
    "k, lam, alpha, beta",
    [(2.0, 0.5, 1.0, 1.0), (10.0, 0.1, 0.5, 2.0), (1.3, 2.0, 3.0, 0.7), (50.0, 0.02, 0.01, 0.01), (1000.0, 0.3, 1.0, 1.0)],
)
def test_weibull_gamma_kl_matches_quadrature(k, lam, alpha, beta):
    expected = kl_by_quadrature(stats.weibull_min(k, scale=lam), stats.gamma(alpha, scale=1.0 / beta))
    got = weibull_gamma_kl(k, torch.tensor(lam, dtype=torch.float64), alpha, beta).item()
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-8)


@pytest.mark.parametrize(
    "mu, sigma, mu0, sigma0", [(0.0, 1.0, 0.5, 2.0), (-2.0, 0.3, -1.0, 1.0), (1.0, 0.05, 0.0, 0.5), (-4.0, 1.5, 0.0, 1.0)]
)
def test_lognormal_kl_matches_quadrature(mu, sigma, mu0, sigma0):
    expected = kl_by_quadrature(stats.lognorm(sigma, scale=math.exp(mu)), stats.lognorm(sigma0, scale=math.exp(mu0)))
    got = lognormal_kl(torch.tensor(mu, dtype=torch.float64), sigma, mu0, sigma0).item()
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("k", [1.5, 10.0, 1000.0])
def test_weibull_sampler_matches_scipy(k):
    torch.manual_seed(0)
    w, n = 0.3, 200_000
    samples = weibull_rsample(torch.full((n,), w, dtype=torch.float64), k).numpy()
    reference = stats.weibull_min(k, scale=w / math.gamma(1.0 + 1.0 / k))
    assert reference.mean() == pytest.approx(w)
    assert abs(samples.mean() - reference.mean()) < 5 * reference.std() / math.sqrt(n)
    assert samples.var() == pytest.approx(reference.var(), rel=0.03)
    assert stats.kstest(samples, reference.cdf).pvalue > 1e-3


@pytest.mark.parametrize("sigma", [0.1, 1.0])
def test_lognormal_sampler_matches_scipy(sigma):
    torch.manual_seed(0)
    w, n = 0.3, 200_000
    samples = lognormal_rsample(torch.full((n,), w, dtype=torch.float64), sigma).numpy()
    reference = stats.lognorm(sigma, scale=w * math.exp(-0.5 * sigma**2))
    assert reference.mean() == pytest.approx(w)
    assert abs(samples.mean() - reference.mean()) < 5 * reference.std() / math.sqrt(n)
    assert samples.var() == pytest.approx(reference.var(), rel=0.1)  # heavy tail at sigma = 1
    assert stats.kstest(samples, reference.cdf).pvalue > 1e-3


def dense_softmax_reference(p):
    """scipy softmax over each query's valid keys, 0 on masked keys: [B, H, L, L]."""
    logits = (p.q @ p.k.transpose(-1, -2)).numpy() * SCALE
    valid = np.broadcast_to(p.dense.valid.numpy(), logits.shape)
    return np.where(valid, special.softmax(np.where(valid, logits, -np.inf), axis=-1), 0.0), valid


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("prior", PRIORS)
def test_eval_is_deterministic_and_equals_the_mean_weights(name, prior):
    p = make_problem()
    ker = kernel(name, prior=prior).eval()
    reference, _ = dense_softmax_reference(p)
    first, _ = ker(p.q, p.k, p.v, p.dense, scale=SCALE)
    second, result = ker(p.q, p.k, p.v, p.dense, scale=SCALE)
    assert torch.equal(first, second)
    np.testing.assert_allclose(result.weights.numpy(), reference, atol=1e-12)
    seg = ker.normalize(ker.score(p.nodes(p.q), p.nodes(p.k), p.segment, scale=SCALE), p.segment, q=p.nodes(p.q), k=p.nodes(p.k))
    np.testing.assert_allclose(seg.weights.numpy(), p.dense_at_edges(torch.from_numpy(reference)).numpy(), atol=1e-12)


@pytest.mark.parametrize("name, overrides", [("bam-weibull", {"k": 20.0}), ("bam-lognormal", {"sigma": 0.2})])
def test_mc_samples_at_eval_average_close_to_the_mean(name, overrides):
    p = make_problem()
    reference, valid = dense_softmax_reference(p)
    ker = kernel(name, mc_samples=400, **overrides).eval()
    logits = ker.score(p.q, p.k, p.dense, scale=SCALE)
    result = ker.normalize(logits, p.dense, q=p.q, k=p.k)
    averaged = result.weights.numpy()
    np.testing.assert_allclose(averaged.sum(-1)[valid[..., 0]], 1.0, atol=1e-12)
    assert (averaged[~valid] == 0).all()
    # random, yet the average of 400 draws sits near the mean weights (normalisation bias is O(CV^2))
    assert not np.allclose(averaged, reference, atol=1e-6)
    np.testing.assert_allclose(averaged, reference, atol=0.02)
    single = ker.normalize(logits, p.dense, q=p.q, k=p.k).diagnostics["sample_tv"]
    assert 0 < single.item() < 0.2


@pytest.mark.parametrize("name", NAMES)
def test_training_samples_differ_and_report_their_spread(name):
    p = make_problem()
    ker = kernel(name).train()
    logits = ker.score(p.q, p.k, p.dense, scale=SCALE)
    a = ker.normalize(logits, p.dense, q=p.q, k=p.k)
    b = ker.normalize(logits, p.dense, q=p.q, k=p.k)
    assert not torch.equal(a.weights, b.weights)
    assert a.diagnostics["sample_tv"].item() > 0 and not a.diagnostics["sample_tv"].requires_grad


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("prior", PRIORS)
def test_kl_aux_is_the_mean_of_per_pair_closed_forms(name, prior):
    p = make_problem()
    ker = kernel(name, prior=prior).eval()
    result = ker.normalize(ker.score(p.q, p.k, p.dense, scale=SCALE), p.dense, q=p.q, k=p.k)
    w, valid = dense_softmax_reference(p)
    valid = valid & p.key_valid.numpy()[:, None, :, None]  # the pairs of real queries: padded rows do not count
    w = torch.from_numpy(w[valid])
    c = ker.config
    if prior == "contextual":
        with torch.no_grad():
            prior_logits = ker.key_prior(p.k.movedim(1, -2)).movedim(-1, 1).numpy()[:, :, None, :]  # [B, H, 1, L]
        prior_logits = np.broadcast_to(prior_logits, valid.shape)
        pi = special.softmax(np.where(valid, prior_logits, -np.inf), axis=-1)
        pi = torch.from_numpy(pi[valid])
    if name == "bam-weibull":
        alpha = c.beta * pi if prior == "contextual" else c.alpha
        per_pair = weibull_gamma_kl(c.k, w / math.gamma(1 + 1 / c.k), alpha, c.beta)
    else:
        mu0 = pi.log() if prior == "contextual" else torch.tensor(c.prior_mu, dtype=torch.float64)
        posterior = torch.distributions.LogNormal(w.log() - c.sigma**2 / 2, c.sigma)
        per_pair = torch.distributions.kl_divergence(posterior, torch.distributions.LogNormal(mu0, c.prior_sigma))
    torch.testing.assert_close(result.aux_losses["kl"], per_pair.mean(), rtol=1e-9, atol=1e-9)
    # the graph layout gives the same average over the same pairs
    seg = ker.normalize(ker.score(p.nodes(p.q), p.nodes(p.k), p.segment, scale=SCALE), p.segment, q=p.nodes(p.q), k=p.nodes(p.k))
    torch.testing.assert_close(seg.aux_losses["kl"], per_pair.mean(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", NAMES)
def test_kl_annealing_is_a_monotone_sigmoid_from_zero_to_kl_weight(name):
    config = kernel(name, kl_weight=0.3, anneal_rate=0.5, anneal_midpoint=20).config
    weights = [config.loss_weights(step)["kl"] for step in range(0, 200)]
    assert all(b >= a for a, b in zip(weights, weights[1:]))
    assert weights[0] < 0.01 * 0.3
    assert weights[20] == pytest.approx(0.15)
    assert weights[-1] == pytest.approx(0.3, rel=1e-6)
    assert config.loss_weights(10**9)["kl"] == pytest.approx(0.3)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("layout", ["dense", "segment"])
def test_contextual_prior_gets_gradients(name, layout):
    p = make_problem()
    ker = kernel(name, prior="contextual").train()
    q, k, groups = (p.q, p.k, p.dense) if layout == "dense" else (p.nodes(p.q), p.nodes(p.k), p.segment)
    result = ker.normalize(ker.score(q, k, groups, scale=SCALE), groups, q=q, k=k)
    result.aux_losses["kl"].backward()
    params = dict(ker.key_prior.named_parameters())
    assert set(params) == {"w1", "b1", "w2", "b2"}
    for pname, param in params.items():
        assert param.grad is not None and torch.isfinite(param.grad).all(), pname
        assert param.grad.abs().sum() > 0, pname
    assert not list(kernel(name, prior="fixed").parameters())


@pytest.mark.parametrize("name", NAMES)
def test_fixed_prior_also_reduces_to_softmax_in_training(name):
    from modules.attention import attention_entry

    p = make_problem()
    ker = kernel(name, prior="fixed", **attention_entry(name).cls.softmax_limit).train()
    reference, _ = dense_softmax_reference(p)
    weights = ker.normalize(ker.score(p.q, p.k, p.dense, scale=SCALE), p.dense, q=p.q, k=p.k).weights
    np.testing.assert_allclose(weights.detach().numpy(), reference, atol=1e-6)


def test_segment_softmax_survives_logits_spread_over_hundreds_of_nats():
    p = make_problem()
    torch.manual_seed(0)
    logits = torch.randn(p.segment.dst.numel(), HEADS, dtype=torch.float64) * 3
    logits[p.segment.dst < 5] -= 1000.0  # whole groups far below the global max: the global shift underflows
    probs, log_probs = softmax_and_log(logits, p.segment)
    torch.testing.assert_close(probs, p.segment.softmax(logits))
    torch.testing.assert_close(log_probs, p.segment.softmax(logits).log())


@pytest.mark.parametrize("bad", [{"prior": "learned"}, {"mc_samples": 0}, {"k": -1.0}])
def test_bad_configs_are_rejected(bad):
    name = "bam-weibull"
    with pytest.raises(ValueError):
        build_attention({"name": name, **bad}, num_heads=HEADS, head_dim=DIM)
