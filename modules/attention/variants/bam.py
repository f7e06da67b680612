"""Bayesian Attention Modules (Fan, Zhang, Chen & Zhou, NeurIPS 2020): stochastic attention weights.

Paper: ../shared/papers/bayesian-attention-modules-course.txt, chapter 3 (course notes on Fan et al. 2020).
The notes leave the parameterisation open; we follow the authors' code (github.com/zhougroup/BAM:
GAT/utils/layers.py, transformers-master/src/transformers/modeling_albert.py), which makes the *normalised*
softmax weights the mean of the random weights.

The deterministic weights w = softmax(logits) within each group are the mean of unnormalised positive
random weights S; training draws S by reparameterisation and normalises it, W = S / sum_group S (3.2.3):
- `bam-weibull`:   S ~ Weibull(k, lambda), lambda = w / Gamma(1 + 1/k) so E[S] = w (Definition 3.2);
                   S = lambda * E^(1/k) with E ~ Exp(1) (inverse CDF).
- `bam-lognormal`: S ~ Lognormal(mu, sigma^2), mu = log w - sigma^2/2 so E[S] = w (Definition 3.1);
                   S = exp(mu + sigma * eps) with eps ~ N(0, 1).
Aux loss "kl": KL(q(S) || p(S)) per (query, key) pair in closed form, averaged over the valid pairs:
Weibull || Gamma(shape alpha, rate beta) (Property 3.2), Lognormal || Lognormal(mu0, sigma0^2) (Property 3.1).
Priors (`prior`): "fixed" = constant alpha, beta (resp. mu0 = prior_mu, sigma0 = prior_sigma; the authors'
att_prior_type 'constant'); "contextual" (the paper's BAM-WC / BAM-LC) = a per-head MLP F of each key gives a
prior distribution over the keys pi = softmax(F(k_j)); Weibull prior Gamma(beta * pi_j, beta) (prior mean pi_j,
as in the authors' code), Lognormal prior mu0 = log pi_j. Where the softmax runs (`prior_scope`): over all N
nodes on graphs, one weight per node shared by every query and not renormalised per neighbourhood, with only
the KL restricted to the edges (the authors' GAT/utils/layers.py: softmax(dot_gamma, axis=-1) over the N
nodes, KL masked by bias_mat); over each query's keys elsewhere (on a key-padded sequence every query's keys
are all the sequence's keys, so the two agree there).

Per-host defaults (`BAMConfig.site_defaults`; each field's docstring names its script and flag): the authors
ran two recipes, and they differ enough that one set of defaults cannot serve both hosts.
- 'graph' (GAT/execute_cora.py): k = 1000, alpha = beta = 1, sigma = sigma0 = 1, KL weight
  kl_weight * sigmoid(epoch * kl_anneal_rate) counted in epochs from 0 (so half weight in the first epoch);
  two choices where the script's defaults and the paper differ: the contextual prior over all nodes (the
  paper's BAM-WC; the script defaults to a constant Gamma(1, 1) prior) and kl_weight 1 (the script's default
  0 switches the KL, and with it any prior, off). The script trains 400 epochs with GAT's patience 100; here
  every variant gets the task's budget (paper-gat: GAT's rule), so that the comparison with softmax is paired.
- every other host (transformers-master/examples/run_glue_albert_mrpc.sh): k = 10, alpha = beta = 1e-4,
  sigma = 1e-4, sigma0 = 100, fixed prior, KL weight att_kl = 1 from the first step (their trainer.py has the
  sigmoid commented out; kl_anneal_rate is unused there). The tiny Gamma(1e-4, 1e-4) prior makes the KL's pull
  on the weights about 1e-4 of the GAT settings'. Run with the GAT settings and a per-step anneal, both BAM
  rows on glue-quick RTE collapsed to a constant 50/50 predictor (NLL exactly ln 2). Measured on scratch
  RTE (2 layers, steps 0-20): the KL's gradient on the host's parameters is 22-65% of the task loss's with
  the GAT settings and below 0.004% with the GLUE ones; the KL's value (about 10 per layer, mostly
  log k + log Gamma(1e-4)) is then a constant offset in the training loss.
At evaluation S is replaced by its mean (W = w) unless `mc_samples` > 1, which averages that many sampled W.

Softmax limit (Remark in 3.2.3): as k -> infinity (or sigma -> 0) the sampled weights W tend to w, so the
forward pass is softmax attention's. The training objective is not: the KL diverges like log k (resp.
log(sigma0 / sigma)), a constant, while its gradient tends to a finite, nonzero pull of w towards the prior
(-alpha log w + beta w per pair, resp. (log w - mu0)^2 / (2 sigma0^2)). Training reduces to softmax
attention only with kl_weight = 0 as well, which is what `softmax_limit` states.
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, Callable, ClassVar, Iterator

from annotated_types import Ge, Gt
import torch
import torch.utils.checkpoint
from torch import Tensor, nn
from torch.nn import functional as F

from ...device_policy import takes_cuda_path, takes_triton_path
from ..groups import DenseGroups, Groups
from ..kernel import (AttentionConfig, AttentionKernel, AttentionResult, AttentionSite, FusedAttention, HeadShape, LibraryForm,
                      MechanismDiagnostic,
                      full_precision, mechanism_diagnostics_on, query_block_rows, replaying,
                      standard_diagnostics)
from ..registry import register_attention

EULER_GAMMA = 0.5772156649015329
PRIORS = ("fixed", "contextual")
PRIOR_SCOPES = ("nodes", "neighbourhood")


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
# The authors' published settings (github.com/zhougroup/BAM), flag by flag. Two hosts have them:
# - graphs: GAT/execute_cora.py (its argparse defaults; the repository has no graph run script that sets them),
#   KL in GAT/utils/layers.py;
# - text: transformers-master/examples/run_glue_albert_mrpc.sh (ALBERT on GLUE), KL in
#   transformers-master/src/transformers/modeling_albert.py, KL weight in .../transformers/trainer.py.
# The repository publishes nothing for VQA or captioning.
KL_SCHEDULES = ("sigmoid", "constant")

GAT_SCRIPT = {
    "prior": "contextual",
    "prior_scope": "nodes",
    "kl_schedule": "sigmoid",
    "k": 1000.0,
    "alpha": 1.0,
    "beta": 1.0,
    "sigma": 1.0,
    "prior_sigma": 1.0,
}
GLUE_SCRIPT = {
    "prior": "fixed",
    "prior_scope": "neighbourhood",
    "kl_schedule": "constant",
    "k": 10.0,
    "alpha": 1e-4,
    "beta": 1e-4,
    "sigma": 1e-4,
    "prior_sigma": 1e2,
}


@dataclass(frozen=True)
class BAMConfig(AttentionConfig):
    """Fields left None take the authors' settings for the host (`site_defaults`): their GAT settings on
    'graph', their GLUE (ALBERT) script on every other host. 'vision-language' and 'any' get the GLUE script
    because it is the authors' only recipe for a transformer trained by minibatch steps (multi-head scaled
    dot-product self-attention, AdamW, many steps per epoch), which is what the VQA/captioning hosts and
    unknown plugin hosts are; the GAT settings assume one full-graph step per epoch, and the repository has
    no VQA or captioning script."""

    schedule_unit: ClassVar[str] = "epoch"
    """GAT/execute_cora.py feeds the KL schedule `epoch_num` (on the GAT host an epoch is one full-graph
    step, so it is also the paper's iteration counter t of Algorithm 1). The GLUE trainer has no schedule."""

    prior: str | None = None
    """"fixed" (constant prior parameters) or "contextual" (prior over keys from an MLP of the keys).
    Graph: "contextual", the paper's BAM-WC / BAM-LC as implemented in GAT/utils/layers.py
    (att_prior_type == 'contextual'): a choice, since execute_cora.py's argparse default is 'constant'
    (a fixed Gamma(1, 1)); the paper's graph results are for the contextual prior.
    Other hosts: "fixed" (run_glue_albert_mrpc.sh: --att_prior_type constant)."""
    prior_scope: str | None = None
    """Where the contextual prior's softmax runs. "nodes": over every key node of the graph, one weight per
    node shared by every query and not renormalised per neighbourhood; only the KL is restricted to the edges
    (the authors' GAT/utils/layers.py: softmax(dot_gamma, axis=-1) over all N nodes). Graph sites only: a
    batch of several graphs would share one softmax (GAT's transductive tasks have one graph). Default on
    'graph'. "neighbourhood": over each query's keys (attnbench's version-2 graph form, kept as an option);
    default elsewhere, where on a key-padded sequence it is the same thing as the authors' softmax over the
    sequence's keys (modeling_albert.py)."""
    prior_hidden: Annotated[int, Ge(1)] = 10
    """Hidden width of the contextual prior's per-head MLP (both scripts: att_se_hid_size = 10)."""
    kl_weight: Annotated[float, Ge(0)] = 1.0
    """Weight of the KL term once annealed (run_glue_albert_mrpc.sh: --att_kl 1). A choice on graphs:
    execute_cora.py's argparse default att_kl = 0 switches the KL off (and with it the prior: BAM is then
    softmax with Weibull noise of 0.1% at k = 1000), so the repository publishes no graph value; 1 is used on
    every host. The KL is averaged over the attention layers and heads (execute_cora.py: add_n(kl_list) /
    len(kl_list)); the paper's objective (eq. 3.5) sums it over layers."""
    kl_schedule: str | None = None
    """How the KL weight moves. "sigmoid": kl_weight * sigmoid(anneal_rate * (epoch - anneal_midpoint))
    (execute_cora.py: exp(epoch_num * kl_anneal_rate) / (1 + exp(...)) * KL with epoch_num from 0; the
    paper's Algorithm 1: lambda = sigmoid(t * rho)); default on 'graph'. "constant": kl_weight from the first
    step (trainer.py _training_step: the sigmoid is commented out and loss += att_kl * KL from
    global_step >= kl_start_step = 0; kl_anneal_rate is parsed but unused); default on every other host."""
    anneal_rate: float = 1.0
    """Slope of the sigmoid schedule per epoch (both scripts: kl_anneal_rate = 1)."""
    anneal_midpoint: float = 0.0
    """Epoch at which the sigmoid weight is half of kl_weight (authors' code: 0, so the first epoch has half)."""
    mc_samples: Annotated[int, Ge(1)] = 1
    """Weight sets averaged at evaluation; 1 = the mean weights (deterministic)."""

    def __post_init__(self):
        if self.prior is not None and self.prior not in PRIORS:
            raise ValueError(f"prior must be one of {PRIORS}, got {self.prior!r}")
        if self.prior_scope is not None and self.prior_scope not in PRIOR_SCOPES:
            raise ValueError(f"prior_scope must be one of {PRIOR_SCOPES}, got {self.prior_scope!r}")
        if self.kl_schedule is not None and self.kl_schedule not in KL_SCHEDULES:
            raise ValueError(f"kl_schedule must be one of {KL_SCHEDULES}, got {self.kl_schedule!r}")
        if self.mc_samples < 1:
            raise ValueError(f"mc_samples must be >= 1, got {self.mc_samples}")
        if self.prior_hidden < 1:
            raise ValueError(f"prior_hidden must be >= 1, got {self.prior_hidden}")
        if self.kl_weight < 0:
            raise ValueError(f"kl_weight must be >= 0, got {self.kl_weight}")

    @classmethod
    def site_defaults(cls, site: AttentionSite) -> dict[str, Any]:
        settings = GAT_SCRIPT if site.host == "graph" else GLUE_SCRIPT
        names = {f.name for f in dataclasses.fields(cls)}
        return {name: value for name, value in settings.items() if name in names}

    def loss_weights(self, step: int) -> dict[str, float]:
        """The KL weight after `step` completed epochs (`schedule_unit`)."""
        if self.kl_schedule is None:
            raise ValueError("kl_schedule is unset: build the kernel at a site (AttentionConfig.for_site) first")
        if self.kl_schedule == "constant":
            return {"kl": self.kl_weight}
        return {"kl": self.kl_weight * _sigmoid(self.anneal_rate * (step - self.anneal_midpoint))}

    @classmethod
    def suggest(cls, trial: Any) -> dict[str, Any]:
        return {
            "prior": trial.suggest_categorical("prior", list(PRIORS)),
            "kl_weight": trial.suggest_float("kl_weight", 1e-3, 10.0, log=True),
            "kl_schedule": trial.suggest_categorical("kl_schedule", list(KL_SCHEDULES)),
            "anneal_rate": trial.suggest_float("anneal_rate", 1e-2, 1.0, log=True),
        }


@dataclass(frozen=True)
class WeibullConfig(BAMConfig):
    k: Annotated[float | None, Gt(0)] = None
    """Weibull shape; the coefficient of variation of S is about 1.28 / k. Graph: 1000 (execute_cora.py
    --k_weibull default); other hosts: 10 (run_glue_albert_mrpc.sh --k_weibull 10)."""
    alpha: Annotated[float | None, Gt(0)] = None
    """Shape of the fixed Gamma prior (the KL's -alpha log(lambda) and lgamma(alpha) terms in layers.py and
    modeling_albert.py); the contextual prior uses beta * pi_j instead. Graph: 1 (execute_cora.py
    --alpha_gamma default); other hosts: 1e-4 (run_glue_albert_mrpc.sh --alpha_gamma 1e-4)."""
    beta: Annotated[float | None, Gt(0)] = None
    """Rate of the Gamma prior (the KL's beta * lambda * Gamma(1 + 1/k) = beta * E[S] term). Graph: 1
    (--beta_gamma default); other hosts: 1e-4 (run_glue_albert_mrpc.sh --beta_gamma 1e-4). With
    alpha = beta = 1e-4 the KL's gradient is about 1e-4 of the GAT settings', a light touch on a pretrained model."""

    def __post_init__(self):
        super().__post_init__()
        values = [v for v in (self.k, self.alpha, self.beta) if v is not None]
        if not all(v > 0 for v in values):
            raise ValueError(f"k, alpha and beta must be > 0, got {self.k}, {self.alpha}, {self.beta}")

    @classmethod
    def suggest(cls, trial: Any) -> dict[str, Any]:
        return {
            **super().suggest(trial),
            # spans both scripts' values (k 10 and 1000; alpha, beta 1e-4 and 1)
            "k": trial.suggest_float("k", 10.0, 1e4, log=True),
            "alpha": trial.suggest_float("alpha", 1e-4, 10.0, log=True),
            "beta": trial.suggest_float("beta", 1e-4, 10.0, log=True),
        }


@dataclass(frozen=True)
class LognormalConfig(BAMConfig):
    sigma: Annotated[float | None, Gt(0)] = None
    """Posterior sigma: the standard deviation of log S itself (modeling_albert.py: mu = log w - sigma^2/2,
    sample mu + sigma * eps), not a log of it; the coefficient of variation of S is sqrt(exp(sigma^2) - 1).
    Graph: 1 (execute_cora.py --sigma_normal_posterior default); other hosts: 1e-4
    (run_glue_albert_mrpc.sh --sigma_normal_posterior 1e-4; that script runs soft_weibull, but its lognormal
    flags are the only text values published)."""
    prior_mu: float = 0.0
    """mu0 of the fixed prior (authors' code: mean_normal_prior = 0); the contextual prior uses log pi_j."""
    prior_sigma: Annotated[float | None, Gt(0)] = None
    """sigma0 of the prior. Graph: 1 (execute_cora.py --sigma_normal_prior default); other hosts: 100
    (run_glue_albert_mrpc.sh --sigma_normal_prior 1e2)."""

    def __post_init__(self):
        super().__post_init__()
        values = [v for v in (self.sigma, self.prior_sigma) if v is not None]
        if not all(v > 0 for v in values):
            raise ValueError(f"sigma and prior_sigma must be > 0, got {self.sigma}, {self.prior_sigma}")

    @classmethod
    def suggest(cls, trial: Any) -> dict[str, Any]:
        return {
            **super().suggest(trial),
            # spans both scripts' values (sigma 1e-4 and 1, sigma0 1 and 100)
            "sigma": trial.suggest_float("sigma", 1e-4, 2.0, log=True),
            "prior_sigma": trial.suggest_float("prior_sigma", 0.1, 100.0, log=True),
        }


# ---- the kernels -----------------------------------------------------------------------------------
_fused_on_cpu = False
_EVALUATION_DRAW_SEED = 0xBA3
"""Seed of the draw `sample_tv` measures at evaluation (a fixed stream apart from the run's)."""

FUSED_BLOCK_SIZE = 2.0
"""The fused path's blocks (noise, noisy SDPA, clean logsumexp) hold at most this many times q's elements in one
[b, H, rows, Lk] tensor: for the logsumexp, every sample's rows = FUSED_BLOCK_SIZE * Lq * d / Lk (at least 16; 128
for d = 64 self-attention at any length); the noisy blocks hold as many elements in whole samples where that is at
least one (`_fused_blocks`: at B = 32, H = 12, d = 64, 8 samples a block at L = 512, 2 at L = 2048). The extra memory
of a block (its noise, and its logits while the logsumexp and `sample_tv` are formed: two or three such tensors at
once) then grows as the call's own q, k, v, not as L x L. Each block of every sample's rows reads all of k and v and
adds its share of their gradients (three k-sized passes each way), a block of whole samples only its samples'. Counted
on the GPU cost page (B = 32, H = 12, d = 64, L = 512 and 2048): peak live 1.41 x SDPA's at 1 and at 2 (there the
logsumexp's backward sets it, not the blocks), 1.7 x at 3, 2.1 x at 4; bytes touched the same at 1 to 4; launches fall
with larger blocks (bam-weibull at L = 2048: 970 kernels at 1, 522 at 2, 298 at 4)."""
FUSED_WHOLE_MB = 64
"""A fused call whose [B, H, Lq, Lk] float32 tensor is at most this many MiB runs as one block: blocks would spare
little memory there and cost launches (and one block draws the eager path's noise)."""


@contextmanager
def fused_on_cpu(enabled: bool = True) -> Iterator[None]:
    """Let the BAM kernels take their fused path (`BayesianAttention.fused_attention`) on CPU too. Only for
    tests: there it shows that the path computes the eager path's output, KL and gradients; CPU runs keep the
    eager path, the one their records were made with."""
    global _fused_on_cpu
    previous, _fused_on_cpu = _fused_on_cpu, enabled
    try:
        yield
    finally:
        _fused_on_cpu = previous


class _RowLogSumExp(torch.autograd.Function):
    """lse_i = logsumexp over query i's valid keys j of scale * <q_i, k_j>: what the closed-form KL needs of the
    mean weights (log w_ij = scale * <q_i, k_j> - lse_i). Forward: one block of `samples` samples' `rows` queries at a
    time (all samples where not given), the block's logits freed before the next (nothing of the logits' size is
    kept); a block of whole samples reads only their keys. Backward: d lse_i / d q_i = scale * sum_j w_ij
    k_j and d lse_i / d k_j = scale * w_ij q_i, i.e. SDPA with the keys as values (its output, for dq) and its
    backward for the values' gradient with g_i * scale * q_i as the output's gradient (P^T (g q), for dk), run in
    chunks of the batch (`_lse_backward_chunks`): the L x L weights are never formed. A query without a valid key gets lse 0 (it enters no KL sum)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, key_mask: Tensor | None, scale: float, rows: int,
                samples: int | None = None) -> Tensor:
        samples = q.shape[0] if samples is None or k.shape[0] != q.shape[0] else samples
        chunks = []
        for first in range(0, q.shape[0], samples):
            part = slice(first, min(first + samples, q.shape[0]))
            q_part, k_part = (q, k) if samples == q.shape[0] else (q[part], k[part])
            mask = key_mask if key_mask is None or samples == q.shape[0] else _lead(key_mask, 0, part)
            pieces = []
            for start in range(0, q.shape[-2], rows):
                logits = torch.matmul(q_part[..., start:start + rows, :] * scale, k_part.transpose(-1, -2))
                if mask is not None:
                    logits.masked_fill_(~mask, float("-inf"))
                pieces.append(logits.logsumexp(-1))
                del logits
            chunks.append(torch.cat(pieces, dim=-1) if len(pieces) > 1 else pieces[0])
        lse = torch.cat(chunks, dim=0) if len(chunks) > 1 else chunks[0]
        if key_mask is not None:
            lse = lse.masked_fill(lse == float("-inf"), 0.0)
        ctx.save_for_backward(q, k)
        ctx.key_mask, ctx.scale = key_mask, scale
        return lse

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k = ctx.saved_tensors
        mask = ctx.key_mask
        if mask is not None:
            # a sample without any valid key (its rows' grad is 0) attends to every key: no 0/0 in SDPA's softmax
            mask = mask | ~mask.any(-1, keepdim=True)
        g = (grad * ctx.scale).unsqueeze(-1)
        q, k = q.detach(), k.detach()
        dim, size = _lse_backward_chunks(q)
        if size >= q.shape[dim]:
            out, dk = _lse_backward_sdpa(q, k, g, mask, ctx.scale)
            return g * out, dk, None, None, None, None
        # in chunks of the batch (or heads): SDPA's backward writes q-, k- and v-sized gradients of which only the
        # values' is wanted, and its output and the output's gradient live alongside; a chunk at a time keeps those
        # five a chunk's size, written into the two gradients returned (the same numbers: each (sample, head) is
        # its own problem)
        dq, dk = torch.empty_like(q), torch.empty_like(k)
        for start in range(0, q.shape[dim], size):
            part = slice(start, min(start + size, q.shape[dim]))
            out, dk_part = _lse_backward_sdpa(_lead(q, dim, part), _lead(k, dim, part), _lead(g, dim, part),
                                             None if mask is None else _lead(mask, dim, part), ctx.scale)
            torch.mul(_lead(g, dim, part), out, out=_lead(dq, dim, part))
            del out
            _lead(dk, dim, part).copy_(dk_part)
            del dk_part
        return dq, dk, None, None, None, None


LSE_BACKWARD_CHUNKS = 4
"""`_RowLogSumExp`'s backward runs its SDPA in about this many chunks of the batch (of the heads where the batch has
fewer samples): see `_lse_backward_chunks`."""


def _lse_backward_chunks(q: Tensor) -> tuple[int, int]:
    """(dimension, chunk size) of `_RowLogSumExp`'s backward: the batch in LSE_BACKWARD_CHUNKS chunks, or the heads
    where the batch has fewer samples than that (one chunk where neither has as many)."""
    for dim in (0, 1):
        if q.dim() == 4 and q.shape[dim] >= LSE_BACKWARD_CHUNKS:
            return dim, -(-q.shape[dim] // LSE_BACKWARD_CHUNKS)
    return 0, q.shape[0]


def _noisy_kernel_module():
    """modules/attention/triton_noisy_softmax.py where Triton is installed, else None."""
    from .. import triton_noisy_softmax

    return triton_noisy_softmax if triton_noisy_softmax.triton is not None else None


def _forced_rows() -> int | None:
    """The query blocks `query_blocks` forces (tests), or None."""
    from .. import backends

    return backends._forced_block_rows


def _lead(t: Tensor, dim: int, part: slice) -> Tensor:
    """`t`'s `part` along leading dimension `dim` (all of it where `t` broadcasts there)."""
    return t if t.shape[dim] == 1 else t[(slice(None),) * dim + (part,)]


def _lse_backward_sdpa(q: Tensor, k: Tensor, g: Tensor, mask: Tensor | None, scale: float) -> tuple[Tensor, Tensor]:
    """(sum_j w_ij k_j, scale-free P^T (g q)) for the mean weights w: SDPA with the keys as values, its output and its
    values' gradient under the output's gradient g q."""
    # in the forward's precision (a backward called under autocast would otherwise run SDPA in its dtype)
    with torch.enable_grad(), torch.autocast(q.device.type, enabled=False):
        values = k.detach().requires_grad_()  # another alias of k: the keys take no gradient
        out = F.scaled_dot_product_attention(q, k, values, attn_mask=mask, scale=scale)
        (dk,) = torch.autograd.grad(out, values, g * q)
    return out.detach(), dk


class _Gram(torch.autograd.Function):
    """x^T x over the second-to-last dimension, whose backward is one product x (G + G^T) (autograd's would take
    one for each factor and add them)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return torch.matmul(x.transpose(-1, -2), x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return torch.matmul(x, grad + grad.transpose(-1, -2))


class _PairSums:
    """Sums over the valid (query, key) pairs of valid queries of the terms BAM's KL closed forms are linear in, for
    the mean weights w = softmax(scale q k^T) within each query's valid keys, from the rows' logsumexp `lse`, without
    forming w. With the keys centred on their mean over each sample's valid keys (kc_j = k_j - kbar, 0 on masked keys)
    and a_i = lse_i - scale <q_i, kbar>, log w_ij = scale <q_i, kc_j> - a_i; over a query's n valid keys it sums to
    -n a_i and its square to scale^2 q_i^T (kc^T kc) q_i + n a_i^2, so neither sum cancels large terms."""

    def __init__(self, q: Tensor, k: Tensor, lse: Tensor | None, groups: DenseGroups, scale: float,
                 centred: tuple[Tensor, Tensor] | None = None):
        """From the rows' logsumexp `lse`, or from `centred` = (a_i, sum over the valid keys of (scale <q_i, kc_j>)^2
        or an empty tensor where not wanted) as the Triton kernel returns them with their gradients: then the key mean
        is formed only where a per-key sum needs it (`_times_centred`), and no q- or k-sized product is."""
        self.q, self.k, self.scale = q, k, scale
        mask = groups.mask  # per key: [B|1, 1|H, 1, Lk]
        # the sums' dtype: q's, or the kernel's float32 where q may be 16-bit (a bf16 count of keys is exact to 256)
        dtype = q.dtype if centred is None else torch.promote_types(q.dtype, centred[0].dtype)
        self.keys = None if mask is None else mask.to(dtype)
        if self.keys is None:
            self.n: Tensor | float = float(k.shape[-2])
        else:
            self.n = self.keys.sum(-1)  # [B|1, 1|H, 1]
        if centred is None:
            self.a = lse - scale * torch.matmul(q, self.key_mean.transpose(-1, -2)).squeeze(-1)
            self.squares = None
        else:
            self.a, self.squares = centred
        self.shape = self.a.shape
        rows = groups.valid_queries  # [B|1, 1|H, Lq] or None (every query is valid and has keys)
        self.rows = None if rows is None else rows.to(dtype)

    @cached_property
    def key_mean(self) -> Tensor:
        """The mean of each sample's valid keys, [B, H, 1, d]."""
        if self.keys is None:
            return self.k.mean(-2, keepdim=True)
        return torch.matmul(self.keys, self.k) / self.n.clamp_min(1).unsqueeze(-1)

    def _times_centred(self, left: Tensor | None) -> Tensor:
        """left @ kc ([B, H, 1, Lk] @ [B, H, Lk, d]), or kc^T kc where left is None; checkpointed, so that the
        backward recomputes kc rather than keeping a tensor of k's size."""

        def product(k: Tensor, key_mean: Tensor, *left_: Tensor) -> Tensor:
            # k + (-mean), the same numbers as k - mean: its backward hands the mean the gradient's sum, where a
            # subtraction's negates the whole k-sized gradient first
            centred = k + key_mean.neg()
            if self.keys is not None:
                centred = centred * self.keys.transpose(-1, -2)
            return torch.matmul(left_[0], centred) if left_ else _Gram.apply(centred)

        inputs = (self.k, self.key_mean) if left is None else (self.k, self.key_mean, left)
        if not torch.is_grad_enabled() or not any(t.requires_grad for t in inputs):
            return product(*inputs)
        return torch.utils.checkpoint.checkpoint(product, *inputs, use_reentrant=False)

    def over_rows(self, x: Tensor | float) -> Tensor:
        """Sum over the valid queries of a per-query term x (broadcastable to [B, H, Lq])."""
        x = torch.as_tensor(x, dtype=self.a.dtype, device=self.a.device)
        if self.rows is not None:
            x = x * self.rows
        return x.expand(self.shape).sum()

    @property
    def pairs(self) -> Tensor:
        """The valid pairs (at least 1), as `Groups.count_pairs`."""
        return self.over_rows(self.n).clamp_min(1)

    @property
    def queries(self) -> Tensor:
        """The valid queries: the sum of the mean weights over the valid pairs (each row sums to 1)."""
        return self.over_rows(1.0)

    def log_weights(self) -> Tensor:
        """Sum of log w_ij."""
        return self.over_rows(-self.n * self.a)

    def squared_log_weights(self) -> Tensor:
        """Sum of (log w_ij)^2."""
        if self.squares is not None:
            return self.over_rows(self.squares + self.n * self.a.square())
        # sum_i q_i^T M q_i over valid queries as <M, Q^T diag(rows) Q>: d x d products, nothing of q's size formed
        moments = self._times_centred(None)  # [B, H, d, d]
        # rows are 0 or 1, so (q rows)^T (q rows) = Q^T diag(rows) Q
        valid_q = self.q if self.rows is None else self.q * self.rows.unsqueeze(-1)
        spread = (moments * _Gram.apply(valid_q)).sum() * self.scale**2
        return spread + self.over_rows(self.n * self.a.square())

    def _on_keys(self, c: Tensor) -> Tensor:
        return c if self.keys is None else c * self.keys

    def weighted_log_weights(self, c: Tensor) -> Tensor:
        """Sum of c_j log w_ij for a per-key c [B, H, 1, Lk]."""
        c = self._on_keys(c)
        direction = self._times_centred(c)  # [B, H, 1, d]
        return self.over_rows(self.scale * torch.matmul(self.q, direction.transpose(-1, -2)).squeeze(-1)
                              - self.a * c.sum(-1))

    def per_key(self, x: Tensor) -> Tensor:
        """Sum of x_j for a per-key x [B, H, 1, Lk]."""
        return self.over_rows(self._on_keys(x).sum(-1))


class _NoisyBlocks:
    """The fused path's noisy SDPA (`BayesianAttention.fused_attention`) one block at a time: a block is a chunk of
    the batch's samples and of their queries ([b, H, rows, Lk]); each draws its noise (`log_noise`) and hands it to
    SDPA as the logits bias. `run(v)` checkpoints each block: the backward redraws the block's noise from the stream's
    state before its draw (`replaying` for the kernel's own generator, checkpoint's RNG preservation for torch's), so
    no noise is kept. Where `diagnostics` is given, `sample_tv` is measured in each block's forward, from the block's
    mean weights (its logits and `lse`) and the noise SDPA gets."""

    def __init__(self, kernel: "BayesianAttention", q: Tensor, k: Tensor, groups: DenseGroups, scale: float,
                 samples: int, rows: int, lse: Tensor, diagnostics: dict[str, Tensor] | None):
        self.kernel, self.q, self.k, self.groups, self.scale, self.lse = kernel, q, k, groups, scale, lse
        self.chunks = [slice(start, min(start + samples, q.shape[0])) for start in range(0, q.shape[0], samples)]
        self.rows = [slice(start, min(start + rows, q.shape[-2])) for start in range(0, q.shape[-2], rows)]
        self.diagnostics = diagnostics
        self.spread: list[Tensor] = []
        self.counted: list[Tensor] = []
        self.precise_dtype = torch.promote_types(q.dtype, torch.float32)
        self.keys_and_ones: Tensor | None = None  # [k, 1], for `mean_weights`, made at its first call

    def part(self, samples: slice, block: slice) -> DenseGroups:
        """The groups of the block's samples and queries."""
        groups = self.groups
        if len(self.chunks) > 1:
            mask, valid = groups.mask, groups.query_valid
            groups = DenseGroups(None if mask is None else _lead(mask, 0, samples),
                                 None if valid is None else valid[samples])
        return groups.query_rows(block)

    def mean_weights(self, q_block: Tensor, part: DenseGroups, samples: slice, block: slice) -> Tensor:
        """The block's mean weights (precise dtype, no gradient): 0 on masked keys and in rows without keys. The
        logits less the row's logsumexp come out of one product, [scale q_i, -lse_i] . [k_j, 1] (a pass fewer over
        the block than subtracting afterwards)."""
        with torch.no_grad(), full_precision(q_block) as (q_,):
            if self.keys_and_ones is None:
                with full_precision(self.k) as (k_,):
                    self.keys_and_ones = torch.cat([k_, k_.new_ones(()).expand(*k_.shape[:-1], 1)], dim=-1)
            lse = _lead(self.lse, 0, samples)[..., block]
            rows = torch.cat([q_ * self.scale, -lse.unsqueeze(-1).to(q_.dtype)], dim=-1)
            mean = torch.matmul(rows, _lead(self.keys_and_ones, 0, samples).transpose(-1, -2))
            if part.mask is not None:
                mean.masked_fill_(~part.mask, float("-inf"))
            return mean.exp_()

    def noise(self, q_block: Tensor, k: Tensor, part: DenseGroups) -> Tensor:
        if "draw_noise" in vars(self.kernel):
            # noise held by a check as a function of the weights it perturbs (contract.held_noise): drawn from them,
            # formed as the eager path forms them, bit for bit
            with torch.no_grad(), full_precision(q_block, k) as (q_, k_):
                like = part.softmax_and_log(self.kernel.score(q_, k_, part, scale=self.scale))[0]
        else:  # from the stream: only the shape, dtype and device count
            like = torch.zeros((), dtype=self.precise_dtype, device=q_block.device).expand(
                *q_block.shape[:-1], k.shape[-2])
        return self.kernel.log_noise(like)

    def measure(self, q_block: Tensor, part: DenseGroups, samples: slice, block: slice, noise: Tensor) -> None:
        """Add the block's sum of |sample - mean| over its valid pairs and its valid queries: with P the mean weights
        and e = exp(noise), the sample is P e / Z (Z = sum_j P_j e_j), so |sample - mean| = P |e - Z| / Z."""
        with torch.no_grad():
            mean = self.mean_weights(q_block, part, samples, block)
            spread = noise.exp().unsqueeze(-1)
            total = torch.matmul(mean.unsqueeze(-2), spread).squeeze(-1)  # Z [B, H, rows, 1]
            spread = torch.matmul(mean.unsqueeze(-2), spread.squeeze(-1).sub_(total).abs_().unsqueeze(-1)).squeeze(-1)
            per_query = (spread / total.clamp_min(torch.finfo(total.dtype).tiny)).squeeze(-1)
            valid = part.valid_queries
            shape = per_query.shape
            if valid is None:
                self.spread.append(per_query.sum())
                self.counted.append(per_query.new_tensor(float(math.prod(shape))))
            else:
                self.spread.append((per_query * valid).sum())
                self.counted.append(valid.expand(shape).sum().to(per_query.dtype))

    def finish(self) -> None:
        self.keys_and_ones = None  # not kept through the backward (its recomputation measures nothing)
        if self.diagnostics is not None and self.spread:
            spread, counted = torch.stack(self.spread).sum(), torch.stack(self.counted).sum()
            self.diagnostics["sample_tv"] = (0.5 * spread / counted.clamp_min(1)).detach()
            self.spread, self.counted = [], []

    def _block(self, part: DenseGroups, samples: slice, block: slice) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        calls = 0

        def attend(q_block: Tensor, k: Tensor, v: Tensor) -> Tensor:
            nonlocal calls
            calls += 1
            noise = self.noise(q_block, k, part)
            if calls == 1 and self.diagnostics is not None:  # the forward's, not the backward's recomputation
                self.measure(q_block, part, samples, block, noise)
            return part.fused_attention(q_block, k, v, bias=noise, scale=self.scale, dropout_p=0.0)

        return attend

    def run(self, v: Tensor) -> Tensor:
        q, k = self.q, self.k
        keep = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        # splits, not a slice per block: their backwards join the blocks' gradients in one pass each, where each
        # slice's would write a whole-sized gradient to be added up; a chunk of samples reads (and its backward
        # writes) only its own keys and values
        sizes = [samples.stop - samples.start for samples in self.chunks]
        split = (lambda t: t.split(sizes, dim=0) if t.shape[0] == q.shape[0] else [t] * len(sizes)) \
            if len(sizes) > 1 else (lambda t: [t])
        chunks = []
        for samples, q_chunk, k_chunk, v_chunk in zip(self.chunks, split(q), split(k), split(v)):
            outputs = []
            # one block of rows: q_chunk itself (a one-piece split's backward would copy its gradient)
            pieces = q_chunk.split([block.stop - block.start for block in self.rows], dim=-2) \
                if len(self.rows) > 1 else [q_chunk]
            for block, q_block in zip(self.rows, pieces):
                attend = self._block(self.part(samples, block), samples, block)
                if keep:
                    outputs.append(torch.utils.checkpoint.checkpoint(
                        replaying(attend, self.kernel.noise_generator), q_block, k_chunk, v_chunk, use_reentrant=False,
                        preserve_rng_state=True))
                else:
                    outputs.append(attend(q_block, k_chunk, v_chunk))
            chunks.append(torch.cat(outputs, dim=-2) if len(outputs) > 1 else outputs[0])
        self.finish()
        return torch.cat(chunks, dim=0) if len(chunks) > 1 else chunks[0]

    def whole_bias(self) -> Tensor:
        """The noise of every block in one bias (the autocast dtype under autocast, as SDPA casts its mask), for SDPA
        with attention dropout, which keeps it for its backward."""
        q, k = self.q, self.k
        device = q.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else q.dtype
        bias = q.new_empty((*q.shape[:-1], k.shape[-2]), dtype=dtype)
        with torch.no_grad():
            for samples in self.chunks:
                k_chunk = _lead(k, 0, samples)
                for block in self.rows:
                    part = self.part(samples, block)
                    q_block = q[samples][..., block, :]
                    noise = self.noise(q_block, k_chunk, part)
                    if self.diagnostics is not None:
                        self.measure(q_block, part, samples, block, noise)
                    bias[samples][..., block, :].copy_(noise)
        self.finish()
        return bias


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
    version: ClassVar[str] = "3"
    """3: on graphs the contextual prior is a softmax over all nodes (the authors' GAT code; was per
    neighbourhood, now `prior_scope='neighbourhood'`); the prior MLP trains at the host's learning rate with
    its weight decay (was the kernels' 1e-2, undecayed); the KL is averaged over layers (was summed).
    2: per-host paper defaults (GAT vs GLUE script), KL schedule per epoch from the authors' code; the KL
    and the sampling diagnostic average over the pairs of valid queries only (1 counted padded query rows, so a
    batch's padding moved the KL)."""
    stochastic: ClassVar[bool] = True
    mechanism = (
        MechanismDiagnostic(
            "kl_share", "the weighted KL's share of the loss: w·KL / (task loss + w·KL)", rule="above", threshold=0.01,
            loss_share="kl",
            why="the prior's share of the loss at the evaluated weights (test pass, the KL weight at the kept epoch): "
                "below 1% it barely pulls on the weights"),
        MechanismDiagnostic(
            "sample_tv", "mean total-variation distance of a training draw of the weights from the mean weights, at "
            "these weights (evaluation itself uses the mean weights; its draw comes from a generator of its own, so "
            "the run's noise stream is untouched)", rule="above", threshold=0.01,
            why="the share of each query's attention mass one draw moves. Under 1% the sampled weights are the mean "
                "weights up to jitter: paper-gat's tuned rows measured 0.35-0.4% (a Cora node's ~5 neighbour weights "
                "each moved by ~0.002), a Weibull at k=1000 ~0.05%, while GAT's attention dropout zeroes 60% of the "
                "weights at every step; a 0.1% rule would count that jitter as noise at work"),
    )
    mechanism_rule = "all"
    row_separable = True
    """Each query's weights are sampled from its own row (the prior reads the keys only): a long call on CUDA may
    run in query blocks, recomputed in the backward (kernel.py `query_block_rows`). The KL is a mean over the
    valid pairs, so blocks merge it weighted by their pairs; the KL stays exact."""
    pair_means = ("kl",)

    def __init__(self, config: BAMConfig, shape: HeadShape):
        super().__init__(config, shape)
        # self.config: the prior is a per-host default, resolved for this site by the base class.
        self.key_prior = (
            KeyPrior(shape.num_heads, shape.head_dim, self.config.prior_hidden) if self.config.prior == "contextual" else None
        )
        if self.key_prior is not None and self.config.prior_scope == "nodes" and shape.site.host != "graph":
            raise ValueError(f"{self.name}: prior_scope='nodes' is the authors' graph form (one softmax over a graph's "
                             f"nodes); at a {shape.site.host!r} site use prior_scope='neighbourhood' (on a key-padded "
                             f"sequence it is the softmax over the sequence's keys)")

    # distribution-specific
    def rsample(self, mean: Tensor) -> Tensor:
        """Unnormalised weights S with E[S] = mean (noise from `draw_noise`)."""
        raise NotImplementedError

    def mean_kl(self, mean: Tensor, log_mean: Tensor, prior: tuple[Tensor, Tensor] | None, groups: Groups) -> Tensor:
        """KL(q(S) || p(S)) averaged over valid pairs; `prior` = (pi, log pi) if contextual, None if fixed."""
        raise NotImplementedError

    def prior_over_keys(self, k: Tensor, groups: Groups) -> tuple[Tensor, Tensor]:
        """pi_j and log pi_j in (broadcastable) logits layout: softmax of F(k_j) over each query's keys
        ("neighbourhood"), or over every key node ("nodes"), then read per edge."""
        key_logits = groups.map_keys(self.key_prior, k)
        if self.config.prior_scope == "neighbourhood":
            return groups.softmax_and_log(groups.per_key(key_logits))
        log_pi = self.node_log_prior(key_logits, groups, k)
        return groups.per_key(log_pi.exp()), groups.per_key(log_pi)

    def node_log_prior(self, key_logits: Tensor, groups: Groups, k: Tensor) -> Tensor:
        """log pi over the graph's key nodes [Nk, H] (node layout, graph sites only): one log-softmax over the
        nodes per head. Nodes that are no edge's key (isolated or padding nodes) are left out of it, so that
        padding a graph leaves its prior unchanged; on Cora every node has a self-loop, so this is the
        authors' softmax over all N nodes."""
        _, _, _, key_seen = groups.query_and_key_sets(k, k)  # [H, Nk] or None (every node is a key)
        if key_seen is not None:
            key_logits = key_logits.masked_fill(~key_seen.transpose(0, 1), float("-inf"))
        return key_logits.log_softmax(0).nan_to_num(neginf=0.0)

    def normalize(self, logits: Tensor, groups: Groups, *, q: Tensor, k: Tensor) -> AttentionResult:
        # Sampler and KL in float32 at least: bf16 noise has 8 bits (86% of Weibull samples at k = 1000
        # equalled their mean) and the KL sums log terms of size log k.
        with full_precision(logits, k) as (precise_logits, precise_k):
            result = self._normalize(precise_logits, groups, precise_k)
        result.weights = result.weights.to(logits.dtype)
        return result

    def draws(self) -> int:
        """Sampled weight sets a call averages: 1 in training, `mc_samples` (> 1) or 0 (the mean weights) at evaluation."""
        return 1 if self.training else (self.config.mc_samples if self.config.mc_samples > 1 else 0)

    def log_noise(self, mean: Tensor) -> Tensor:
        """log S - log E[S] for a draw of S (noise from `draw_noise(mean)`, as `rsample` draws it): the normalised
        sample is softmax(logits + log_noise), the form the authors' code writes both samplers in
        (zhougroup/BAM modeling_albert.py), which a fused kernel takes as an additive bias."""
        raise NotImplementedError

    def fused_attention(self, q: Tensor, k: Tensor, groups: Groups, *, scale: float) -> FusedAttention | None:
        """On CUDA (or under `fused_on_cpu`), dense groups whose mask is per key: the output through SDPA with the
        sampled weights' noise as its logits bias (`log_noise`), and the KL in closed form from per-query and per-key
        sums (`_closed_kl`), so that no L x L tensor is kept and at most one query block's exists at once.
        - Noise: without attention dropout, SDPA runs one block of samples and queries at a time (`_NoisyBlocks`),
          each block drawing its own [b, H, rows, Lk] noise and checkpointed: the backward redraws it from the stream's state
          before the block's draw, as SDPA's own dropout regenerates its mask, and leaves the stream where it was.
          With attention dropout SDPA draws its mask too, so the whole noise bias is drawn (block by block) and SDPA
          keeps it. One block draws what the eager path draws (the same stream, in the same order); several draw
          block by block (another order of the stream).
        - KL: the closed forms are linear in sums over the valid pairs of log w_ij, (log w_ij)^2 and per-key terms,
          and log w_ij = scale <q_i, k_j> - lse_i: each sum needs the rows' logsumexp (`_RowLogSumExp`, whose
          backward is an SDPA call) and O(L d^2) moments of the keys. Equal to the eager path's sums up to rounding.
        - `sample_tv` (training, mechanism diagnostics on): measured in each noisy block's forward from the block's
          logits and the noise SDPA gets, into the returned diagnostics, which are complete once the output is.
        None (the eager path): on CPU, where this path is not what records were made with (CPU results stay as
        they were), at evaluation with `mc_samples` > 1 (an average of several softmaxes is not one), and where the
        mask is per query (causal): the prior and the key moments assume every query of a sample sees the same keys.
        What stays L x L: the noise, written twice (the forward's draw, the backward's redraw) and read by SDPA three
        times (forward, its recomputation, backward), as any additive bias is. Where the project's Triton kernels run
        (`takes_triton_path`), a training call without attention dropout draws the noise inside a kernel of our own
        instead (`_noisy_kernel_attention`), which spares all of it and the logsumexp's passes too.
        Not yet run on a GPU: `make gpu-perf` checks it against eager (forward, gradients) and times it."""
        if not isinstance(groups, DenseGroups) or (groups.mask is not None and groups.mask.shape[-2] > 1):
            return None
        draws = self.draws()
        if draws > 1:
            return None
        if draws and self._takes_noisy_kernel(q, k):
            return self._noisy_kernel_attention(q, k, groups, scale)
        if not (takes_cuda_path(q) or _fused_on_cpu):
            return None
        rows = self._fused_rows(groups, q, k)
        samples, block_rows = self._fused_blocks(q, k, rows)
        key_mask = groups.mask
        with full_precision(q, k) as (precise_q, precise_k):
            prior = self.prior_over_keys(precise_k, groups) if self.key_prior is not None else None
            lse = _RowLogSumExp.apply(precise_q, precise_k, key_mask, scale, block_rows, samples)
            kl = self._closed_kl(precise_q, precise_k, lse, prior, groups, scale)
        if not draws:
            return FusedAttention(q, k, scale, None, aux_losses={"kl": kl})
        diagnostics: dict[str, Tensor] = {}
        blocks = _NoisyBlocks(self, q, k, groups, scale, samples, block_rows, lse.detach(),
                              diagnostics if mechanism_diagnostics_on() else None)
        if self.call_dropout == 0.0:
            return FusedAttention(q, k, scale, None, aux_losses={"kl": kl}, diagnostics=diagnostics,
                                  library=LibraryForm("sdpa", blocks.run))
        return FusedAttention(q, k, scale, blocks.whole_bias(), aux_losses={"kl": kl}, diagnostics=diagnostics)

    sampler: ClassVar[str] = ""
    """The Triton kernel's sampler (modules/attention/triton_noisy_softmax.py SAMPLERS)."""

    def _noise_parameter(self) -> float:
        """The kernel's noise scale: 1/k (Weibull) or sigma (Lognormal)."""
        raise NotImplementedError

    def _takes_noisy_kernel(self, q: Tensor, k: Tensor) -> bool:
        """Whether a training call runs the Triton kernel that draws its noise inside (`_noisy_kernel_attention`):
        where the device policy takes the project's Triton kernels, without attention dropout (the kernel has none;
        SDPA's form keeps it), with q and k of one batch and head count, fewer than 2^31 (query, key) pairs a head
        (the noise's 32-bit counter), and unless a check holds the noise (`draw_noise` set on the kernel: the
        kernel's draw cannot be the held one)."""
        return (self.call_dropout == 0.0 and takes_triton_path(q) and "draw_noise" not in vars(self)
                and q.shape[:2] == k.shape[:2] and q.shape[-2] * k.shape[-2] < 2**31
                and _noisy_kernel_module() is not None)

    def _noisy_kernel_attention(self, q: Tensor, k: Tensor, groups: DenseGroups, scale: float) -> FusedAttention:
        """The sampled attention in one Triton kernel (path `triton-noisy-softmax`): the noise n_ij is drawn inside the
        kernel from a counter-based generator keyed by a seed drawn on the device from the run's noise stream
        (`noise_generator`), and regenerated by its backward, so no L x L tensor is ever written. The same forward
        pass gives what the closed-form KL needs (`_PairSums`: each row's logsumexp of the scores against the keys
        less their mean, and for the Lognormal the row's sum of those scores squared), with their gradients in the
        kernel's backward, so that the KL costs no pass of its own over q or k; `sample_tv`, where measured, is one
        more launch over q and k. The KL and `sample_tv` are filled in when the output is computed (`run`). Which
        uniforms or normals the kernel draws differs from torch's stream: the same distribution, not the eager
        path's numbers. gpu-perf's check holds the noise (`draw_noise`), which no in-kernel draw can follow: there
        the SDPA form runs, and tests/attention/test_bam_triton_interpreted.py checks this one (Triton's
        interpreter) against its own draw written out as a bias."""
        module = _noisy_kernel_module()
        aux: dict[str, Tensor] = {}
        diagnostics: dict[str, Tensor] = {}
        measure = mechanism_diagnostics_on()
        sampler, param = self.sampler, self._noise_parameter()

        def run(v: Tensor) -> Tensor:
            # below 2^31: the kernel keys each (sample, head) plane's stream by seed + plane * 2^32, one key per pair
            seed = torch.randint(0, 2**31, (1,), generator=self.noise_generator, device=q.device)
            key_mean = module.mean_key(k, groups.mask)
            inputs = (q, k, v)
            device = q.device.type
            if torch.is_autocast_enabled(device):  # in the autocast dtype, as SDPA would take them
                inputs = tuple(t.to(torch.get_autocast_dtype(device)) for t in inputs)
            out, centred_lse, squares, _, gap = module.noisy_softmax_attention(
                *inputs, key_mean, groups.mask, seed, scale, sampler, param, want_squares=self._kl_needs_squares(),
                want_gap=measure)
            if self.key_prior is None:  # the kernel's float32 row sums are all the KL reads: no float32 copy of q, k
                aux["kl"] = self._closed_kl(q, k, None, None, groups, scale, centred=(centred_lse, squares))
            else:
                with full_precision(q, k) as (precise_q, precise_k):
                    prior = self.prior_over_keys(precise_k, groups)
                    aux["kl"] = self._closed_kl(precise_q, precise_k, None, prior, groups, scale,
                                                centred=(centred_lse, squares))
            if measure:
                spread = module.row_spread(*inputs[:2], key_mean, groups.mask, seed, centred_lse, gap, scale, sampler,
                                           param)
                valid = groups.valid_queries
                if valid is None:
                    total, counted = spread.sum(), float(spread.numel())
                else:
                    total = (spread * valid).sum()
                    counted = valid.expand(spread.shape).sum().to(spread.dtype).clamp_min(1)
                diagnostics["sample_tv"] = (0.5 * total / counted).detach()
            return out

        return FusedAttention(q, k, scale, None, aux_losses=aux, diagnostics=diagnostics,
                              library=LibraryForm("triton-noisy-softmax", run, fits=lambda v: v.shape == k.shape))

    def _fused_rows(self, groups: Groups, q: Tensor, k: Tensor) -> int:
        """Queries per block of the fused path (FUSED_BLOCK_SIZE; `query_blocks` forces it in tests)."""
        pairs_mb = 4 * q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2] / 2**20
        budget_mb = FUSED_BLOCK_SIZE * 4 * q.shape[0] * q.shape[1] * q.shape[-2] * q.shape[-1] / 2**20
        if pairs_mb <= FUSED_WHOLE_MB:
            budget_mb = FUSED_WHOLE_MB  # one block unless `query_blocks` forces them
        return query_block_rows(self, groups, q, k, budget_mb=budget_mb) or q.shape[-2]

    def _fused_blocks(self, q: Tensor, k: Tensor, rows: int) -> tuple[int, int]:
        """(samples, queries) of a noisy block, holding what `rows` queries of every sample would: whole samples where
        that is at least one (each block then reads, and its backward writes, only its samples' keys and values, where
        a block of every sample's rows touches all of them), else that many rows of one sample. Rows as given where
        `query_blocks` forces them (tests) or off the CUDA path (the one block of the eager path's draw)."""
        batch, length = q.shape[0], q.shape[-2]
        if rows >= length or _forced_rows() is not None or not takes_cuda_path(q) or k.shape[0] != batch:
            return batch, rows
        samples = batch * rows // length
        return (samples, length) if samples >= 1 else (1, batch * rows)

    def _closed_kl(self, q: Tensor, k: Tensor, lse: Tensor | None, prior: tuple[Tensor, Tensor] | None,
                   groups: DenseGroups, scale: float, centred: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """`mean_kl` of the weights softmax(scale q k^T) without forming them (`_PairSums`), from the rows' logsumexp
        `lse`, or from `centred` (the Triton kernel's per-row sums, as `_PairSums` takes them)."""
        raise NotImplementedError

    def _kl_needs_squares(self) -> bool:
        """Whether `_closed_kl` sums (log w_ij)^2 (`_PairSums.squared_log_weights`)."""
        return False

    def _evaluated_sample_tv(self, mean: Tensor, groups: Groups) -> Tensor:
        """`sample_tv` where evaluation uses the mean weights: the distance one training draw would move them at these
        weights, so that the mechanism rule reads the noise at the evaluated weights. Drawn from a
        generator of its own, seeded the same at every call: the run's noise stream, hence every training number,
        stays as it was, and the value is the same at any point of a run for the same weights."""
        generator = torch.Generator(device=mean.device).manual_seed(_EVALUATION_DRAW_SEED)
        kept, self.noise_generator = self.noise_generator, generator
        try:
            with torch.no_grad():
                sample = groups.normalize(self.rsample(mean), zero_on_masked=True)
                spread = groups.sum_over_pairs((sample - mean).abs(), mean)
                return (0.5 * spread / groups.sum_over_pairs(mean, mean).clamp_min(1)).detach()
        finally:
            self.noise_generator = kept

    def _normalize(self, logits: Tensor, groups: Groups, k: Tensor) -> AttentionResult:
        mean, log_mean = groups.softmax_and_log(logits)
        draws = self.draws()
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
            if self.measures("sample_tv"):
                diagnostics["sample_tv"] = self._evaluated_sample_tv(mean, groups)
        diagnostics.update(standard_diagnostics(weights, groups, self))
        prior = self.prior_over_keys(k, groups) if self.key_prior is not None else None
        return AttentionResult(weights, {"kl": self.mean_kl(mean, log_mean, prior, groups)}, diagnostics)


@register_attention("bam-weibull")
class WeibullAttention(BayesianAttention):
    """BAM with Weibull attention weights and a Gamma prior (fixed or contextual); Fan et al. 2020."""

    Config = WeibullConfig
    softmax_limit = {"k": 1e8, "kl_weight": 0.0}
    softmax_limit_atol = 1e-6
    sampler = "weibull"

    def _noise_parameter(self) -> float:
        return 1.0 / self.config.k

    def rsample(self, mean: Tensor) -> Tensor:
        return weibull_rsample(mean, self.config.k, self.draw_noise(mean, "uniform"))

    def log_noise(self, mean: Tensor) -> Tensor:
        # S = mean * E^(1/k) / Gamma(1 + 1/k): the constant cancels in the normalisation
        # log(E) / k with E = -log U as two xlogy passes (the constant factor inside each, one pass each); U at
        # least tiny keeps log finite
        tiny = torch.finfo(mean.dtype).tiny
        if "draw_noise" in vars(self):  # a check's held noise
            uniform = self.draw_noise(mean, "uniform").clamp_min(tiny)
        else:
            # uniform_ on [tiny, 1) writes what rand then clamp_min(tiny) would (1 - tiny rounds to 1, and
            # x + tiny to x for every nonzero draw), from the same stream, in one pass
            uniform = torch.empty(mean.shape, dtype=mean.dtype, device=mean.device).uniform_(
                tiny, 1.0, generator=self.noise_generator)
        # each pass written over its input (out=, the same numbers): one [.., Lq, Lk] tensor at a time, not two
        torch.special.xlogy(-1.0, uniform, out=uniform)
        return torch.special.xlogy(1.0 / self.config.k, uniform, out=uniform)

    def _closed_kl(self, q, k, lse, prior, groups, scale, centred=None):
        c = self.config
        sums = _PairSums(q, k, lse, groups, scale, centred)
        pairs = sums.pairs
        log_gamma_k = math.lgamma(1.0 + 1.0 / c.k)
        sum_lam = sums.queries * math.exp(-log_gamma_k)
        if prior is None:
            sum_log_lam = sums.log_weights() - log_gamma_k * pairs
            total = weibull_gamma_kl_sum(
                c.k, c.beta, pairs, c.alpha * pairs, c.alpha * sum_log_lam, sum_lam, math.lgamma(c.alpha) * pairs
            )
            return total / pairs
        alpha = (c.beta * prior[0]).clamp_min(torch.finfo(prior[0].dtype).eps)
        sum_alpha = sums.per_key(alpha)
        sum_alpha_log_lam = sums.weighted_log_weights(alpha) - log_gamma_k * sum_alpha
        total = weibull_gamma_kl_sum(c.k, c.beta, pairs, sum_alpha, sum_alpha_log_lam, sum_lam, sums.per_key(torch.lgamma(alpha)))
        return total / pairs

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
    softmax_limit = {"sigma": 1e-8, "kl_weight": 0.0}
    softmax_limit_atol = 1e-6
    sampler = "lognormal"

    def _noise_parameter(self) -> float:
        return self.config.sigma

    def rsample(self, mean: Tensor) -> Tensor:
        return lognormal_rsample(mean, self.config.sigma, self.draw_noise(mean, "normal"))

    def log_noise(self, mean: Tensor) -> Tensor:
        # S = mean * exp(sigma * eps - sigma^2 / 2): the constant cancels in the normalisation
        if "draw_noise" in vars(self):  # a check's held noise
            return self.draw_noise(mean, "normal") * self.config.sigma
        # one pass: torch.normal scales the standard draw as it writes it (the same numbers as randn * sigma)
        return torch.normal(0.0, self.config.sigma, mean.shape, generator=self.noise_generator, dtype=mean.dtype,
                            device=mean.device)

    def _kl_needs_squares(self):
        return True

    def _closed_kl(self, q, k, lse, prior, groups, scale, centred=None):
        c = self.config
        sums = _PairSums(q, k, lse, groups, scale, centred)
        pairs = sums.pairs
        shift = 0.5 * c.sigma**2
        sum_sq_log, sum_log = sums.squared_log_weights(), sums.log_weights()
        if prior is None:
            mu0 = c.prior_mu
            gap = sum_sq_log - 2.0 * (shift + mu0) * sum_log + pairs * (shift + mu0) ** 2
        else:
            log_pi = prior[1]
            gap = (sum_sq_log - 2.0 * shift * sum_log - 2.0 * sums.weighted_log_weights(log_pi)
                   + sums.per_key((log_pi + shift).square()))
        return lognormal_kl_sum(c.sigma, c.prior_sigma, pairs, gap.clamp_min(0.0)) / pairs

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
