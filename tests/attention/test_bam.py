"""bam-weibull / bam-lognormal: closed-form KLs against numerical integration, samplers against scipy,
the KL aux against per-pair references, evaluation modes, the authors' per-host settings and KL schedules,
the contextual prior, and what the softmax limit does (weights) and does not (KL) reduce."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, special, stats

from modules.attention import build_attention
from modules.attention.kernel import AttentionSite
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
    config = kernel(name, kl_schedule="sigmoid", kl_weight=0.3, anneal_rate=0.5, anneal_midpoint=20).config
    weights = [config.loss_weights(step)["kl"] for step in range(0, 200)]
    assert all(b >= a for a, b in zip(weights, weights[1:]))
    assert weights[0] < 0.01 * 0.3
    assert weights[20] == pytest.approx(0.15)
    assert weights[-1] == pytest.approx(0.3, rel=1e-6)
    assert config.loss_weights(10**9)["kl"] == pytest.approx(0.3)


GAT_HOST, GLUE_HOST = AttentionSite("graph"), AttentionSite("text", "self", sequence=True)


def test_weibull_takes_the_authors_gat_settings_on_graphs_and_their_glue_script_on_text():
    gat = build_attention("bam-weibull", num_heads=HEADS, head_dim=DIM, site=GAT_HOST).config
    glue = build_attention("bam-weibull", num_heads=HEADS, head_dim=DIM, site=GLUE_HOST).config
    # GAT/execute_cora.py defaults and GAT/utils/layers.py
    assert (gat.k, gat.alpha, gat.beta, gat.prior, gat.kl_schedule) == (1000.0, 1.0, 1.0, "contextual", "sigmoid")
    # run_glue_albert_mrpc.sh: --k_weibull 10 --att_prior_type constant --alpha_gamma 1e-4 --beta_gamma 1e-4 --att_kl 1
    assert (glue.k, glue.alpha, glue.beta, glue.prior, glue.kl_weight) == (10.0, 1e-4, 1e-4, "fixed", 1.0)
    assert glue.kl_schedule == "constant"
    # vision-language hosts and hosts that do not say get the authors' transformer (GLUE) recipe
    for site in (AttentionSite("vision-language", "cross"), AttentionSite()):
        assert build_attention("bam-weibull", num_heads=HEADS, head_dim=DIM, site=site).config == glue


def test_lognormal_takes_the_sigmas_of_each_script():
    gat = build_attention("bam-lognormal", num_heads=HEADS, head_dim=DIM, site=GAT_HOST).config
    glue = build_attention("bam-lognormal", num_heads=HEADS, head_dim=DIM, site=GLUE_HOST).config
    assert (gat.sigma, gat.prior_sigma, gat.prior_mu) == (1.0, 1.0, 0.0)
    # --sigma_normal_posterior 1e-4 --sigma_normal_prior 1e2
    assert (glue.sigma, glue.prior_sigma, glue.prior_mu) == (1e-4, 1e2, 0.0)


def test_explicit_values_beat_the_host_defaults():
    config = build_attention({"name": "bam-weibull", "k": 50.0, "prior": "contextual"}, num_heads=HEADS, head_dim=DIM, site=GLUE_HOST).config
    assert (config.k, config.prior, config.alpha) == (50.0, "contextual", 1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_kl_schedule_counts_epochs_as_the_gat_code_does(name):
    ker = build_attention(name, num_heads=HEADS, head_dim=DIM, site=GAT_HOST)
    assert ker.config.schedule_unit == "epoch"
    # execute_cora.py: sigmoid(epoch_num * kl_anneal_rate) * att_kl, epoch_num from 0
    assert ker.loss_weights(step=5000, epoch=0)["kl"] == pytest.approx(0.5)
    assert ker.loss_weights(step=0, epoch=3)["kl"] == pytest.approx(1 / (1 + math.exp(-3)))
    # many optimiser steps within the first epoch leave the weight where it is
    assert ker.loss_weights(step=10, epoch=0) == ker.loss_weights(step=10_000, epoch=0)


@pytest.mark.parametrize("name", NAMES)
def test_glue_kl_weight_is_constant_from_the_first_step(name):
    ker = build_attention(name, num_heads=HEADS, head_dim=DIM, site=GLUE_HOST)
    assert [ker.loss_weights(step=s, epoch=e)["kl"] for s, e in [(0, 0), (10, 0), (10_000, 5)]] == [1.0, 1.0, 1.0]


def logit_gradient_of_kl(ker, p):
    logits = ker.score(p.q, p.k, p.dense, scale=SCALE).detach().requires_grad_()
    kl = ker.normalize(logits, p.dense, q=p.q, k=p.k).aux_losses["kl"]
    (grad,) = torch.autograd.grad(kl, logits)
    return kl.detach(), grad


def test_glue_prior_pulls_the_weights_1e4_times_less_than_the_gat_prior():
    """Finding 3: the GAT prior applied on text pulled attention to the prior hard enough to flatten it."""
    p = make_problem()
    gat = build_attention({"name": "bam-weibull", "prior": "fixed"}, num_heads=HEADS, head_dim=DIM, site=GAT_HOST).double()
    glue = build_attention("bam-weibull", num_heads=HEADS, head_dim=DIM, site=GLUE_HOST).double()
    _, gat_grad = logit_gradient_of_kl(gat.eval(), p)
    _, glue_grad = logit_gradient_of_kl(glue.eval(), p)
    # per pair dKL/dlog w = -alpha + beta * w: exactly proportional to alpha = beta
    torch.testing.assert_close(glue_grad, 1e-4 * gat_grad, rtol=1e-9, atol=1e-15)
    assert gat_grad.abs().max() > 1e-3


@pytest.mark.parametrize(
    "name, distribution_limit, far, farther",
    [("bam-weibull", "k", 1e4, 1e8), ("bam-lognormal", "sigma", 1e-4, 1e-8)],
)
def test_softmax_limit_matches_the_weights_but_the_kl_diverges_unless_its_weight_is_zero(
    name, distribution_limit, far, farther
):
    """At the limit the forward pass is softmax attention's; the KL is not a vanishing term: its value grows
    like log k (resp. log(sigma0 / sigma)) and its gradient tends to a finite, nonzero pull towards the
    prior, so training is softmax training only with kl_weight = 0, which softmax_limit therefore includes."""
    from modules.attention import attention_entry

    p = make_problem()
    limit = attention_entry(name).cls.softmax_limit
    assert limit == {distribution_limit: farther, "kl_weight": 0.0}
    reference, _ = dense_softmax_reference(p)
    kls, grads = [], []
    for value in (far, farther):
        spec = {"name": name, "prior": "fixed", distribution_limit: value}
        ker = build_attention(spec, num_heads=HEADS, head_dim=DIM, site=GAT_HOST).double().train()
        weights = ker.normalize(ker.score(p.q, p.k, p.dense, scale=SCALE), p.dense, q=p.q, k=p.k).weights
        kl, grad = logit_gradient_of_kl(ker, p)
        kls.append(kl.item())
        grads.append(grad)
    np.testing.assert_allclose(weights.detach().numpy(), reference, atol=1e-6)
    # the KL grows by log(1e4) per pair when the distribution parameter moves 1e4 further towards the limit
    assert kls[1] - kls[0] == pytest.approx(math.log(1e4), rel=1e-3)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-3, atol=1e-9)
    assert grads[1].abs().max() > 1e-3
    at_limit = build_attention({"name": name, **limit}, num_heads=HEADS, head_dim=DIM, site=GAT_HOST)
    assert at_limit.loss_weights(step=10**6, epoch=10**6)["kl"] == 0.0


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


def test_segment_softmax_survives_logits_spread_over_hundreds_of_nats():
    p = make_problem()
    torch.manual_seed(0)
    logits = torch.randn(p.segment.dst.numel(), HEADS, dtype=torch.float64) * 3
    logits[p.segment.dst < 5] -= 1000.0  # whole groups far below the global max: the global shift underflows
    probs, log_probs = softmax_and_log(logits, p.segment)
    torch.testing.assert_close(probs, p.segment.softmax(logits))
    torch.testing.assert_close(log_probs, p.segment.softmax(logits).log())


@pytest.mark.parametrize("bad", [{"prior": "learned"}, {"mc_samples": 0}, {"k": -1.0}, {"kl_schedule": "linear"}])
def test_bad_configs_are_rejected(bad):
    name = "bam-weibull"
    with pytest.raises(ValueError):
        build_attention({"name": name, **bad}, num_heads=HEADS, head_dim=DIM)


def test_describe_defaults_shows_the_gat_and_glue_values_per_host():
    from modules.attention import list_attentions
    from modules.attention.registry import REPRESENTATIVE_SITES, describe_defaults

    described = describe_defaults("bam-weibull")
    assert list(described) == list(REPRESENTATIVE_SITES)
    graph, text = described["graph self"], described["text self"]
    assert (graph["k"], graph["alpha"], graph["beta"], graph["prior"], graph["kl_schedule"]) == (1000.0, 1.0, 1.0, "contextual", "sigmoid")
    assert (text["k"], text["alpha"], text["beta"], text["prior"], text["kl_schedule"]) == (10.0, 1e-4, 1e-4, "fixed", "constant")
    for label in ("vision-language self-sequence", "vision-language self-grid", "vision-language cross", "vision-language pool"):
        assert described[label] == text, label
    # what the user sets wins on every host
    assert {d["k"] for d in describe_defaults({"name": "bam-weibull", "k": 77.0}).values()} == {77.0}
    # and a kernel built at a site runs with exactly the described config
    kern = build_attention("bam-weibull", num_heads=HEADS, head_dim=DIM, site=REPRESENTATIVE_SITES["graph self"])
    assert kern.config.to_dict() == graph
    for name in list_attentions():
        assert set(describe_defaults(name)) == set(REPRESENTATIVE_SITES), name


@pytest.mark.parametrize("name", NAMES)
def test_graph_prior_is_one_softmax_over_all_nodes_shared_by_every_query(name):
    """The authors' GAT prior (GAT/utils/layers.py): pi = softmax over all N nodes of F(k_j), one weight per
    node, the same for every query that has j as a key and not renormalised per neighbourhood; the KL is the
    mean over the edges of the per-pair closed form with that prior."""
    p = make_problem()
    torch.manual_seed(0)
    ker = build_attention({"name": name}, num_heads=HEADS, head_dim=DIM, site=GAT_HOST).double().eval()
    assert (ker.config.prior, ker.config.prior_scope) == ("contextual", "nodes")
    q, k, groups = p.nodes(p.q), p.nodes(p.k), p.segment
    pi, log_pi = ker.prior_over_keys(k, groups)  # per edge [E, H]
    torch.testing.assert_close(log_pi.exp(), pi)
    nodes = k.shape[0]
    per_node = torch.zeros(nodes, HEADS, dtype=pi.dtype).index_reduce_(0, groups.src, pi, "amax", include_self=False)
    # shared by queries: every edge out of key j carries the same value
    torch.testing.assert_close(pi, per_node.index_select(0, groups.src))
    keys = torch.zeros(nodes, dtype=torch.bool).index_fill_(0, groups.src, True)
    torch.testing.assert_close(per_node[keys].sum(0), torch.ones(HEADS, dtype=pi.dtype))  # sums to 1 over the nodes
    per_query = torch.zeros(nodes, HEADS, dtype=pi.dtype).index_add_(0, groups.dst, pi)
    assert (per_query[groups.dst.unique()] < 0.99).all()  # not renormalised per neighbourhood
    with torch.no_grad():
        reference = torch.softmax(ker.key_prior(k)[keys], dim=0)  # independent: one softmax over the key nodes
    torch.testing.assert_close(per_node[keys], reference)

    result = ker.normalize(ker.score(q, k, groups, scale=SCALE), groups, q=q, k=k)
    w = result.weights
    c = ker.config
    if name == "bam-weibull":
        per_pair = weibull_gamma_kl(c.k, w / math.gamma(1 + 1 / c.k), c.beta * pi, c.beta)
    else:
        posterior = torch.distributions.LogNormal(w.log() - c.sigma**2 / 2, c.sigma)
        per_pair = torch.distributions.kl_divergence(posterior, torch.distributions.LogNormal(log_pi, c.prior_sigma))
    torch.testing.assert_close(result.aux_losses["kl"], per_pair.mean(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", NAMES)
def test_neighbourhood_prior_stays_an_option_and_nodes_is_refused_off_graphs(name):
    p = make_problem()
    torch.manual_seed(0)
    ker = build_attention({"name": name, "prior_scope": "neighbourhood"}, num_heads=HEADS, head_dim=DIM, site=GAT_HOST).double()
    pi, _ = ker.prior_over_keys(p.nodes(p.k), p.segment)
    per_query = torch.zeros(p.nodes(p.k).shape[0], HEADS, dtype=pi.dtype).index_add_(0, p.segment.dst, pi)
    torch.testing.assert_close(per_query[p.segment.dst.unique()], torch.ones_like(per_query[p.segment.dst.unique()]))
    with pytest.raises(ValueError, match="prior_scope='neighbourhood'"):
        build_attention({"name": name, "prior": "contextual", "prior_scope": "nodes"}, num_heads=HEADS, head_dim=DIM, site=GLUE_HOST)
    with pytest.raises(ValueError, match="prior_scope must be one of"):
        build_attention({"name": name, "prior_scope": "graph"}, num_heads=HEADS, head_dim=DIM, site=GAT_HOST)
