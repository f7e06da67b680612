"""Gaussian-mixture attention (Movellan & Gabbur, "Probabilistic Transformers").

Every key ξ_u is the query mean of a mixture unit u whose value mean is μ_u (eq. 6-9). A query's attention
weights are the unit posteriors and its output the posterior value estimate:

    w_u ∝ π_u exp(-α/2 ‖q - ξ_u‖²) exp(-β/2 ‖v_t - μ_u‖²)        (eq. 14)
    v_{t+1} = Σ_u w_u μ_u                                          (eq. 13)

Parameterisation chosen here (it must work on sequences and on graphs, where keys have no identity):
- α, the query precision, is learned per head (α = exp(log α)); `alpha_init` None = 1/√d, which with the
  magnitude prior below is exactly scaled dot-product attention.
- The unit log-prior is a function of the unit's own vectors (eq. 15, the "magnitude prior"):
  log π_u = ρ_h α/2 ‖ξ_u‖² + β/2 ‖μ_u‖² [+ ⟨c_h, ξ_u⟩]. ρ_h couples the prior to the key length: ρ = 1 is the
  Transformer (the ‖ξ_u‖² terms cancel, leaving α⟨q, ξ_u⟩), ρ = 0 a uniform prior over units (pure Gaussian
  distance, the paper's "general Gaussian form"); `prior="learned"` learns ρ_h from 1. The value-length link
  β/2 ‖μ_u‖² is always kept, so that EM started at v_0 = 0 gives the β-free weights of `normalize` and every
  later E-step is eq. 18's w_u ∝ exp(log-joint_u + β⟨v_t, μ_u⟩). The optional offset ⟨c_h, ξ_u⟩ (zero at init)
  is the only learned per-unit prior that exists on both layouts.
- β > 0 runs `iterations` (T) EM value steps after the β-free estimate v_1 = Σ w⁰ μ: T+1 E-steps in all, and
  the weights returned are the last E-step's. They need the values, which `forward` hands to `normalize`
  (`needs_values`); a host that calls `normalize` without v (the GAT host) gets the t=0 weights, i.e. β has
  no effect there.
- Inference-time adaptation (both off by default, applied in eval mode only unless `adapt_in_training`),
  `adapt_steps` EM steps whose E-step is the query-only posterior p(u | q) (eq. 23):
  keys, eq. 28-29: ξ_u ← γ/(α+γ) ξ_u⁰ + α/(α+γ) q̄_u, with q̄_u the responsibility-weighted mean of the
  queries that attend to u (the batch of queries = every valid query in the same sequence / graph: padded
  query rows do not count, so padding a batch changes nothing); a unit nobody attends keeps ξ_u⁰. Without prior adaptation the prior stays linked to the (adapted) key length, as in the
  paper's reading of Double Normalized Attention.
  priors, eq. 33-34: π_u ∝ w̄_u (1 + η_u), w̄_u = Σ_i w_u^i, with the Dirichlet η ∝ π⁰ (the paper) scaled so
  that η is the concentration of an average unit: η_u = η π⁰_u / mean_{u' in the query's key set} π⁰_u'
  (a per-query normaliser keeps dense and graph layouts equal; a uniform π⁰ gives η_u = η). The adapted π
  replaces the length-linked prior; π⁰ is the kernel's own unit prior (host logits stay a separate pair term).

On hosts that bring their own compatibility (GAT's edge logits, handed to `normalize` with the query and key
vectors q_i = a_dst ⊙ h_i and k_j = a_src ⊙ h_j) the host logits are an extra log-prior term per (query, unit)
pair and the Gaussian term is added on q (destination node) and ξ = k (source node): with ρ = 1 the total is
host + α⟨q_i, k_j⟩, GAT's softmax as α → 0. The kernel's own `score` is therefore zero (no compatibility besides the mixture), and `scale` is not
used: α is its learned replacement. All terms constant within a query's group (e.g. -α/2‖q‖²) are dropped.

Fast path: with β = 0 and no adaptation, dense groups with need_weights=False run through SDPA (see
`fused_attention`);
forward+backward at B=8, H=8, L=256, d=64 measured ~1.05x softmax with prior="magnitude" and ~1.3-1.45x with
the learned coupling, whose per-key bias makes SDPA work on head dim 65 (a float mask costs the same); on the CUDA
path q' and k' are padded to 72 for CUDA's memory-efficient kernel (v left at 64: `_fused_width`), and they and
their gradients are built by one autograd Function (`_PaddedMixtureForm`). Where the device policy runs the project's
Triton kernels (`takes_triton_path`: a CUDA tensor with Triton installed), without attention dropout and with at most a
key-padding mask, the key terms are formed in the score tiles of our own flash-style softmax kernel instead
(modules/attention/triton_softmax.py, path `triton-softmax`, `_triton_form`).
Dropout (in `forward`) applies to the final weights only, not to the EM / adaptation E-steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from annotated_types import Ge, Gt
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...device_policy import takes_cuda_path, takes_triton_path
from ..groups import DenseGroups, Groups
from ..kernel import (
    AttentionConfig,
    AttentionKernel,
    AttentionResult,
    FlexForm,
    FusedAttention,
    LibraryForm,
    flex_cpu_allowed,
    flex_wanted,
    HeadShape,
    full_precision,
    per_head,
    MechanismDiagnostic,
    standard_diagnostics,
)
from ..registry import register_attention

class _PaddedMixtureForm(torch.autograd.Function):
    """The fused form on the CUDA path in one pass each way: q' = [αq, 1, 0…] and k' = [ξ, t, 0…] of head width W,
    with t the per-key terms c_h ‖ξ‖² + e (c_h = (ρ-1) α_h/2, e the offset term or none), centred over each head's keys
    where `centred` (see `_fused_key_terms`). Forward: one multiply into q', one norm and one copy into k' (their
    other columns filled in place). Backward: dq = α dq'[:d], one multiply (which leaves dq contiguous, so the leaf
    takes it without a copy); dα from the trace of dk'[:d]ᵀ ξ, divided by α, which holds where q' and k' are used
    only through their products (as SDPA uses them), so that q is not kept; dk = dk'[:d] + 2 ∂t/∂‖ξ‖² ξ, one op (a
    view where t does not depend on ‖ξ‖²). Composed from autograd ops instead, the same form took a multiply, a
    concatenation and the padding of each tensor, and as many again in the backward (muls, narrow copies, adds).
    Equal to the composed form up to float rounding, with its roundings under autocast: α applied to q in float32
    and rounded once into q'. α on the keys' side instead (k' = [αξ, t, 0…], as this form had it) cost one more
    full-size multiply in the backward (α dk'[:d] and the leaf's copy of dq'[:d]) and was less accurate in
    bf16: gradients' errors from float64 through CPU bf16 SDPA, geometric means of 30 draws at q, k scales 1.5/1.5,
    1/3, 3/1, α's 1.3e-2 / 2.0e-2 / 2.0e-2 against 0.53e-2 / 1.3e-2 / 0.66e-2 now, the others' 8-38% lower now too."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, alpha: Tensor, coef: Tensor | None, extra: Tensor | None,
                centred: bool, width: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        dim = q.shape[-1]
        q_prime = q.new_empty((*q.shape[:-1], width), dtype=dtype)
        # α applied in q's precision (float32 under autocast) and rounded once into q', as the composed form's cast
        torch.mul(q, per_head(alpha, q), out=q_prime[..., :dim])
        q_prime[..., dim].fill_(1.0)
        q_prime[..., dim + 1:].zero_()
        precise = torch.promote_types(k.dtype, torch.float32)
        terms = torch.zeros((), dtype=precise, device=k.device)
        sq_norm = None
        if coef is not None:
            sq_norm = torch.linalg.vector_norm(k, dim=-1, dtype=precise).square()
            terms = per_head(coef, sq_norm).to(precise) * sq_norm
        if extra is not None:
            terms = terms + extra
        finite = None
        if centred:
            # padded keys may hold anything; none of them may move the centre to inf or nan
            finite = terms.isfinite()
            terms = terms - terms.nan_to_num(0.0, 0.0, 0.0).mean(-1, keepdim=True)
        k_prime = k.new_empty((*k.shape[:-1], width), dtype=dtype)
        k_prime[..., :dim].copy_(k)
        k_prime[..., dim].copy_(terms.to(dtype).expand(k.shape[:-1]))
        k_prime[..., dim + 1:].zero_()
        ctx.save_for_backward(k, alpha, coef, sq_norm, finite)
        ctx.dim, ctx.has_extra = dim, extra is not None
        return q_prime, k_prime

    @staticmethod
    def backward(ctx, grad_q: Tensor | None, grad_k: Tensor | None):
        k, alpha, coef, sq_norm, finite = ctx.saved_tensors
        dim = ctx.dim
        dq = dk = dalpha = dcoef = dextra = None
        if grad_q is not None and ctx.needs_input_grad[0]:
            dq = grad_q[..., :dim] * per_head(alpha, grad_q)
        if grad_k is None:
            return dq, dk, dalpha, dcoef, dextra, None, None, None
        grad_rows = grad_k[..., :dim]
        if ctx.needs_input_grad[2]:
            # q' and k' meet only in their products s_ij = α⟨q_i, ξ_j⟩ + t_j, so dk'_j[:d] = α Σ_i ∂s_ij q_i and
            # Σ_j dk'_j[:d] · ξ_j = α Σ_ij ∂s_ij ⟨q_i, ξ_j⟩ = α dα: read from ξ (saved anyway), q is not kept. Per
            # (sample, head) the trace of dk'[:d]ᵀ ξ [d x d], on ξ itself (in its precision).
            traced = torch.matmul(grad_rows.to(k.dtype).transpose(-1, -2), k).diagonal(dim1=-2, dim2=-1)
            dalpha = traced.sum(-1, dtype=alpha.dtype).sum(0) / alpha
        precise = torch.promote_types(grad_k.dtype, torch.float32)
        grad_terms = grad_k[..., dim].to(precise)
        if finite is not None:
            grad_terms = grad_terms - finite * grad_terms.mean(-1, keepdim=True)
        if ctx.has_extra and ctx.needs_input_grad[4]:
            dextra = grad_terms
        if coef is not None and ctx.needs_input_grad[3]:
            dcoef = (grad_terms * sq_norm).sum((0, 2)).to(coef.dtype)
        if ctx.needs_input_grad[1]:
            dk = grad_rows
            if coef is not None:
                # ∂(c ‖ξ‖²)/∂ξ = 2c ξ
                slope = (2 * per_head(coef, grad_terms).to(precise) * grad_terms).unsqueeze(-1)
                dk = torch.addcmul(dk, k, slope)
        return dq, dk, dalpha, dcoef, dextra, None, None, None


PRIORS = ("learned", "magnitude", "uniform")
FUSED_WIDTH_MULTIPLE = 8
"""The fused form's head width on the CUDA path is padded to a multiple of this (what SDPA's CUDA kernels tile)."""


@dataclass(frozen=True)
class GMMConfig(AttentionConfig):
    alpha_init: Annotated[float | None, Gt(0)] = None
    """Query precision α at initialisation; None: 1/√head_dim (scaled dot product)."""
    learn_precisions: bool = True
    """Learn α (and β when β > 0) per head (the paper's off-line learning of the precisions)."""
    prior: str = "learned"
    """Coupling ρ of the unit log-prior to the key length: 'magnitude' ρ=1 (eq. 15, the Transformer),
    'uniform' ρ=0 (Gaussian distance only), 'learned' ρ_h per head starting at 1."""
    prior_offset: bool = False
    """Add a learned linear log-prior ⟨c_h, ξ_u⟩ per head (zero at init)."""
    beta: Annotated[float, Ge(0)] = 0.0
    """Value precision β >= 0; β > 0 runs EM value iterations (eq. 13-14)."""
    iterations: Annotated[int, Ge(0)] = 1
    """T: EM value steps after the β-free estimate (only when β > 0)."""
    gamma: Annotated[float | None, Ge(0)] = None
    """Key adaptation (eq. 28): strength γ >= 0 of the Gaussian prior tying keys to their initial values; None = off."""
    eta: Annotated[float | None, Ge(0)] = None
    """Prior adaptation (eq. 33): Dirichlet concentration η >= 0 of an average unit; None = off."""
    adapt_steps: Annotated[int, Ge(1)] = 1
    """EM steps of inference-time adaptation."""
    adapt_in_training: bool = False
    """Adapt keys / priors in training mode too (the paper adapts at inference time only)."""

    def __post_init__(self):
        if self.alpha_init is not None and not self.alpha_init > 0:
            raise ValueError(f"alpha_init must be > 0, got {self.alpha_init}")
        if self.prior not in PRIORS:
            raise ValueError(f"prior must be one of {PRIORS}, got {self.prior!r}")
        if not self.beta >= 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if int(self.iterations) != self.iterations or self.iterations < 0:
            raise ValueError(f"iterations must be a non-negative integer, got {self.iterations}")
        if int(self.adapt_steps) != self.adapt_steps or self.adapt_steps < 1:
            raise ValueError(f"adapt_steps must be a positive integer, got {self.adapt_steps}")
        for name in ("gamma", "eta"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be >= 0 or None (off), got {value}")

    @classmethod
    def suggest(cls, trial: Any) -> dict[str, Any]:
        return {
            "alpha_init": trial.suggest_float("alpha_init", 0.05, 2.0, log=True),
            "prior": trial.suggest_categorical("prior", list(PRIORS)),
            "beta": trial.suggest_categorical("beta", [0.0, 0.01, 0.03, 0.1, 0.3, 1.0]),
            "iterations": trial.suggest_int("iterations", 1, 3),
            "gamma": trial.suggest_categorical("gamma", [None, 0.1, 1.0, 10.0]),
            "eta": trial.suggest_categorical("eta", [None, 0.1, 1.0, 10.0]),
        }



@register_attention("gmm")
class GaussianMixtureAttention(AttentionKernel):
    """Gaussian-mixture attention: unit posteriors with learned precisions and priors, EM value iterations."""

    Config = GMMConfig
    version = "2"
    """2: adaptation (γ, η) and the diagnostics sum over valid queries only (1 counted padded query rows)."""
    scalar_knobs = ("log_alpha", "log_beta", "coupling", "offset")
    # Shown, not ruled: a precision that stays put still leaves a Gaussian kernel, unlike softmax's score.
    mechanism = (MechanismDiagnostic("alpha", "the query precision α, mean over heads"),)
    """Precisions α and β, the prior coupling and the key offset."""
    needs_values = True
    softmax_limit = {
        "alpha_init": None,
        "beta": 0.0,
        "prior": "magnitude",
        "prior_offset": False,
        "gamma": None,
        "eta": None,
    }

    def __init__(self, config: GMMConfig, shape: HeadShape):
        super().__init__(config, shape)
        heads, dim = shape.num_heads, shape.head_dim
        alpha = config.alpha_init if config.alpha_init is not None else dim**-0.5
        self._register("log_alpha", torch.full((heads,), math.log(alpha)), config.learn_precisions)
        self.log_beta = None
        if config.beta > 0:
            self._register("log_beta", torch.full((heads,), math.log(config.beta)), config.learn_precisions)
        self.coupling = None
        if config.prior == "learned":
            self.coupling = nn.Parameter(torch.ones(heads))
        self.offset = nn.Parameter(torch.zeros(heads, dim)) if config.prior_offset else None

    def _register(self, name: str, value: Tensor, learned: bool) -> None:
        if learned:
            setattr(self, name, nn.Parameter(value))
        else:
            self.register_buffer(name, value)

    # ---- the mixture's terms --------------------------------------------------------------------
    @property
    def alpha(self) -> Tensor:
        return self.log_alpha.exp()

    @property
    def beta(self) -> Tensor | None:
        return None if self.log_beta is None else self.log_beta.exp()

    def _rho(self) -> Tensor | float:
        if self.coupling is not None:
            return self.coupling
        return 1.0 if self.config.prior == "magnitude" else 0.0

    def _offset_term(self, xi: Tensor) -> Tensor:
        # offset [H, d] against keys [B, H, Lk, d] or [Nk, H, d]: heads on dim 1, features last.
        offset = self.offset.view(1, self.shape.num_heads, *([1] * (xi.dim() - 3)), self.shape.head_dim)
        return (xi * offset).sum(-1)

    def _length_linked(self, xi: Tensor, rho: Tensor | float) -> Tensor:
        """ρ α/2 ‖ξ_u‖² per key, with ρ a per-head tensor or a constant."""
        sq_norm = xi.square().sum(-1)
        coef = self.alpha * rho / 2
        return per_head(coef, sq_norm) * sq_norm

    def _unit_log_prior(self, xi: Tensor) -> Tensor | None:
        """log π_u per key: the key-length link and the offset (the value link is handled by EM); None if 0."""
        rho = self._rho()
        terms = None if isinstance(rho, float) and rho == 0.0 else self._length_linked(xi, rho)
        if self.offset is not None:
            terms = self._offset_term(xi) if terms is None else terms + self._offset_term(xi)
        return terms

    def _key_terms(self, xi: Tensor) -> Tensor | None:
        """The per-key part of log π_u - α/2‖q - ξ_u‖² beside α⟨q, ξ_u⟩: (ρ-1) α/2 ‖ξ_u‖² + ⟨c, ξ_u⟩; None if 0."""
        rho = self._rho()
        terms = None if isinstance(rho, float) and rho == 1.0 else self._length_linked(xi, rho - 1)
        if self.offset is not None:
            terms = self._offset_term(xi) if terms is None else terms + self._offset_term(xi)
        return terms

    def _log_joint(self, host: Tensor | None, groups: Groups, q: Tensor, xi: Tensor, log_prior: Tensor | None = None) -> Tensor:
        """host + log π_u - α/2 ‖q - ξ_u‖², up to terms constant within each query's group.

        log_prior: an adapted prior in logits layout; None = the unit prior linked to ξ (eq. 15)."""
        joint = groups.scores(q * per_head(self.alpha, q), xi, 1.0)
        if log_prior is None:
            key_terms = self._key_terms(xi)
        else:
            key_terms = self._length_linked(xi, -1.0)
            joint = joint + log_prior
        if key_terms is not None:
            joint = joint + groups.per_key(key_terms)
        # A 0-d host (the kernel's own `score`) is constant within every group: no effect on the weights.
        return joint if host is None or host.dim() == 0 else joint + host

    def _runs_value_em(self) -> bool:
        return self.log_beta is not None and self.config.iterations > 0

    def _adapting(self) -> bool:
        wanted = self.config.gamma is not None or self.config.eta is not None
        return wanted and (not self.training or self.config.adapt_in_training)

    def _adapt(self, host: Tensor | None, groups: Groups, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Inference-time EM on the keys (eq. 28-29) and/or the unit priors (eq. 33-34); returns the adapted
        log-joint and keys."""
        gamma, eta = self.config.gamma, self.config.eta
        joint = self._log_joint(host, groups, q, k)
        xi, log_prior, log_concentration = k, None, None
        if eta is not None:
            prior0 = self._unit_log_prior(k)
            # η_u = η π⁰_u / mean of π⁰ over the query's key set; a uniform π⁰ gives a constant, which cancels.
            if prior0 is not None:
                relative = groups.softmax(groups.per_key(prior0)) * groups.count(joint)
                log_concentration = torch.log1p(eta * relative)
        tiny = torch.finfo(k.dtype).tiny
        for _ in range(self.config.adapt_steps):
            responsibilities = groups.softmax(joint)
            mass, weighted_queries = groups.sum_over_queries(responsibilities, q if gamma is not None else None)
            if gamma is not None:
                pull = per_head(self.alpha / (self.alpha + gamma), k)
                # (Σ_i w q_i - W ξ⁰) / W = q̄ - ξ⁰ where W > 0, and 0 (keep ξ⁰) for a unit nobody attends.
                key_mass = mass.unsqueeze(-1)
                xi = k + pull * (weighted_queries - key_mass * k) / key_mass.clamp_min(tiny)
            if eta is not None:
                log_prior = groups.per_key(mass.clamp_min(tiny).log())
                if log_concentration is not None:
                    log_prior = log_prior + log_concentration
            joint = self._log_joint(host, groups, q, xi, log_prior)
        return joint, xi

    def _value_iterations(self, joint: Tensor, weights: Tensor, groups: Groups, v: Tensor) -> tuple[Tensor, Tensor]:
        """EM on the value (eq. 13-14 with the value-length prior of eq. 15): returns the last weights and the
        step size ‖v_{T+1} - v_T‖ averaged over queries (a convergence diagnostic)."""
        beta_v = per_head(self.beta, v)
        estimate = groups.aggregate(weights, v)
        previous = estimate
        for _ in range(self.config.iterations):
            weights = groups.softmax(joint + groups.scores(estimate * beta_v, v, 1.0))
            previous, estimate = estimate, groups.aggregate(weights, v)
        return weights, groups.mean_over_queries((estimate - previous).norm(dim=-1))

    # ---- the kernel interface -------------------------------------------------------------------
    def score(self, q: Tensor, k: Tensor, groups: Groups, *, scale: float) -> Tensor:
        # No compatibility besides the mixture, which `normalize` forms from q and k (see the docstring):
        # a 0-d zero, constant within every group, so nothing is added.
        return q.new_zeros(())

    def normalize(self, logits: Tensor, groups: Groups, *, q: Tensor, k: Tensor, v: Tensor | None = None) -> AttentionResult:
        if self._adapting() or (v is not None and self._runs_value_em()):
            # EM iterations in float32 at least: in bf16 their gradient errors were 6-8x softmax's on logits
            # of std 3 (measured), as each step feeds rounded responsibilities into the next.
            with full_precision(logits, q, k, v) as precise:
                result = self._normalize(*precise, groups)
            result.weights = result.weights.to(q.dtype)
            return result
        return self._normalize(logits, q, k, v, groups)

    def _normalize(self, logits: Tensor, q: Tensor, k: Tensor, v: Tensor | None, groups: Groups) -> AttentionResult:
        diagnostics: dict[str, Tensor] = {}
        if self._adapting():
            joint, xi = self._adapt(logits, groups, q, k)
            if not self.training and self.config.gamma is not None:
                diagnostics["key_shift"] = groups.mean_over_keys((xi - k).detach().norm(dim=-1))
        else:
            joint = self._log_joint(logits, groups, q, k)
        weights = groups.softmax(joint)
        if v is not None and self._runs_value_em():
            weights, step = self._value_iterations(joint, weights, groups, v)
            if not self.training:
                diagnostics["em_step"] = step.detach()
        if not self.training or self.measures("alpha"):
            diagnostics["alpha"] = self.alpha.detach().mean()
            if self.coupling is not None and not self.training:
                diagnostics["prior_coupling"] = self.coupling.detach().mean()
        diagnostics.update(standard_diagnostics(weights, groups, self))
        return AttentionResult(weights, diagnostics=diagnostics)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, groups: Groups, *, scale: float | None = None,
                dropout_p: float = 0.0, need_weights: bool = True) -> tuple[Tensor, AttentionResult]:
        """The kernel's call; on the CUDA path the fused form's q' and k' are padded to a head width SDPA's fused
        kernels take (`_fused_width`); v is left as it is."""
        width = None if need_weights else self._fused_width(q, groups)
        if width is None:
            return super().forward(q, k, v, groups, scale=scale, dropout_p=dropout_p, need_weights=need_weights)
        self._padded_width = width
        try:
            return super().forward(q, k, v, groups, scale=scale, dropout_p=dropout_p, need_weights=False)
        finally:
            self._padded_width = None

    _padded_width: int | None = None

    def _fused_width(self, q: Tensor, groups: Groups) -> int | None:
        """The head width the fused form pads q' and k' to on the CUDA path, or None (no padding). q' and k' (the
        CPU's [αq, 1] and [ξ, key terms]; the CUDA path's [αq, 1, 0…] and [ξ, key terms, 0…], `_PaddedMixtureForm`)
        are one column wider than the head: CUDA's fused kernels need a multiple of 8, so a 64-wide head (65 with the
        column) ran SDPA's math path, which forms the weights. Zero columns change no dot product. v keeps its own
        width, so SDPA runs CUDA's memory-efficient kernel, which takes a v narrower than q and k; the flash kernel
        needs one width for all three. Padding v as well (to run flash, as this path did before) cost a padded copy
        of v, a wider output and its gradient, and a copy out of each: on the GPU cost page (B=32, H=12, d=64) peak
        live bytes 1.63x SDPA softmax's against 1.31x, bytes touched 2.71x against 2.18x. The price is speed per
        FLOP: on an H100 the memory-efficient kernel runs slower than flash at these widths (not measured for this
        form; the CPU's 'as on CUDA' run, a test path, takes SDPA's math path with a narrower v). Off the CUDA path
        nothing is padded, so CPU results stay as they were, bit for bit."""
        if not takes_cuda_path(q) or not groups.has_fused_attention or flex_wanted():
            return None
        if self._runs_value_em() or self._adapting() or not self._has_key_terms():
            return None
        return -(-(q.shape[-1] + 1) // FUSED_WIDTH_MULTIPLE) * FUSED_WIDTH_MULTIPLE

    def _has_key_terms(self) -> bool:
        """Whether `_key_terms` is not None (without computing it)."""
        rho = self._rho()
        return not (isinstance(rho, float) and rho == 1.0) or self.offset is not None

    def fused_attention(self, q: Tensor, k: Tensor, groups: Groups, *, scale: float) -> FusedAttention | None:
        """β = 0 without adaptation: α⟨q, ξ⟩ plus a per-key bias is a dot product of q' = [αq, 1] with
        k' = [ξ, bias], so the fused kernel runs it with the plain boolean mask (as fast as a float attn_mask
        holding the bias on this CPU, measured, and the mask stays boolean). On the CUDA path q' and k' are padded
        with zero columns to the width `forward` chose (`_fused_width`)."""
        if self._runs_value_em() or self._adapting():
            return None
        triton_form = self._triton_form(q, k, groups)
        if triton_form is not None:
            return triton_form
        flex = None
        if self._padded_width is not None and self._has_key_terms():
            # the CUDA path (`_fused_width`), where FlexAttention is not wanted
            scaled_q, k = self._padded_form(q, k, self._padded_width)
        else:
            key_terms = self._fused_key_terms(k)
            flex = self._flex_form(q, k, key_terms)
            scaled_q = q * per_head(self.alpha, q)
            if key_terms is not None:
                scaled_q = torch.cat([scaled_q, scaled_q.new_ones(scaled_q.shape[:-1]).unsqueeze(-1)], dim=-1)
                k = torch.cat([k, key_terms.unsqueeze(-1)], dim=-1)
        # α is a parameter read, as the eager path reports it
        diagnostics = {"alpha": self.alpha.detach().mean()} if not self.training or self.measures("alpha") else {}
        return FusedAttention(scaled_q, k, scale=1.0, flex=flex, diagnostics=diagnostics)

    def _triton_form(self, q: Tensor, k: Tensor, groups: Groups) -> FusedAttention | None:
        """The project's Triton softmax kernel (modules/attention/triton_softmax.py) where the device policy runs it
        (`takes_triton_path`): α⟨q, ξ⟩ + (ρ-1)α/2 ‖ξ‖² + ⟨c, ξ⟩ formed in each float32 score tile, so that no q', k'
        (nor their gradients) are built around SDPA. On the CUDA path the padded SDPA form (`_PaddedMixtureForm`)
        cost 2.0x SDPA softmax's bytes touched on the GPU cost page (B=32, H=12, L=512, d=64): each of its pads, αq,
        ‖ξ‖², dq, dk and dα a full-tensor pass. The per-key terms need no centring here (the scores are float32,
        not the fused kernel's bf16). Dense groups with no mask or a key-padding one, a head dimension the kernel
        takes, no attention dropout (the kernel has none: with dropout the SDPA form stays), no FlexAttention asked
        for, and key terms to form (without them α⟨q, ξ⟩ alone is SDPA's plain flash call); None elsewhere."""
        if not takes_triton_path(q) or self.call_dropout != 0.0 or flex_wanted() or not self._has_key_terms():
            return None
        if not isinstance(groups, DenseGroups) or q.shape[-1] != k.shape[-1]:
            return None
        mask = groups.mask
        if mask is not None and not (mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1):
            return None  # a mask per pair or per head (causal, windows): the SDPA form
        from .. import triton_softmax
        if triton_softmax.triton is None or not triton_softmax.HEAD_DIMS[0] <= q.shape[-1] <= triton_softmax.HEAD_DIMS[1]:
            return None
        alpha = self.alpha
        rho = self._rho()
        coef = None if isinstance(rho, float) and rho == 1.0 else alpha * (rho - 1) / 2
        extra = self._offset_term(k).float() if self.offset is not None else None
        key_valid = None if mask is None else mask[:, 0, 0, :]

        def run(v: Tensor) -> Tensor:
            device = v.device.type
            # not on autocast's lists: cast as SDPA would be (the kernel forms the scores in float32 whatever it is given)
            dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else v.dtype
            return triton_softmax.biased_softmax_attention(q.to(dtype), k.to(dtype), v.to(dtype), scale=1.0, a=alpha,
                                                           c=coef, e=extra, key_valid=key_valid)

        diagnostics = {"alpha": alpha.detach().mean()} if not self.training or self.measures("alpha") else {}
        return FusedAttention(None, None, 1.0, diagnostics=diagnostics,
                              library=LibraryForm("triton-softmax", run, fits=lambda v: v.shape == k.shape))

    def _padded_form(self, q: Tensor, k: Tensor, width: int) -> tuple[Tensor, Tensor]:
        """q' = [αq, 1, 0…] and k' = [ξ, key terms, 0…] of head width `width` (`_PaddedMixtureForm`): the key terms
        of `_fused_key_terms`, α on the queries' side, in the dtype SDPA will run in (autocast's where it is on)."""
        rho = self._rho()
        coef = None
        if not (isinstance(rho, float) and rho == 1.0):
            coef = self.alpha * (rho - 1) / 2
        extra = self._offset_term(k) if self.offset is not None else None
        device = k.device.type
        autocast = torch.is_autocast_enabled(device)
        dtype = torch.get_autocast_dtype(device) if autocast else torch.promote_types(q.dtype, k.dtype)
        reduced = k.dtype in (torch.bfloat16, torch.float16) or dtype in (torch.bfloat16, torch.float16)
        return _PaddedMixtureForm.apply(q, k, self.alpha, coef, extra, reduced, width, dtype)

    def _fused_key_terms(self, xi: Tensor) -> Tensor | None:
        """`_key_terms` for a fused kernel. Under bf16 or fp16 they are centred over each head's keys: a constant per
        (sample, head) leaves every row's softmax as it was, but the fused kernel holds the terms in that
        precision, and ρ's gradient sums them against per-key gradients that cancel over each row. Uncentred,
        gpu-perf's bf16 check of `gmm (prior_offset=True) causal` found ρ's gradient 4.0e-2 from fp32 where eager
        bf16's is 1.1e-2 (CPU autocast). The centre is not detached: its exact gradient is zero, and the backward
        through it takes each head's mean off the per-key gradients, so that ρ's gradient sums them against
        centred norms too (detached, it did not help: 2.2e-2 against eager's 0.9e-2 for `gmm causal`). Float32 and
        float64 stay as they were, bit for bit (the text hosts' CPU records ran them)."""
        terms = self._key_terms(xi)
        device = xi.device.type
        reduced = xi.dtype in (torch.bfloat16, torch.float16) or (
            torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) in (torch.bfloat16, torch.float16))
        if terms is None or not reduced:
            return terms
        # padded keys may hold anything; none of them may move the centre to inf or nan
        return terms - terms.nan_to_num(0.0, 0.0, 0.0).mean(-1, keepdim=True)

    def _flex_form(self, q: Tensor, k: Tensor, key_terms: Tensor | None) -> FlexForm | None:
        """`α[h]·s + (ρ-1)·α[h]/2·‖ξ‖² + ⟨c, ξ⟩` as a FlexAttention score_mod (ρ = 0: the issue's
        `α·s − α/2·‖k‖² + log π`; the ‖q‖² term cancels in the softmax). The per-key terms are one captured
        [B, H, Lk] tensor, so gradients reach the keys, α, ρ and c through it; α is captured as [H], never 0-d
        (pytorch #145208). Built only where it can run: CUDA, or a test that asks for it."""
        if not ((takes_cuda_path(q) and flex_wanted()) or flex_cpu_allowed()):
            return None
        alpha = self.alpha
        if key_terms is None:
            def score_mod(score, b, h, q_idx, kv_idx):
                return alpha[h] * score
        else:
            def score_mod(score, b, h, q_idx, kv_idx):
                return alpha[h] * score + key_terms[b, h, kv_idx]
        return FlexForm(q, k, 1.0, score_mod)
