"""Alignment attention (Zhang et al. 2021, "Alignment Attention by Matching Key and Query Distributions").

The attention weights are plain softmax weights; what changes is an auxiliary regulariser, eq. (1):
loss = task loss + λ · L_align(Q, K), which matches the empirical distribution of the queries and that of the
keys within each head and each sample (p_Q = 1/w Σ δ_{q_i}, p_K = 1/w Σ δ_{k_j}). Three ways to compare them:

- `align-gan` (sec. 2.3.1, eq. 2): a discriminator D (highway network, then a two-layer MLP with leaky ReLU and
  a sigmoid) tells keys (label 1) from queries (label 0). The aux loss is D's binary cross-entropy on inputs
  that went through a gradient reversal layer, so one minimisation trains D and pushes the keys to fool it.
  The paper's eq. 2 moves both clouds; the authors' code detaches the queries, so only the keys receive the
  adversarial gradient: attnbench follows the code (version 3).
- `align-ot` (sec. 2.3.2, eq. 3): entropic optimal transport between p_Q and p_K solved by batched Sinkhorn
  iterations with ε = 0.01 and cost 1 − cos(q, k) (bounded, so ε means the same at any q/k scale); loss
  <π_ε, C>, differentiated with the plan held fixed.
- `align-ct` (sec. 2.3.3, eq. 4): bidirectional conditional transport. A navigator τ_φ gives
  π(k|q) ∝ p_K(k) exp(τ_φ(k)ᵀτ_φ(q)) and π(q|k) ∝ p_Q(q) exp(τ_φ(k)ᵀτ_φ(q)), with τ_φ on the unit sphere as
  in the authors' code (navigator_for in szhang42/alignment_attention, src/transformers/modeling_albert.py);
  a critic τ_η gives the cost c_η(q, k) = 1 − cos(τ_η(q), τ_η(k)); loss = ρ E_q E_{k~π(·|q)} c +
  (1 − ρ) E_k E_{q~π(·|k)} c (ρ = 1/2 in eq. 4). Q, K and φ minimise it; the critic η maximises it through
  gradient reversal.

Where: sec. 2.2 defines L_Align for self-attention ("we assume n = m = w"): the queries and keys of the same
tokens. The regulariser runs only at sites with `site.role == 'self'`; at cross-attention (caption -> image
grid) and pooling sites the kernel is plain softmax attention with no aux loss.

Point clouds: on DenseGroups one cloud per sample and head (the valid query tokens vs the valid key tokens); on
SegmentGroups (graphs) one cloud per head over the batch graph's nodes. Clouds larger than `max_points` are
subsampled (random in training, evenly spaced in eval) so the regulariser's cost is capped. The per-cloud losses
are averaged over samples and heads (the authors' code averages; the paper writes a sum over heads, which only
rescales λ), and over the layers that compute them (modules/lit/attention_terms.py; the authors' trainer
averages over the encoder's layers). The networks (discriminator, critic, navigator) act on head_dim-sized points and are shared by all
heads of a layer, as the paper does for the discriminator.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from annotated_types import Ge, Gt, Interval
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...device_policy import host_reads_are_cheap, takes_cuda_path, takes_triton_path
from .. import triton_alignment
from ..groups import DenseGroups, Groups
from ..kernel import (AttentionConfig, AttentionKernel, AttentionResult, FusedAttention, HeadShape, MechanismDiagnostic,
                      point_sets, qk_diagnostics, standard_diagnostics)
from ..registry import register_attention

# ---- shared pieces -------------------------------------------------------------------------------------


class GradientReversal(torch.autograd.Function):
    """Identity forward, negated gradient backward (Ganin & Lempitsky 2015): one loss, two adversaries."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.neg()


def reverse_gradient(x: Tensor) -> Tensor:
    return GradientReversal.apply(x)


class SampledRows(torch.autograd.Function):
    """x itself, for the fused kernel, and its rows `index` along dim -2, for the regulariser; the rows' gradient is
    added into the fused kernel's gradient of x in place. index_select's own backward writes a zero tensor of x's size,
    scatters the rows' gradient into it, and autograd then adds that to the fused kernel's gradient: two passes over
    a full-size gradient for max_points rows of L. The sum is the same (each sampled row gets kernel + regulariser,
    the indices being distinct), so results equal the index_select form's."""

    @staticmethod
    def forward(ctx, x: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(index)
        ctx.shape = x.shape
        return x.view_as(x), x.index_select(-2, index)

    @staticmethod
    def backward(ctx, grad: Tensor | None, grad_rows: Tensor | None) -> tuple[Tensor | None, None]:
        (index,) = ctx.saved_tensors
        if grad_rows is None:
            return grad, None
        if grad is None:
            return grad_rows.new_zeros(ctx.shape).index_add_(-2, index, grad_rows), None
        # In place only into a gradient no graph records (create_graph) and with no element aliased to another (an
        # expanded gradient): the fused kernel's gradient is a fresh tensor that nothing else reads.
        if torch.is_grad_enabled() or torch._debug_has_internal_overlap(grad) != 0:
            return grad.index_add(-2, index, grad_rows), None
        return grad.index_add_(-2, index, grad_rows), None


class Highway(nn.Module):
    """I = τ ⊙ ReLU(Φ_h x) + (1 − τ) ⊙ x with gate τ = σ(Φ_τ x) (sec. 2.3.1); Φ_τ and Φ_h share one matmul."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 2 * dim)

    def forward(self, x: Tensor) -> Tensor:
        gate, transform = self.proj(x).chunk(2, dim=-1)
        gate = torch.sigmoid(gate)
        return gate * F.relu(transform) + (1 - gate) * x


def highway_mlp(dim: int, hidden: int, out: int) -> nn.Sequential:
    """Highway then Φ2(LeakyReLU(Φ1 ·)): the paper's discriminator (out = 1) and critic (out = hidden)."""
    return nn.Sequential(Highway(dim), nn.Linear(dim, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, out))


@dataclass
class PointClouds:
    """Queries [C, n, d] and keys [C, m, d], one cloud pair per (sample, head); `*_valid` [C, n] / [C, m]
    (None = every point counts) and the uniform empirical masses over the valid points."""

    q: Tensor
    k: Tensor
    q_valid: Tensor | None
    k_valid: Tensor | None

    def masses(self) -> tuple[Tensor, Tensor]:
        return _uniform_mass(self.q, self.q_valid), _uniform_mass(self.k, self.k_valid)

    def pair_valid(self) -> Tensor | None:
        if self.q_valid is None and self.k_valid is None:
            return None
        qv = self.q_valid if self.q_valid is not None else torch.ones_like(self.q[..., 0], dtype=torch.bool)
        kv = self.k_valid if self.k_valid is not None else torch.ones_like(self.k[..., 0], dtype=torch.bool)
        return qv.unsqueeze(-1) & kv.unsqueeze(-2)


def _uniform_mass(points: Tensor, valid: Tensor | None) -> Tensor:
    if valid is None:
        # (torch.full, not points.new_full: the same fill, without the points as an argument, which the GPU cost
        # page counted as read)
        return torch.full(points.shape[:-1], 1.0 / points.shape[-2], dtype=points.dtype, device=points.device)
    valid = valid.to(points.dtype)
    count = valid.sum(-1, keepdim=True)
    # An empty cloud (a fully padded sample) gets uniform mass; its costs are zeroed, so it adds 0 to the loss.
    return torch.where(count > 0, valid / count.clamp_min(1), torch.full_like(valid, 1.0 / valid.shape[-1]))


def _joined(clouds: PointClouds) -> Tensor:
    """Queries then keys along the point axis: one pass through a shared network instead of two."""
    return torch.cat([clouds.q, clouds.k], dim=-2)


def _masked_mean(values: Tensor, valid: Tensor | None) -> Tensor:
    if valid is None:
        return values.mean()
    valid = valid.expand_as(values)
    return torch.where(valid, values, torch.zeros_like(values)).sum() / valid.sum().clamp_min(1)


def _subsample_index(n: int, max_points: int, training: bool, device: torch.device,
                     generator: torch.Generator | None = None) -> Tensor | None:
    if n <= max_points:
        return None
    if training:
        return torch.randperm(n, device=device, generator=generator)[:max_points]
    # Deterministic in eval so the logged alignment does not jitter between evaluations.
    return torch.linspace(0, n - 1, max_points, device=device).round().long()


def _cosine_cost(x: Tensor, y: Tensor) -> Tensor:
    return 1 - F.normalize(x, dim=-1) @ F.normalize(y, dim=-1).transpose(-1, -2)


# The authors' navigator_for adds this to the norm it divides by.
_NAVIGATOR_NORM_EPS = 1e-6

_SINKHORN_READ_EVERY = 30
"""Iterations between host reads of the convergence test (a multiple of its 10): at the default 50
iterations one read per solve instead of five; at most 20 iterations run past convergence, masked."""

# Below this ratio of largest cost to ε, exp(−C/ε) stays far from float64's underflow (about 1e-308).
_EXP_DOMAIN_LIMIT = 600.0


_TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""Cloud dtypes the Triton regularisers take (they compute in float32, align-ot's Sinkhorn in float64)."""

COST_BOUND = 2.0 * (1 + 1e-3)
"""Above every cost of align-ot, with a margin for rounding: the cosine cost is 1 - cos <= 2, the squared
Euclidean one is divided by its maximum (<= 1)."""


@torch.no_grad()
def sinkhorn_plan(cost: Tensor, a: Tensor, b: Tensor, eps: float, iterations: int, tol: float,
                  cost_bound: float | None = None) -> Tensor:
    """Entropic OT plans argmin <π, C> − ε H(π) s.t. π1 = a, πᵀ1 = b for a batch of costs [C, n, m].

    Written out rather than POT's `ot.solve_batch(method="sinkhorn")`, which multiplies full [C, n, m]
    matrices every iteration (here: batched matrix-vector products) and creates its scaling vectors on the
    CPU whatever the cost's device. Bounded costs (at most 2 here) let the exp-domain iterations run in float64
    (several times faster on CPU than the log-domain ones); beyond that range POT's log-domain solver takes over.
    A `cost_bound` known to be above every cost decides the domain without reading the largest cost on the
    host (which waits for the GPU) whenever the bound alone keeps within the exp-domain's range.
    """
    exp_domain_is_safe = cost_bound is not None and cost_bound / eps <= _EXP_DOMAIN_LIMIT
    if not exp_domain_is_safe and float(cost.max()) / eps > _EXP_DOMAIN_LIMIT:
        # Imported here: POT takes seconds to import and only this rare fallback needs it.
        try:
            import ot
        except ImportError as exc:
            raise ImportError(f"align-ot's log-domain Sinkhorn (cost/ε above {_EXP_DOMAIN_LIMIT:g}) needs POT: "
                              "pip install pot (a dependency of attnbench)") from exc
        result = ot.solve_batch(cost, eps, a, b, max_iter=iterations, tol=tol, method="log_sinkhorn", grad="detach")
        return result.plan
    kernel = torch.exp(-cost.double() / eps)
    # Row-vector products against contiguous matrices: several times faster than batched (n x m) @ (m x 1).
    kernel_t = kernel.transpose(-1, -2).contiguous()
    a, b = a.double(), b.double()
    # Start at 1 on the support of b only: a padded point (mass 0) would otherwise weigh in the first
    # u-update and, as the iterations stop before full convergence, leave its trace in the plan.
    v = (b > 0).to(b.dtype)
    # Convergence is tested every 10 iterations as before, on the device; the host reads the outcome only
    # every _SINKHORN_READ_EVERY iterations (each read waits for the GPU). Iterations after the converged
    # test leave u and v as they were, so the plan is bit-identical to stopping right at it.
    # Where host reads are not cheap (the CUDA path, and under torch.compile) nothing is read: every iteration runs,
    # those past convergence masked, so the plan is the same without a sync.
    reads = host_reads_are_cheap(cost)
    stopped: Tensor | None = None
    # v Kᵀ for the current v where the convergence test formed it: the next u-update's product, not formed twice
    # (the same product of the same tensors, so the iterates are as before, bit for bit)
    tested: Tensor | None = None
    for step in range(iterations):
        new_u = a / (tested if tested is not None else (v.unsqueeze(-2) @ kernel_t).squeeze(-2))
        tested = None
        u = new_u if stopped is None else torch.where(stopped, u, new_u)
        new_v = b / (u.unsqueeze(-2) @ kernel).squeeze(-2)
        v = new_v if stopped is None else torch.where(stopped, v, new_v)
        if step % 10 == 9:
            # After the v-update the columns match b exactly; stop once the rows match a too.
            tested = (v.unsqueeze(-2) @ kernel_t).squeeze(-2)
            rows = u * tested
            converged = (rows - a).abs().sum(-1).max() < tol
            stopped = converged if stopped is None else stopped | converged
        if (reads and stopped is not None and step % _SINKHORN_READ_EVERY == _SINKHORN_READ_EVERY - 1
                and step < iterations - 1 and bool(stopped)):
            break
    return (u.unsqueeze(-1) * kernel * v.unsqueeze(-2)).to(cost.dtype)


# ---- configs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlignmentConfig(AttentionConfig):
    weight: Annotated[float, Ge(0)] = 0.02
    """λ of eq. (1); each variant sets its own (see GANAlignmentConfig, OTAlignmentConfig, CTAlignmentConfig)."""
    max_points: Annotated[int, Ge(2)] = 64
    """Cap on the points per cloud (tokens per sample, nodes per graph); larger clouds are subsampled. 64 keeps
    the regulariser within half a softmax step on the dense (B=8, H=8, L=256) and Cora benchmarks (measured)."""
    hidden: Annotated[int, Ge(1)] = 16
    """Width of the discriminator / critic / navigator MLPs (16 in the authors' script)."""

    def __post_init__(self):
        if self.weight < 0:
            raise ValueError(f"weight must be >= 0, got {self.weight}")
        if self.max_points < 2:
            raise ValueError(f"max_points must be >= 2, got {self.max_points}")
        if self.hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {self.hidden}")

    def loss_weights(self, step: int) -> dict[str, float]:
        return {"align": float(self.weight)}

    @classmethod
    def suggest(cls, trial: Any) -> dict[str, Any]:
        return {"weight": trial.suggest_float("weight", 1e-3, 1.0, log=True)}


# Unweighted ‖∇ L_Align‖ / ‖∇ task loss‖ over the host's own parameters, summed over layers as the hosts did up to
# version 2 (they now average: divide by the layer count),
# steps 0-20 of real training (glue-rte 640 examples, 128 tokens; Cora full graph), measured for λ below:
#                 scratch text (2 layers)   MiniLM (6 layers)   Cora GAT (2 layers)
#   align-gan     0.07-0.10                  0.38-0.40           0.24-0.28
#   align-ot      1.5-2.4                    3.9-4.7             17-58
#   align-ct      0.13-0.42                  -                   0.005-0.04


@dataclass(frozen=True)
class GANAlignmentConfig(AlignmentConfig):
    weight: Annotated[float, Ge(0)] = 0.02
    """λ: the authors' published value, converted. run_glue_albert_mnil.sh (szhang42/alignment_attention) runs
    --adver_type gan --att_kl 0.01, and their trainer adds att_kl * L to the loss with L = BCE(real) + BCE(fake)
    (modeling_albert.py: d_loss = d_loss_real + d_loss_fake), twice our mean of the two: 0.02 here. Their L is
    averaged over layers, as the hosts here average the aux losses (version 3; version 2 summed them, L times
    their strength on an L-layer host). At 0.02, summed over layers as measured, the alignment gradient was
    0.1-0.2% of the task's on scratch text, 0.8% on MiniLM and 0.5% on Cora (table above); averaged, it is that
    divided by the number of layers: the published regulariser is a light one."""
    detach_queries: bool = True
    """Only the keys receive the adversarial gradient: the authors' code (szhang42/alignment_attention) detaches
    the queries before the discriminator, which still learns from both clouds. False: eq. 2 of the paper as
    written, where the reversed gradient moves queries and keys alike."""


@dataclass(frozen=True)
class OTAlignmentConfig(AlignmentConfig):
    weight: Annotated[float, Ge(0)] = 1e-3
    """λ: not published for OT (the authors' only script runs the GAN variant; training_args.py's att_kl
    default 1.0 is no tuned value). Chosen to give OT's alignment gradient the same share of the task gradient as
    align-gan's published setting on the text hosts, where the authors published it (table above: 0.02 x 0.09 /
    2.0 on scratch text, 0.02 x 0.39 / 4.3 on MiniLM, i.e. 1e-3 to 2e-3). A validation-only tune on Cora
    (`attnbench tune cora align-ot`, 100 epochs, 3 trials within this CPU budget) pointed the same way: val/loss
    1.123 at λ = 0.01 (ε = 0.01), 1.157 at 0.044 (ε = 0.027), 1.189 at 0.064 (ε = 0.012); one seed each, so
    weak evidence, but none for a larger λ."""
    eps: Annotated[float, Gt(0)] = 0.01
    """Entropic regularisation ε (sec. 2.3.2: 0.01), relative to costs in [0, 2] (cosine) or [0, 1] (scaled)."""
    cost: str = "cosine"
    """'cosine': 1 − cos(q, k); 'sqeuclidean': ‖q − k‖² divided by its (detached) maximum per cloud."""
    iterations: Annotated[int, Ge(1)] = 50
    """Most Sinkhorn iterations (the authors' code allows 100); stops earlier once the marginals match to `tol`.
    At ε = 0.01 on 64-point clouds, <π, C> after 50 iterations is within ~1% of its converged value (measured)."""
    tol: Annotated[float, Gt(0)] = 1e-4

    def __post_init__(self):
        super().__post_init__()
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if self.cost not in ("cosine", "sqeuclidean"):
            raise ValueError(f"cost must be 'cosine' or 'sqeuclidean', got {self.cost!r}")
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")

    @classmethod
    def suggest(cls, trial: Any) -> dict[str, Any]:
        return {**super().suggest(trial), "eps": trial.suggest_float("eps", 1e-3, 1e-1, log=True)}


@dataclass(frozen=True)
class CTAlignmentConfig(AlignmentConfig):
    weight: Annotated[float, Ge(0)] = 5e-3
    """λ: not published for CT (the authors' only script runs the GAN variant). Chosen as for align-ot: the share
    of the task gradient of align-gan's published setting on scratch text, 0.02 x 0.09 / 0.28 = 6e-3 (table
    above), rounded down to 5e-3. MiniLM's CT ratio was not measured within the CPU budget. A validation-only
    Cora tune (2 trials within the budget) gave val/loss 1.120 at λ = 0.01 and 1.123 at 0.044 (ρ = 0.72)."""
    rho: Annotated[float, Interval(ge=0, le=1)] = 0.5
    """Share of the query-to-key direction (eq. 4 weighs both by 1/2; the authors' --rho 0.5)."""

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.rho <= 1.0:
            raise ValueError(f"rho must lie in [0, 1], got {self.rho}")

    @classmethod
    def suggest(cls, trial: Any) -> dict[str, Any]:
        return {**super().suggest(trial), "rho": trial.suggest_float("rho", 0.0, 1.0)}


# ---- kernels -------------------------------------------------------------------------------------------


class AlignmentAttention(AttentionKernel):
    """Softmax attention plus a query/key distribution-matching regulariser (base of the align-* variants)."""

    Config: ClassVar[type[AttentionConfig]] = AlignmentConfig
    version: ClassVar[str] = "3"
    """3: the aux loss is averaged over the layers (was summed); the discriminator, critic and navigator train
    at the host's learning rate with its weight decay (were at the kernels' 1e-2, undecayed); align-gan's queries
    get no adversarial gradient (the authors' code).
    2: regulariser at self-attention sites only; align-ct's navigator on the unit sphere; λ per variant;
    padded query rows are read from the groups (cross-attention from padded caption tokens no longer counts
    them) and Sinkhorn starts on the keys' support (1 let zero-mass padded keys into its first step)."""
    softmax_limit: ClassVar[dict[str, Any]] = {"weight": 0.0}
    config: AlignmentConfig
    mechanism = (MechanismDiagnostic(
        "qk_distance", "relative sliced Wasserstein-1 distance between the query and key clouds per head (softmax reports it too)",
        rule="below-baseline", threshold=0.8, baseline="softmax", in_training=False,
        why="the query and key clouds' distance at the evaluated weights, as a ratio to softmax's at its evaluated "
            "weights, same seed: the regulariser's goal is clouds closer than the same host leaves them without it; "
            "0.8x is a gap well beyond the measure's spread over its fixed directions (<5%)"),)

    def mechanism_diagnostics(self, q: Tensor, k: Tensor, groups: Groups) -> dict[str, Tensor]:
        """The declared diagnostics this call reports (qk_distance; subclasses add their own)."""
        return qk_diagnostics(self, q, k, groups) if self.regularised else {}

    @property
    def regularised(self) -> bool:
        """The paper defines L_Align for self-attention only (queries and keys of the same w tokens, n = m):
        at cross-attention and pooling sites the kernel is plain softmax attention with no aux loss."""
        return self.site.role == "self"

    def aux_losses(self, q: Tensor, k: Tensor, groups: Groups) -> dict[str, Tensor]:
        return {"align": self.alignment_loss(self.point_clouds(q, k, groups))} if self.regularised else {}

    def normalize(self, logits: Tensor, groups: Groups, *, q: Tensor, k: Tensor) -> AttentionResult:
        weights = groups.softmax(logits)
        diagnostics = {**standard_diagnostics(weights, groups, self), **self.mechanism_diagnostics(q, k, groups)}
        return AttentionResult(weights, self.aux_losses(q, k, groups), diagnostics)

    def fused_attention(self, q: Tensor, k: Tensor, groups: Groups, *, scale: float) -> FusedAttention:
        # The weights are exactly softmax's, so the output can come from the fused kernel; only the
        # regulariser, which needs q and k alone, is computed here. On the CUDA path the fused kernel reads q and k
        # through `SampledRows`, so that the regulariser's gradient lands in the kernel's in place.
        aux_losses = {}
        if self.regularised:
            shared = takes_cuda_path(q) and isinstance(groups, DenseGroups)
            clouds, q, k = self._sample(q, k, groups, shared_gradients=shared)
            aux_losses = {"align": self.alignment_loss(clouds)}
        return FusedAttention(q, k, scale, aux_losses=aux_losses, diagnostics=self.mechanism_diagnostics(q, k, groups))

    def point_clouds(self, q: Tensor, k: Tensor, groups: Groups) -> PointClouds:
        """Queries and keys as per-(sample, head) point clouds, padding excluded, capped at max_points."""
        return self._sample(q, k, groups)[0]

    def _sample(self, q: Tensor, k: Tensor, groups: Groups, shared_gradients: bool = False) -> tuple[PointClouds, Tensor, Tensor]:
        """`point_clouds`, and q and k for the fused kernel: themselves, or with `shared_gradients` (dense groups only,
        whose clouds are [B*H, L, d]: each (sample, head) one cloud) read through `SampledRows`, which samples the rows
        of q itself (no reshape between the fused kernel's gradient and the in-place add) so that the subsample's
        gradient is added into the fused kernel's in place."""
        if shared_gradients:
            # Zero-width queries and keys: the validity masks of q's and k's clouds, without their points (whose
            # layout, [B*H, L, d], is q's own flattened: a copy where q's layout does not flatten, made only below,
            # where a cloud is read whole).
            _, _, q_valid, k_valid = groups.query_and_key_sets(q[..., :0], k[..., :0])
            sets_q, sets_k = q, k
        else:
            sets_q, sets_k, q_valid, k_valid = groups.query_and_key_sets(q, k)
        lq, lk = sets_q.shape[-2], sets_k.shape[-2]
        q_index = _subsample_index(lq, self.config.max_points, self.training, sets_q.device, self.noise_generator)
        # Self-attention: token i is query i and key i, so both clouds keep the same tokens.
        k_index = q_index if lk == lq else _subsample_index(lk, self.config.max_points, self.training, sets_k.device, self.noise_generator)
        if q_index is not None:
            if shared_gradients:
                q, rows = SampledRows.apply(q, q_index)
                sets_q = rows.flatten(0, 1)
            else:
                sets_q = sets_q.index_select(-2, q_index)
            q_valid = None if q_valid is None else q_valid.index_select(-1, q_index)
        elif shared_gradients:
            sets_q = q.flatten(0, 1)
        if k_index is not None:
            if shared_gradients:
                k, rows = SampledRows.apply(k, k_index)
                sets_k = rows.flatten(0, 1)
            else:
                sets_k = sets_k.index_select(-2, k_index)
            k_valid = None if k_valid is None else k_valid.index_select(-1, k_index)
        elif shared_gradients:
            sets_k = k.flatten(0, 1)
        return PointClouds(sets_q, sets_k, q_valid, k_valid), q, k

    def alignment_loss(self, clouds: PointClouds) -> Tensor:
        raise NotImplementedError

    def fused_loss_fits(self, clouds: PointClouds) -> bool:
        """Whether `alignment_loss` runs as the project's Triton kernel (triton_alignment): on the Triton path (a GPU),
        for clouds and networks one program holds on chip. Everywhere else the eager regulariser runs (the CPU's
        results, bit for bit)."""
        return (takes_triton_path(clouds.q) and clouds.q.dtype in _TRITON_DTYPES
                and triton_alignment.fits(clouds.q.shape[-2], clouds.k.shape[-2], clouds.q.shape[-1])
                and self.config.hidden <= triton_alignment.MAX_DIM)


@register_attention("align-gan")
class GANAlignmentAttention(AlignmentAttention):
    """Softmax attention + adversarial query/key alignment (highway discriminator, gradient reversal)."""

    Config = GANAlignmentConfig
    version: ClassVar[str] = "4"
    """4: the discriminator trains without the host's weight decay. Its loss reaches it scaled by λ / layers
    (0.01 on Cora's GAT), where GAT's L2 (5e-4, inside Adam) outweighed it 10-100x: the discriminator's weights
    shrank towards 0, its output went constant, and its loss sat at ln 2 from the first epochs (README, "align-gan
    on graphs"). The authors' AdamW has no weight decay by default (HF TrainingArguments: 0.0)."""
    undecayed: ClassVar[tuple[str, ...]] = ("discriminator",)
    mechanism = AlignmentAttention.mechanism + (MechanismDiagnostic(
        "disc_acc", "the discriminator's balanced accuracy (keys vs queries) over every valid query and key point",
        in_training=False,
        why="shown, not a rule: a discriminator that tells keys from queries (0.5 is chance) is the "
            "means, not the effect; the effect, clouds closer than softmax's, is the qk_distance rule (on paper-gat "
            "the discriminator learned while the distance stayed near softmax's: README, 'align-gan on graphs')"),)

    def __init__(self, config: GANAlignmentConfig, shape: HeadShape):
        super().__init__(config, shape)
        self.discriminator = highway_mlp(shape.head_dim, config.hidden, 1)
        self.discriminator.requires_grad_(self.regularised)  # unread at cross-attention: frozen there, for DDP (fenchel says why)

    def mechanism_diagnostics(self, q: Tensor, k: Tensor, groups: Groups) -> dict[str, Tensor]:
        out = super().mechanism_diagnostics(q, k, groups)
        if self.regularised and self.measures("disc_acc"):
            with torch.no_grad():
                # Every point, not the loss's subsample: no draw from the run's generator, and a steadier curve.
                cq, ck, q_valid, k_valid = point_sets(q.detach(), k.detach(), groups)
                logits = self.discriminator(torch.cat([cq, ck], dim=-2)).squeeze(-1)
                query_logits, key_logits = logits.split([cq.shape[-2], ck.shape[-2]], dim=-1)
                key_right = _masked_mean((key_logits > 0).to(logits.dtype), k_valid)
                query_right = _masked_mean((query_logits <= 0).to(logits.dtype), q_valid)
                out["disc_acc"] = (0.5 * (key_right + query_right)).detach()
        return out

    def alignment_loss(self, clouds: PointClouds) -> Tensor:
        if self.config.detach_queries:
            clouds = dataclasses.replace(clouds, q=clouds.q.detach())
        if self.fused_loss_fits(clouds):
            # The discriminator's forward and backward for every point in one launch each (its intermediates on chip)
            return triton_alignment.discriminator_loss(clouds.q, clouds.k, clouds.q_valid, clouds.k_valid,
                                                       self.discriminator)
        logits = self.discriminator(reverse_gradient(_joined(clouds))).squeeze(-1)
        query_logits, key_logits = logits.split([clouds.q.shape[-2], clouds.k.shape[-2]], dim=-1)
        key_bce = F.binary_cross_entropy_with_logits(key_logits, torch.ones_like(key_logits), reduction="none")
        query_bce = F.binary_cross_entropy_with_logits(query_logits, torch.zeros_like(query_logits), reduction="none")
        return 0.5 * (_masked_mean(key_bce, clouds.k_valid) + _masked_mean(query_bce, clouds.q_valid))


@register_attention("align-ot")
class OTAlignmentAttention(AlignmentAttention):
    """Softmax attention + entropic optimal transport (Sinkhorn) between the query and key clouds."""

    Config = OTAlignmentConfig

    def cost(self, clouds: PointClouds) -> Tensor:
        if self.config.cost == "cosine":
            cost = _cosine_cost(clouds.q, clouds.k)
        else:
            cost = torch.cdist(clouds.q, clouds.k).square()
            # Scale-free like the cosine cost, so one ε fits any q/k magnitude.
            cost = cost / cost.detach().amax((-2, -1), keepdim=True).clamp_min(torch.finfo(cost.dtype).tiny)
        pair_valid = clouds.pair_valid()
        return cost if pair_valid is None else cost.masked_fill(~pair_valid, 0.0)

    def transport_plan(self, cost: Tensor, clouds: PointClouds) -> Tensor:
        a, b = clouds.masses()
        return sinkhorn_plan(cost.detach(), a, b, self.config.eps, self.config.iterations, self.config.tol, cost_bound=COST_BOUND)

    def fused_loss_fits(self, clouds: PointClouds) -> bool:
        # the cosine cost in the exp domain only (the kernel's float64 iterations; the log-domain fallback stays eager)
        return (super().fused_loss_fits(clouds) and self.config.cost == "cosine"
                and COST_BOUND / self.config.eps <= _EXP_DOMAIN_LIMIT)

    def alignment_loss(self, clouds: PointClouds) -> Tensor:
        if self.fused_loss_fits(clouds):
            # The cost, the Sinkhorn solve and <π, C> per cloud on chip: one read of the clouds forward, one backward
            return triton_alignment.sinkhorn_loss(clouds.q, clouds.k, clouds.q_valid, clouds.k_valid, self.config.eps,
                                                  self.config.iterations, self.config.tol).mean()
        cost = self.cost(clouds)
        # The plan is held fixed: π_ε is the exact gradient of the entropic OT cost w.r.t. C (envelope theorem)
        # and that of <π_ε, C> up to the plan's O(ε) movement, without backpropagating through (and storing)
        # every Sinkhorn iterate.
        plan = self.transport_plan(cost, clouds)
        return (plan * cost).sum((-2, -1)).mean()


@register_attention("align-ct")
class CTAlignmentAttention(AlignmentAttention):
    """Softmax attention + bidirectional conditional transport between the query and key clouds."""

    Config = CTAlignmentConfig

    def __init__(self, config: CTAlignmentConfig, shape: HeadShape):
        super().__init__(config, shape)
        # Two layers with a ReLU, as the authors' navigator_for (se_linear5, ReLU, se_linear6 in modeling_albert.py).
        self.navigator = nn.Sequential(
            nn.Linear(shape.head_dim, self.config.hidden), nn.ReLU(), nn.Linear(self.config.hidden, self.config.hidden)
        )
        self.critic = highway_mlp(shape.head_dim, config.hidden, config.hidden)
        for unread in (self.navigator, self.critic):  # at cross-attention: frozen there, for DDP (fenchel says why)
            unread.requires_grad_(self.regularised)

    def critic_cost(self, clouds: PointClouds) -> Tensor:
        # Reversal outside the critic flips only the critic's gradients (it maximises the loss); the second
        # reversal at its input restores the sign for q and k, which minimise it.
        features = reverse_gradient(self.critic(reverse_gradient(_joined(clouds))))
        q, k = features.split([clouds.q.shape[-2], clouds.k.shape[-2]], dim=-2)
        return _cosine_cost(q, k)

    def navigator_log_affinity(self, clouds: PointClouds) -> Tensor:
        """τ_φ(k)ᵀτ_φ(q), the exponent of π(k|q) and π(q|k) in sec. 2.3.3, with τ_φ on the unit sphere as in the
        authors' navigator_for (x / (‖x‖ + 1e-6)); the affinity is then a cosine in [−1, 1], so the
        conditional transport stays spread out however large the navigator's raw outputs grow."""
        features = self.navigator(_joined(clouds))
        features = features / (features.norm(dim=-1, keepdim=True) + _NAVIGATOR_NORM_EPS)
        q, k = features.split([clouds.q.shape[-2], clouds.k.shape[-2]], dim=-2)
        return q @ k.transpose(-1, -2)

    def alignment_loss(self, clouds: PointClouds) -> Tensor:
        if self.fused_loss_fits(clouds):
            # The critic and the navigator per block of points, then the cost, the affinity and both plans per cloud,
            # each on chip: two launches each way instead of a pass per layer, softmax and gradient
            return triton_alignment.transport_loss(clouds.q, clouds.k, clouds.q_valid, clouds.k_valid, self.config.rho,
                                                   self.critic, self.navigator)
        cost = self.critic_cost(clouds)
        affinity = self.navigator_log_affinity(clouds)
        fill = torch.finfo(affinity.dtype).min
        # π(k|q) ∝ p_K(k) exp(−d): p_K is uniform over valid keys, so it only masks; same for π(q|k).
        key_mask = clouds.k_valid.unsqueeze(-2) if clouds.k_valid is not None else None
        query_mask = clouds.q_valid.unsqueeze(-1) if clouds.q_valid is not None else None
        forward_plan = (affinity if key_mask is None else affinity.masked_fill(~key_mask, fill)).softmax(-1)
        backward_plan = (affinity if query_mask is None else affinity.masked_fill(~query_mask, fill)).softmax(-2)
        a, b = clouds.masses()
        pair_valid = clouds.pair_valid()
        if pair_valid is not None:
            cost = cost.masked_fill(~pair_valid, 0.0)
        forward_ct = (a * (forward_plan * cost).sum(-1)).sum(-1)
        backward_ct = (b * (backward_plan * cost).sum(-2)).sum(-1)
        rho = self.config.rho
        return (rho * forward_ct + (1 - rho) * backward_ct).mean()
