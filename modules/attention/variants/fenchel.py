"""Attention as inference via Fenchel duality ("Attention as Inference via Fenchel Duality", ICLR 2022
submission; /work/shared/papers/fenchel-duality-attention.txt).

The paper reads attention as estimating the mean of an unknown distribution p over templates t_i from a
preference distribution u (the prior, eq. 23) and noisy evidence z about the mean shift (eq. 6). The
Fenchel dual (eq. 13) is

    max_λ  <λ, μ + z> - ||λ||² / (2α) - log Σ_i u_i exp<t_i, λ>,        μ = E_u[t],

and the weights are p_i ∝ u_i exp<t_i, λ*> (eq. 15-16). Two variants:

* `fenchel` (eq. 22): the small-α approximation λ* ≈ αz, i.e. weights ∝ u_i exp(α<t_i, z>) — softmax of
  α·logits + log u. α is the "reliability" of the evidence, fixed or learned per head; log u is a learned
  preference prior: T5's bidirectional relative-position buckets on sequences (eq. 23-24), a learned
  per-head multiple of the key's log degree on graphs, or uniform.
* `fenchel-exact` (eq. 13-16): λ* from a few differentiable Newton or fixed-point steps on the dual.

Units and mapping (one convention for both variants and every host):
- The logits handed to `normalize` are the first-order term <t_i, z>: on transformer hosts they are
  <q, k>/√d, i.e. templates t = k·d^(-1/4) and evidence z = q·d^(-1/4), so that α = 1 is exactly the
  standard 1/√d scaling (the paper's §8 uses α = 1 with templates absorbing d^(-1/2) the same way).
  `alpha` therefore multiplies the logits handed in: None/1.0 = unchanged (standard scaled dot product on
  transformers, GAT's own logits on graphs), < 1 = less reliable evidence, flatter weights.
- Writing λ = αz + δ, the dual's gradient is μ - E_p[t] - δ/α and p_i ∝ u_i exp(α·logit_i + <t_i, δ>),
  so z only enters through the logits. `fenchel-exact` therefore works on hosts whose logits are not dot
  products (GAT): the host's logits are the first-order term α<t, z> and the key features k (scaled by
  d^(-1/4)) are the templates of the correction <t_i, δ>.
- prior="position" (T5 buckets) applies only where the kernel's site is self-attention over one ordered
  sequence (`AttentionSite.sequence`: text tokens, caption tokens). Elsewhere it is the degree prior: on
  graphs the key's degree; on image grids, cross-attention and pooling every valid query sees every valid
  key, so the degree is the same for all keys and u is uniform, as the paper's §4.2 gives image templates.
  The degree of a key is the number of valid queries attending to it (on a symmetric graph with
  self-loops, as in GAT, that is its in-degree; `Groups.key_degree`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from annotated_types import Ge, Gt
import torch
from torch import Tensor, nn

from ..groups import Groups
from ..kernel import (
    AttentionConfig,
    AttentionKernel,
    AttentionResult,
    FusedAttention,
    HeadShape,
    per_head,
    standard_diagnostics,
)
from ..registry import register_attention

PRIORS = ("position", "degree", "uniform")
SOLVERS = ("newton", "fixed_point")


def t5_relative_position_bucket(
    relative_position: Tensor, *, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """T5's bucket of `relative_position` = key position - query position (Raffel et al. 2020; the
    function of the reference implementation): exact buckets for small distances, logarithmic ones up to
    `max_distance`, and in the bidirectional case the upper half of the buckets for keys after the query."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp_min(0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # clamp_min(1) only keeps log finite at distance 0, where the exact bucket is used anyway.
    log_ratio = torch.log(distance.clamp_min(1).float() / max_exact) / math.log(max_distance / max_exact)
    if_large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp_max(num_buckets - 1)
    return buckets + torch.where(is_small, distance, if_large)


def _second_moment(groups: Groups, weights: Tensor, templates: Tensor) -> Tensor:
    """E_p[t tᵀ] per query and head, [..., d, d]."""
    return groups.second_moment(weights, templates)



@dataclass(frozen=True)
class FenchelConfig(AttentionConfig):
    alpha: Annotated[float | None, Gt(0)] = None
    """Reliability α of the evidence, as a multiple of the logits handed in (None = 1.0: the standard
    1/√d scaling on transformers, GAT's logits unchanged on graphs)."""
    learn_alpha: bool = False
    """Learn α per head (initialised at `alpha`, kept positive through its log)."""
    prior: str = "position"
    """Preference prior log u: 'position' (T5 buckets at sequence self-attention sites, the degree prior
    elsewhere: uniform on image grids, cross-attention and pooling, §4.2), 'degree', 'uniform'."""
    num_buckets: Annotated[int, Ge(2)] = 32
    max_distance: Annotated[int, Ge(1)] = 128

    def __post_init__(self):
        if self.alpha is not None and not self.alpha > 0:
            raise ValueError(f"alpha must be positive, got {self.alpha}")
        if self.prior not in PRIORS:
            raise ValueError(f"prior must be one of {PRIORS}, got {self.prior!r}")
        if self.num_buckets < 2 or self.max_distance < 1:
            raise ValueError("num_buckets must be >= 2 and max_distance >= 1")

    @classmethod
    def suggest(cls, trial: Any) -> dict[str, Any]:
        return {
            "alpha": trial.suggest_float("alpha", 0.25, 4.0, log=True),
            "prior": trial.suggest_categorical("prior", list(PRIORS)),
        }


@register_attention("fenchel")
class FenchelAttention(AttentionKernel):
    """Fenchel-dual attention, eq. 22: softmax of α·logits + log u with a learned preference prior u."""

    Config = FenchelConfig
    version: ClassVar[str] = "2"
    """2: the position prior only at sequence self-attention sites (1 put it on every dense layout:
    image grids, cross-attention, pooling)."""
    softmax_limit: ClassVar[dict[str, Any]] = {"prior": "uniform", "alpha": 1.0, "learn_alpha": False}

    def __init__(self, config: FenchelConfig, shape: HeadShape):
        super().__init__(config, shape)
        alpha = 1.0 if config.alpha is None else float(config.alpha)
        heads = shape.num_heads
        if config.learn_alpha:
            self.log_alpha = nn.Parameter(torch.full((heads,), math.log(alpha)))
        else:
            self.register_buffer("log_alpha", torch.full((heads,), math.log(alpha)), persistent=False)
        self.fixed_alpha = None if config.learn_alpha else alpha
        # Zero-initialised so that the prior starts uniform (and dense and segment layouts agree).
        self.position_bias = nn.Embedding(config.num_buckets, heads) if config.prior == "position" else None
        if self.position_bias is not None:
            nn.init.zeros_(self.position_bias.weight)
        self.degree_weight = nn.Parameter(torch.zeros(heads)) if config.prior in ("position", "degree") else None
        self._bucket_cache: dict[tuple[int, int, torch.device], Tensor] = {}

    # ---- the preference prior log u -------------------------------------------------------------
    def alpha(self) -> Tensor:
        return self.log_alpha.exp()

    def _buckets(self, num_queries: int, num_keys: int, device: torch.device) -> Tensor:
        key = (num_queries, num_keys, device)
        if key not in self._bucket_cache:
            # Queries are the last `num_queries` positions (as DenseGroups' causal mask aligns them).
            query_pos = torch.arange(num_keys - num_queries, num_keys, device=device)
            key_pos = torch.arange(num_keys, device=device)
            self._bucket_cache[key] = t5_relative_position_bucket(
                key_pos[None, :] - query_pos[:, None],
                num_buckets=self.config.num_buckets,
                max_distance=self.config.max_distance,
            )
        return self._bucket_cache[key]

    def log_prior(self, logits: Tensor, groups: Groups) -> Tensor | None:
        """Unnormalised log u in a shape broadcastable to `logits` (None = uniform). Normalising it is
        left to the softmax: a constant shift within a group does not change u."""
        if self.position_bias is not None and self.site.sequence:
            # Relative positions exist only within one ordered sequence.
            buckets = self._buckets(logits.shape[-2], logits.shape[-1], logits.device)
            return self.position_bias(buckets).permute(2, 0, 1).to(logits.dtype)  # [H, Lq, Lk]
        if self.degree_weight is not None:
            degree = groups.key_degree()
            if degree is None:
                return None  # every key has the same degree: u is uniform
            log_degree = groups.per_key(degree.clamp_min(1).log().to(logits.dtype))
            return log_degree * per_head(self.degree_weight, logits).to(logits.dtype)
        return None

    def first_order_logits(self, logits: Tensor, groups: Groups) -> tuple[Tensor, Tensor | None]:
        """α·logits + log u (the exponent of eq. 22) and the log prior on its own."""
        bias = self.log_prior(logits, groups)
        if self.fixed_alpha != 1.0:
            logits = logits * per_head(self.alpha(), logits).to(logits.dtype)
        return (logits if bias is None else logits + bias), bias

    def prior_diagnostics(self, bias: Tensor | None, logits: Tensor, groups: Groups) -> dict[str, Tensor]:
        if self.training:
            return {}
        with torch.no_grad():
            out = {"alpha": self.alpha().mean().detach()}
            if bias is None:
                out["prior_std"] = torch.zeros((), dtype=logits.dtype, device=logits.device)
            else:
                bias = bias.expand_as(logits)
                centred = bias - groups.mean(bias)
                out["prior_std"] = groups.mean_over_queries(groups.reduce(centred * centred, "mean").sqrt()).detach()
            return out

    # ---- the kernel ------------------------------------------------------------------------------
    def normalize(self, logits: Tensor, groups: Groups, *, q: Tensor, k: Tensor) -> AttentionResult:
        exponent, bias = self.first_order_logits(logits, groups)
        weights = groups.softmax(exponent)
        diagnostics = {**standard_diagnostics(weights, groups, self), **self.prior_diagnostics(bias, logits, groups)}
        return AttentionResult(weights, diagnostics=diagnostics)

    def fused_attention(self, q: Tensor, k: Tensor, groups: Groups, *, scale: float) -> FusedAttention | None:
        # softmax(α·scale·<q,k> + log u) is the fused kernel with q scaled per head and an additive bias.
        if self.fixed_alpha != 1.0:
            q = q * per_head(self.alpha(), q).to(q.dtype)
        bias = self.log_prior(q.new_zeros(()).expand(*q.shape[:-1], k.shape[-2]), groups)
        return FusedAttention(q, k, scale, bias)


@dataclass(frozen=True)
class FenchelExactConfig(FenchelConfig):
    steps: Annotated[int, Ge(0)] = 5
    """Newton steps on the dual from λ = αz (at most: Newton stops once converged, usually after 2-4), or
    fixed-point iterations; 0 gives `fenchel`."""
    solver: str = "newton"
    """'newton' (Cholesky on the d×d Hessian per query and head: O(Lq·Lk·d²) per step, fine on graphs with
    d = 8, ~100x softmax on dense d = 64, measured) or 'fixed_point' (λ ← α(μ + z - E_p[t]): one attention
    pass per step, converges when α·||Cov_p(t)|| < 1; the better choice for wide heads)."""
    ridge: Annotated[float, Ge(0)] = 1e-6
    """Added to the negated Hessian's diagonal, relative to 1/α, against round-off in Cov_p(t)."""

    def __post_init__(self):
        super().__post_init__()
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {self.solver!r}")

    @classmethod
    def suggest(cls, trial: Any) -> dict[str, Any]:
        return {
            "alpha": trial.suggest_float("alpha", 0.25, 4.0, log=True),
            "steps": trial.suggest_int("steps", 1, 5),
        }


@register_attention("fenchel-exact")
class FenchelExactAttention(FenchelAttention):
    """Fenchel-dual attention, eq. 13-16: weights from λ* of the dual, solved by differentiable steps."""

    Config = FenchelExactConfig
    version: ClassVar[str] = "2"
    softmax_limit: ClassVar[dict[str, Any]] = {"prior": "uniform", "alpha": 1.0, "learn_alpha": False, "steps": 0}

    def fused_attention(self, q: Tensor, k: Tensor, groups: Groups, *, scale: float) -> FusedAttention | None:
        # Version 2: the fused first-order path of `fenchel` is exact only at steps=0; version 1 took it on
        # dense groups whenever weights were not requested, so it trained as plain `fenchel` there.
        return super().fused_attention(q, k, groups, scale=scale) if self.config.steps == 0 else None

    def templates(self, k: Tensor) -> Tensor:
        """t = k·d^(-1/4): with z = q·d^(-1/4), <t, z> is the standard scaled dot product."""
        return k * self.shape.head_dim ** -0.25

    def solve_dual(self, exponent: Tensor, groups: Groups, templates: Tensor, bias: Tensor | None, steps: int | None = None) -> Tensor:
        """δ = λ* - αz from δ = 0, per query and head ([B,H,Lq,d] or [N,H,d]); `exponent` is
        α·<t, z> + log u, the exponent at δ = 0. In δ the dual's gradient is μ - E_p[t] - δ/α and its
        negated Hessian I/α + Cov_p(t), p ∝ u·exp(α<t, z> + <t, δ>).

        fixed_point: `steps` unrolled maps δ ← α(μ - E_p[t]).
        newton: at most `steps` Newton steps, all but the last without autograd, stopping early once a
        step is below 10·√eps; the last step δ + H⁻¹·grad(δ) keeps the gradient only through grad (H is
        detached), so its Jacobian is the implicit-function-theorem derivative of the exact λ* — the
        same gradient as unrolling to convergence, at the cost of one step's backward."""
        steps = self.config.steps if steps is None else steps
        alpha = self.alpha().to(templates.dtype)
        prior = groups.softmax(exponent.new_zeros(()).expand_as(exponent) if bias is None else bias.expand_as(exponent))
        mu = groups.aggregate(prior, templates)
        delta = torch.zeros_like(mu)
        if steps == 0:
            return delta
        alpha_q = per_head(alpha, mu)

        def mean_at(delta: Tensor, exponent: Tensor, templates: Tensor) -> tuple[Tensor, Tensor]:
            weights = groups.softmax(exponent + groups.scores(delta, templates, 1.0))
            return weights, groups.aggregate(weights, templates)

        if self.config.solver == "fixed_point":
            for _ in range(steps):
                delta = alpha_q * (mu - mean_at(delta, exponent, templates)[1])
            return delta

        d = templates.shape[-1]
        tolerance = 10 * torch.finfo(templates.dtype).eps ** 0.5
        with torch.no_grad():
            exponent_, templates_, mu_, alpha_ = exponent.detach(), templates.detach(), mu.detach(), alpha_q.detach()
            diagonal = ((1.0 + self.config.ridge) / alpha_).unsqueeze(-1) * torch.eye(d, dtype=mu.dtype, device=mu.device)
            for step in range(steps):
                weights, mean = mean_at(delta, exponent_, templates_)
                second = _second_moment(groups, weights, templates_)
                # I/α + Cov_p(t) is SPD: Cholesky (batched LU fails on this CPU build, DESIGN.md §7).
                chol = torch.linalg.cholesky(diagonal + second - mean.unsqueeze(-1) * mean.unsqueeze(-2))
                if step == steps - 1:
                    break
                update = torch.cholesky_solve((mu_ - mean - delta / alpha_).unsqueeze(-1), chol).squeeze(-1)
                delta = delta + update
                if update.abs().max() <= tolerance:
                    break  # the Hessian one step back differs by O(update): negligible for the last step
        gradient = mu - mean_at(delta, exponent, templates)[1] - delta / alpha_q
        return delta + torch.cholesky_solve(gradient.unsqueeze(-1), chol).squeeze(-1)

    def normalize(self, logits: Tensor, groups: Groups, *, q: Tensor, k: Tensor) -> AttentionResult:
        exponent, bias = self.first_order_logits(logits, groups)
        if self.config.steps == 0:
            weights = groups.softmax(exponent)
            diagnostics = {**standard_diagnostics(weights, groups, self), **self.prior_diagnostics(bias, logits, groups)}
            return AttentionResult(weights, diagnostics=diagnostics)
        templates = self.templates(k)
        delta = self.solve_dual(exponent, groups, templates, bias)
        weights = groups.softmax(exponent + groups.scores(delta, templates, 1.0))
        diagnostics = {**standard_diagnostics(weights, groups, self), **self.prior_diagnostics(bias, logits, groups)}
        if not self.training:
            diagnostics.update(self._dual_diagnostics(delta, weights, exponent, groups, q))
        return AttentionResult(weights, diagnostics=diagnostics)

    def _dual_diagnostics(self, delta: Tensor, weights: Tensor, exponent: Tensor, groups: Groups, q: Tensor) -> dict[str, Tensor]:
        with torch.no_grad():
            first_order = groups.softmax(exponent)
            ratio = torch.where(weights > 0, weights.clamp_min(1e-30).log() - first_order.clamp_min(1e-30).log(), 0.0)
            out = {"kl_to_first_order": groups.mean_over_queries(groups.reduce(weights * ratio, "sum")).detach()}
            if q.shape == delta.shape:
                # The paper's ||λ* - αz|| / ||λ*|| (§8); meaningful where logits are <t, z> with z = q·d^(-1/4).
                lam_first = self.templates(q) * per_head(self.alpha(), q).to(q.dtype)
                gap = delta.norm(dim=-1) / (lam_first + delta).norm(dim=-1).clamp_min(1e-12)
                out["lambda_gap"] = groups.mean_over_queries(gap).detach()
            return out
