"""Bayesian Attention Modules (Fan, Zhang, Chen & Zhou, NeurIPS 2020): stochastic attention weights.

Paper: ../shared/papers/bayesian-attention-modules-course.txt, chapter 3 (course notes on Fan et al. 2020).
The notes leave the parameterisation open; we follow the authors' GAT code (github.com/zhougroup/BAM,
GAT/utils/layers.py), which makes the *normalised* softmax weights the mean of the random weights.

The deterministic weights w = softmax(logits) within each group are the mean of unnormalised positive
random weights S; training draws S by reparameterisation and normalises it, W = S / sum_group S (3.2.3):
- `bam-weibull`:   S ~ Weibull(k, lambda), lambda = w / Gamma(1 + 1/k) so E[S] = w (Definition 3.2);
                   S = lambda * E^(1/k) with E ~ Exp(1) (inverse CDF).
- `bam-lognormal`: S ~ Lognormal(mu, sigma^2), mu = log w - sigma^2/2 so E[S] = w (Definition 3.1);
                   S = exp(mu + sigma * eps) with eps ~ N(0, 1).
Aux loss "kl": KL(q(S) || p(S)) per (query, key) pair in closed form, averaged over the valid pairs:
Weibull || Gamma(alpha, beta) (Property 3.2), Lognormal || Lognormal(mu0, sigma0^2) (Property 3.1). Its
weight is annealed by a sigmoid of the training step (Algorithm 1, lambda = sigmoid(t * rho), shifted here
so that it starts near 0).
Priors (`prior`): "fixed" = constant alpha, beta (resp. mu0 = prior_mu, sigma0 = prior_sigma); "contextual"
(the paper's BAM-WC / BAM-LC, our default as the paper's best variant) = a per-head MLP F of each key gives a
prior distribution over the keys pi = softmax_group(F(k_j)); Weibull prior Gamma(beta * pi_j, beta) (prior
mean pi_j, as in the authors' code), Lognormal prior mu0 = log pi_j.
At evaluation S is replaced by its mean (W = w) unless `mc_samples` > 1, which averages that many sampled W.
k -> infinity or sigma -> 0 recovers softmax attention (Remark in 3.2.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..groups import Groups
from ..kernel import AttentionConfig, AttentionKernel, AttentionResult, HeadShape, standard_diagnostics
from ..registry import register_attention

EULER_GAMMA = 0.5772156649015329
PRIORS = ("fixed", "contextual")


# ---- closed forms and samplers (public: the tests check them against scipy) -------------------------
def weibull_gamma_kl_sum(k: float, beta: float, n, alpha, alpha_log_lam, lam, lgamma_alpha) -> Tensor:
    """Sum over n pairs of KL(Weibull(k, lambda_i) || Gamma(alpha_i, rate beta)) (Property 3.2), from the
    sums of the terms it is linear in: alpha, alpha * log lambda, lambda and log Gamma(alpha)."""
    return (
        (EULER_GAMMA / k - math.log(beta)) * alpha
        - alpha_log_lam
        + beta * math.exp(math.lgamma(1.0 + 1.0 / k)) * lam
        + lgamma_alpha
        + n * (math.log(k) - EULER_GAMMA - 1.0)
    )


def weibull_gamma_kl(k: float, lam: Tensor, alpha: Tensor | float, beta: float) -> Tensor:
    """KL(Weibull(k, lambda) || Gamma(alpha, rate beta)) for each element, Property 3.2."""
    alpha = torch.as_tensor(alpha, dtype=lam.dtype, device=lam.device)
    return weibull_gamma_kl_sum(k, beta, 1, alpha, alpha * lam.log(), lam, torch.lgamma(alpha))


def lognormal_kl_sum(sigma: float, sigma0: float, n, squared_gap) -> Tensor:
    """Sum over n pairs of KL(Lognormal(mu_i, sigma^2) || Lognormal(mu0_i, sigma0^2)) (Property 3.1), from
    the sum of (mu_i - mu0_i)^2."""
    return n * (math.log(sigma0 / sigma) + sigma**2 / (2.0 * sigma0**2) - 0.5) + squared_gap / (2.0 * sigma0**2)


def lognormal_kl(mu: Tensor, sigma: float, mu0: Tensor | float, sigma0: float) -> Tensor:
    """KL(Lognormal(mu, sigma^2) || Lognormal(mu0, sigma0^2)) for each element, Property 3.1."""
    return lognormal_kl_sum(sigma, sigma0, 1, (mu - mu0) ** 2)


def weibull_rsample(mean: Tensor, k: float, uniform: Tensor | None = None) -> Tensor:
    """S ~ Weibull(k, lambda = mean / Gamma(1 + 1/k)), so E[S] = mean; differentiable in `mean`.
    S = lambda * E^(1/k), E = -log U ~ Exp(1), from `uniform` U (drawn here if None)."""
    # rand + log rather than exponential_: several times faster on CPU (measured); the clamp keeps log finite.
    uniform = torch.rand_like(mean) if uniform is None else uniform
    exp1 = uniform.clamp_min(torch.finfo(mean.dtype).tiny).log_().neg_()
    return mean * exp1.pow_(1.0 / k).mul_(math.exp(-math.lgamma(1.0 + 1.0 / k)))


def lognormal_rsample(mean: Tensor, sigma: float, normal: Tensor | None = None) -> Tensor:
    """S ~ Lognormal(log mean - sigma^2/2, sigma^2), so E[S] = mean; differentiable in `mean`; from standard
    `normal` noise (drawn here if None)."""
    if normal is None:
        return mean * torch.empty_like(mean).normal_(-0.5 * sigma**2, sigma).exp_()
    return mean * (normal * sigma - 0.5 * sigma**2).exp_()


def softmax_and_log(logits: Tensor, groups: Groups) -> tuple[Tensor, Tensor]:
    """Softmax within each group and its logarithm, both 0 on masked keys (`Groups.softmax_and_log`)."""
    return groups.softmax_and_log(logits)


def _sigmoid(x: float) -> float:
    # tanh form: math.exp overflows for the large |x| of late or early steps.
    return 0.5 * (1.0 + math.tanh(0.5 * x))


# ---- configs ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BAMConfig(AttentionConfig):
    prior: str = "contextual"
    """"fixed" (constant prior parameters) or "contextual" (prior over keys from an MLP of the keys)."""
    prior_hidden: int = 10
    """Hidden width of the contextual prior's per-head MLP (authors' code: att_se_hid_size = 10)."""
    kl_weight: float = 1.0
    """Final weight of the KL term (authors' run scripts: att_kl = 1)."""
    anneal_rate: float = 1.0
    """Slope of the sigmoid KL schedule per step (authors' code: kl_anneal_rate = 1 per epoch)."""
    anneal_midpoint: float = 5.0
    """Step at which the KL weight is half of kl_weight (the authors' code used 0, i.e. started at half)."""
    mc_samples: int = 1
    """Weight sets averaged at evaluation; 1 = the mean weights (deterministic)."""

    def __post_init__(self):
        if self.prior not in PRIORS:
            raise ValueError(f"prior must be one of {PRIORS}, got {self.prior!r}")
        if self.mc_samples < 1:
            raise ValueError(f"mc_samples must be >= 1, got {self.mc_samples}")
        if self.prior_hidden < 1:
            raise ValueError(f"prior_hidden must be >= 1, got {self.prior_hidden}")
        if self.kl_weight < 0:
            raise ValueError(f"kl_weight must be >= 0, got {self.kl_weight}")

    def loss_weights(self, step: int) -> dict[str, float]:
        return {"kl": self.kl_weight * _sigmoid(self.anneal_rate * (step - self.anneal_midpoint))}

    @classmethod
    def suggest(cls, trial: Any) -> dict[str, Any]:
        return {
            "prior": trial.suggest_categorical("prior", list(PRIORS)),
            "kl_weight": trial.suggest_float("kl_weight", 1e-3, 10.0, log=True),
            "anneal_rate": trial.suggest_float("anneal_rate", 1e-2, 1.0, log=True),
        }


@dataclass(frozen=True)
class WeibullConfig(BAMConfig):
    k: float = 1000.0
    """Weibull shape; the coefficient of variation of S is about 1.28 / k (authors' GAT default 1000)."""
    alpha: float = 1.0
    """Gamma prior shape of the fixed prior (the contextual prior uses beta * pi_j instead)."""
    beta: float = 1.0
    """Gamma prior rate (authors' GAT defaults alpha = beta = 1)."""

    def __post_init__(self):
        super().__post_init__()
        if not (self.k > 0 and self.alpha > 0 and self.beta > 0):
            raise ValueError(f"k, alpha and beta must be > 0, got {self.k}, {self.alpha}, {self.beta}")

    @classmethod
    def suggest(cls, trial: Any) -> dict[str, Any]:
        return {
            **super().suggest(trial),
            "k": trial.suggest_float("k", 10.0, 1e4, log=True),
            "beta": trial.suggest_float("beta", 1e-4, 10.0, log=True),
        }


@dataclass(frozen=True)
class LognormalConfig(BAMConfig):
    sigma: float = 1.0
    """Posterior log-scale sigma; the coefficient of variation of S is sqrt(exp(sigma^2) - 1)
    (authors' GAT default sigma_normal_posterior = 1)."""
    prior_mu: float = 0.0
    """mu0 of the fixed prior (authors' code: 0); the contextual prior uses log pi_j."""
    prior_sigma: float = 1.0
    """sigma0 of the prior (authors' GAT default sigma_normal_prior = 1)."""

    def __post_init__(self):
        super().__post_init__()
        if not (self.sigma > 0 and self.prior_sigma > 0):
            raise ValueError(f"sigma and prior_sigma must be > 0, got {self.sigma}, {self.prior_sigma}")

    @classmethod
    def suggest(cls, trial: Any) -> dict[str, Any]:
        return {
            **super().suggest(trial),
            "sigma": trial.suggest_float("sigma", 1e-2, 2.0, log=True),
            "prior_sigma": trial.suggest_float("prior_sigma", 0.1, 100.0, log=True),
        }


# ---- the kernels -----------------------------------------------------------------------------------
class KeyPrior(nn.Module):
    """Per-head two-layer MLP: one prior logit F(k_j) per key (authors' code: ReLU, He init, zero biases)."""

    def __init__(self, num_heads: int, head_dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(num_heads, head_dim, hidden) * math.sqrt(2.0 / head_dim))
        self.b1 = nn.Parameter(torch.zeros(num_heads * hidden))
        self.w2 = nn.Parameter(torch.randn(num_heads, hidden, 1) * math.sqrt(2.0 / hidden))
        self.b2 = nn.Parameter(torch.zeros(num_heads))

    def forward(self, k: Tensor) -> Tensor:
        """k [..., H, d] -> [..., H]."""
        # One matmul with block-diagonal weights: about twice as fast as a per-head einsum here (measured).
        hidden = (k.flatten(-2) @ torch.block_diag(*self.w1) + self.b1).relu()
        return hidden @ torch.block_diag(*self.w2) + self.b2


class BayesianAttention(AttentionKernel):
    """Shared machinery of the BAM kernels; subclasses give the distribution (sampler and KL)."""

    Config: ClassVar[type[AttentionConfig]] = BAMConfig
    version: ClassVar[str] = "2"
    """2: the KL and the sampling diagnostic average over the pairs of valid queries only (1 counted padded
    query rows, so a batch's padding moved the KL)."""
    stochastic: ClassVar[bool] = True

    def __init__(self, config: BAMConfig, shape: HeadShape):
        super().__init__(config, shape)
        self.key_prior = (
            KeyPrior(shape.num_heads, shape.head_dim, config.prior_hidden) if config.prior == "contextual" else None
        )

    # distribution-specific
    def rsample(self, mean: Tensor) -> Tensor:
        """Unnormalised weights S with E[S] = mean (noise from `draw_noise`)."""
        raise NotImplementedError

    def mean_kl(self, mean: Tensor, log_mean: Tensor, prior: tuple[Tensor, Tensor] | None, groups: Groups) -> Tensor:
        """KL(q(S) || p(S)) averaged over valid pairs; `prior` = (pi, log pi) if contextual, None if fixed."""
        raise NotImplementedError

    def prior_over_keys(self, k: Tensor, groups: Groups) -> tuple[Tensor, Tensor]:
        """pi_j = softmax over the group of F(k_j), and log pi_j, in (broadcastable) logits layout."""
        return groups.softmax_and_log(groups.per_key(groups.map_keys(self.key_prior, k)))

    def normalize(self, logits: Tensor, groups: Groups, *, q: Tensor, k: Tensor) -> AttentionResult:
        mean, log_mean = groups.softmax_and_log(logits)
        draws = 1 if self.training else (self.config.mc_samples if self.config.mc_samples > 1 else 0)
        diagnostics: dict[str, Tensor] = {}
        if draws:
            weights, spread = None, 0.0
            for _ in range(draws):
                sample = groups.normalize(self.rsample(mean), zero_on_masked=True)
                weights = sample if weights is None else weights + sample
                with torch.no_grad():
                    spread = spread + groups.sum_over_pairs((sample - mean).abs(), mean)
            weights = weights / draws if draws > 1 else weights
            with torch.no_grad():
                # Mean total-variation distance of a sampled weight set from the mean weights (how stochastic);
                # the mean weights sum to 1 in every non-empty group, so their total counts the groups.
                groups_counted = groups.sum_over_pairs(mean, mean).clamp_min(1)
                diagnostics["sample_tv"] = (0.5 * spread / (draws * groups_counted)).detach()
        else:
            weights = mean
        diagnostics.update(standard_diagnostics(weights, groups, self))
        prior = self.prior_over_keys(k, groups) if self.key_prior is not None else None
        return AttentionResult(weights, {"kl": self.mean_kl(mean, log_mean, prior, groups)}, diagnostics)


@register_attention("bam-weibull")
class WeibullAttention(BayesianAttention):
    """BAM with Weibull attention weights and a Gamma prior (fixed or contextual); Fan et al. 2020."""

    Config = WeibullConfig
    softmax_limit = {"k": 1e8}
    softmax_limit_atol = 1e-6

    def rsample(self, mean: Tensor) -> Tensor:
        return weibull_rsample(mean, self.config.k, self.draw_noise(mean, "uniform"))

    def mean_kl(self, mean, log_mean, prior, groups):
        c = self.config
        pairs = groups.count_pairs(mean)
        log_gamma_k = math.lgamma(1.0 + 1.0 / c.k)
        # lambda = w / Gamma(1 + 1/k); sums over the valid pairs of valid queries.
        sum_lam = groups.sum_over_pairs(mean, mean) * math.exp(-log_gamma_k)
        sum_log_lam = groups.sum_over_pairs(log_mean, mean) - log_gamma_k * pairs
        if prior is None:
            total = weibull_gamma_kl_sum(
                c.k, c.beta, pairs, c.alpha * pairs, c.alpha * sum_log_lam, sum_lam, math.lgamma(c.alpha) * pairs
            )
            return total / pairs
        pi, _ = prior
        # Prior mean alpha / beta = pi_j (authors' code); the clamp keeps lgamma finite where pi underflows.
        alpha = (c.beta * pi).clamp_min(torch.finfo(pi.dtype).eps)
        sum_alpha = groups.sum_over_pairs(alpha, mean)
        sum_alpha_log_lam = groups.sum_over_pairs(alpha * log_mean, mean) - log_gamma_k * sum_alpha
        total = weibull_gamma_kl_sum(
            c.k, c.beta, pairs, sum_alpha, sum_alpha_log_lam, sum_lam, groups.sum_over_pairs(torch.lgamma(alpha), mean)
        )
        return total / pairs


@register_attention("bam-lognormal")
class LognormalAttention(BayesianAttention):
    """BAM with Lognormal attention weights and a Lognormal prior (fixed or contextual); Fan et al. 2020."""

    Config = LognormalConfig
    softmax_limit = {"sigma": 1e-8}
    softmax_limit_atol = 1e-6

    def rsample(self, mean: Tensor) -> Tensor:
        return lognormal_rsample(mean, self.config.sigma, self.draw_noise(mean, "normal"))

    def mean_kl(self, mean, log_mean, prior, groups):
        c = self.config
        pairs = groups.count_pairs(mean)
        # Sum over valid pairs of (mu - mu0)^2, mu = log w - sigma^2/2, expanded into sums so that the prior
        # (per key on dense groups) is never broadcast to all pairs; log_mean is 0 on masked keys.
        shift = 0.5 * c.sigma**2
        sum_sq_log = groups.sum_over_pairs(log_mean.square(), mean)
        sum_log = groups.sum_over_pairs(log_mean, mean)
        if prior is None:
            mu0 = c.prior_mu
            gap = sum_sq_log - 2.0 * (shift + mu0) * sum_log + pairs * (shift + mu0) ** 2
        else:
            log_pi = prior[1]
            gap = (
                sum_sq_log
                - 2.0 * shift * sum_log
                - 2.0 * groups.sum_over_pairs(log_mean * log_pi, mean)
                + groups.sum_over_pairs((log_pi + shift).square(), mean)
            )
        return lognormal_kl_sum(c.sigma, c.prior_sigma, pairs, gap.clamp_min(0.0)) / pairs
