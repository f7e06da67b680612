"""α-entmax attention: sparsemax (α = 2), 1.5-entmax, and α-entmax with a learned α per head.

The geometric view of attention (attention-geometric-view.txt, eq. 3) picks the weights as a regularised
argmax over the simplex, p* = argmax_{p ∈ Δ} <p, z> - Ω(p); Shannon negentropy gives softmax (eq. 4).
Tsallis' α-entropy, Ω_α(p) = (Σ_i p_i^α - 1) / (α(α - 1)), gives α-entmax (Peters, Niculae & Martins
2019, eq. 9-10; Blondel, Martins & Niculae 2020):

    p_i = [(α - 1) z_i - τ]_+ ^ (1 / (α - 1)),   τ the unique threshold with Σ_i p_i = 1,

which has exact zeros for α > 1, is sparsemax (the Euclidean projection onto the simplex, Martins &
Astudillo 2016) at α = 2 and tends to softmax as α → 1. `entmax` learns α per head as
α = 1 + sigmoid(a) ∈ (1, 2), initialised at 1.5 (Correia, Niculae & Martins 2019, adaptively sparse
transformers, section 3.2).

Names: `sparsemax` (α = 2) and `entmax15` (α = 1.5) fix α by their name; `entmax` learns it (and reduces
to softmax as α → 1, which the contract tests check on that name).

Solvers. Dense groups run the `entmax` package on the masked logits: its exact sort-based `sparsemax` and
`entmax15` at α = 2 and 1.5 (partially sorted, sized by the support seen in the previous call), and
`entmax_bisect` (differentiable in α) otherwise. Segment groups (graph attention) by default solve for τ
with Newton's method and segment sums (`segment_solver="newton"`, `GroupedEntmax`); `"pad"` pads every
destination's edges to a dense row and runs the package. On Cora's graph (13k edges, 8 heads, max
in-degree 169) padding inflates the work ~30-fold and ran 20-30x slower than Newton here, which takes
3-15 steps (measured).

Fused path. On CUDA, where the weights are not asked for, a fixed α (sparsemax, entmax15) runs
AdaSplash (Gonçalves et al. 2025, arXiv 2502.12082; PyPI `adasplash`), which finds τ per query block with
Halley-bisection inside a FlashAttention-style Triton kernel and never forms the L × L weights. It runs only
where its contract fits: no mask (it takes right-padding lengths and a causal flag, not an arbitrary boolean
mask, and deciding that a mask is plain right padding would cost a host read per call), queries and keys of
one length (any length: the lengths go to its kernels, on the device, where its unmasked tiles would not do), v
shaped as q, a head dimension of 16 to 256, no attention dropout. It runs AdaSplash's kernels without block mask
(`modules/attention/adasplash_full_length.py`): the block-mask version lists the blocks it computes with `nonzero`,
a host wait twice a call; without it every key block is scored (no block skipping), and nothing is read on the host.

AdaSplash takes one α for the call and returns no gradient for it, which the learned-α `entmax` trains: on CUDA,
under the same contract, `entmax` runs our own Triton kernel (modules/attention/triton_entmax.py: AdaSplash's design
with α per head and dα), and elsewhere (a mask) the package's `entmax_bisect` in query blocks (`block_weights_vs_q`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import entmax as entmax_package
from annotated_types import Ge, Interval
import torch
from torch import Tensor, nn

from ...device_policy import takes_cuda_path, takes_triton_path
from ..groups import DenseGroups, Groups
from ..kernel import (AttentionConfig, AttentionKernel, AttentionResult, FusedAttention, HeadShape, LibraryForm,
                      MechanismDiagnostic, full_precision,
                      standard_diagnostics, per_head)
from ..registry import register_attention

SEGMENT_SOLVERS = ("newton", "pad")

ADASPLASH_HEAD_DIMS = (16, 32, 64, 128, 256)
"""What AdaSplash's kernels tile (its forward asserts it)."""
ADASPLASH_STEPS = {2.0: 20, 1.5: 10}
"""Halley-bisection steps for τ, per α. AdaSplash's default is 10, which left sparsemax 2.9e-4 (relative) from the
exact map on peaked scores (score std 6.8, about 1.4 keys in the support; AdaSplash 0.2.2 under the Triton
interpreter, tests/attention/test_adasplash_interpreted.py); 15 steps gave 6.8e-6 and 20 steps 5.0e-6, fp32's
level. entmax15 was at 2.2e-6 from 5 steps on."""

_adasplash_reference = None


def adasplash_kernel(q: Tensor):
    """AdaSplash's non-causal attention without block mask, (q, k, v, alpha, niter) -> output, or None where it cannot
    run on q: not installed, or not where the device policy runs Triton kernels (`takes_triton_path`: a GPU, the
    interpreter, the cost page's count). A test may set a reference function (`use_adasplash_reference`) to exercise
    the path anywhere."""
    if _adasplash_reference is not None:
        return _adasplash_reference
    if not takes_triton_path(q):
        return None
    return adasplash_library()


def adasplash_library():
    """The library form itself wherever AdaSplash (and Triton) is installed, GPU or not (the Triton interpreter and the
    GPU cost page's launch count run it on CPU): `adasplash_full_length.full_length_adasplash`, or None."""
    try:
        import adasplash.adasplash_no_block_mask  # noqa: F401 - the kernels it launches
    except ImportError:
        return None
    from ..adasplash_full_length import full_length_adasplash

    return full_length_adasplash


def use_adasplash_reference(function) -> None:
    """Tests only: stand `function` in for AdaSplash (also on CPU); None restores the library."""
    global _adasplash_reference
    _adasplash_reference = function


_triton_entmax_reference = None

LEARNED_ALPHA_HEAD_DIMS = (1, 128)
"""Head dimensions the learned-α kernel takes (it pads d to a power of two from 16, masked). Up to 128: compiled for
sm_90, its backward's tiles at d = 256 took 164-230 KB of shared memory (bf16-float32 inputs), past what many cards
have; at 128, 82 KB (triton_entmax.NUM_STAGES)."""


def learned_alpha_kernel(q: Tensor):
    """The fused learned-α entmax attention (modules/attention/triton_entmax.py), (q, k, v, alpha [H], scale) ->
    output with gradients for q, k, v and α, or None where it cannot run on q: no Triton, or not where the device
    policy runs Triton kernels (`takes_triton_path`). A test may set a reference function (`use_learned_alpha_reference`)
    to take the path anywhere."""
    if _triton_entmax_reference is not None:
        return _triton_entmax_reference
    if not takes_triton_path(q):
        return None
    return learned_alpha_library()


def learned_alpha_library():
    """The Triton kernel itself wherever Triton is installed, GPU or not (the Triton interpreter and the cost page's
    launch count run it on CPU), or None."""
    from .. import triton_entmax

    return triton_entmax.learned_alpha_entmax_attention if triton_entmax.triton is not None else None


def use_learned_alpha_reference(function) -> None:
    """Tests only: stand `function` in for the learned-α kernel (also on CPU); None restores it."""
    global _triton_entmax_reference
    _triton_entmax_reference = function


NEWTON_STEP_CAP = 100
"""Newton stops once τ is converged: 3-15 steps for Cora-sized groups with score spreads 0.1-10 and
α in [1.1, 2], up to ~50 at α = 1.0001 (measured)."""

CONVERGENCE_CHECK_EVERY = 4
"""Newton steps between host reads of the convergence test: at most 3 steps past convergence (masked, so
results do not change) against one GPU stall per step."""


def default_solver_steps(dtype: torch.dtype) -> int:
    """Halvings of a bracket of width <= 1 that reach the dtype's resolution (the package's advice: 24
    suffice for float32), plus one."""
    return 53 if dtype == torch.float64 else 25


@dataclass(frozen=True)
class EntmaxConfig(AttentionConfig):
    alpha: Annotated[float, Interval(gt=1, le=2)] = 1.5
    """Tsallis α in (1, 2]: 2 = sparsemax, 1.5 = 1.5-entmax, → 1 = softmax. With learn_alpha, the initial
    α of every head (Correia et al. 2019 start at 1.5) and then it must lie below 2."""
    learn_alpha: bool = True
    """Learn α per head as 1 + sigmoid(a) (Correia et al. 2019)."""
    segment_solver: str = "newton"
    """How segment groups (graphs) find τ: 'newton' with segment sums, or 'pad' each destination's edges
    to a dense row and run the entmax package."""
    solver_steps: Annotated[int | None, Ge(1)] = None
    """Iterations of the τ solver: the package's bisection runs exactly this many; for Newton (segment
    solver 'newton') a cap, as it stops once τ is converged. None: 25 / 53 bisection steps in float32 /
    float64, at most NEWTON_STEP_CAP Newton steps."""

    def __post_init__(self):
        if not 1.0 < self.alpha <= 2.0:
            raise ValueError(f"alpha must lie in (1, 2] (2 = sparsemax, -> 1 = softmax), got {self.alpha}")
        if self.learn_alpha and self.alpha >= 2.0:
            raise ValueError("a learned alpha = 1 + sigmoid(a) lies in (1, 2): start it below 2")
        if self.segment_solver not in SEGMENT_SOLVERS:
            raise ValueError(f"segment_solver must be one of {SEGMENT_SOLVERS}, got {self.segment_solver!r}")
        if self.solver_steps is not None and self.solver_steps < 1:
            raise ValueError(f"solver_steps must be positive, got {self.solver_steps}")

    @classmethod
    def suggest(cls, trial: Any) -> dict[str, Any]:
        return {"alpha": trial.suggest_float("alpha", 1.1, 1.9)}



def nonnegative_pow(x: Tensor, exponent: Tensor | float) -> Tensor:
    """x ** exponent for x >= 0 (0 where x = 0): the common exponents without a pow; a per-head tensor
    exponent as exp(e·log x) with both arguments kept in the normal range, because torch.pow with a
    broadcast exponent, log(0) and exp underflowing to 0 each take ~5x longer on this CPU (measured)."""
    if not isinstance(exponent, Tensor):
        if exponent == 1.0:
            return x
        if exponent == 2.0:
            return x.square()
        if exponent == 0.5:
            return x.sqrt()
        return x.pow(exponent)
    tiny = torch.finfo(x.dtype).tiny
    # the margin keeps float rounding of the clamp from landing exp in the subnormal (slow) range
    powered = torch.exp((exponent * torch.log(x.clamp_min(tiny))).clamp_min(math.log(tiny) + 2.0))
    return powered.masked_fill(x <= 0, 0.0)


class GroupedEntmax(torch.autograd.Function):
    """α-entmax within every group of a `Groups` layout, solved for τ by Newton's method with group sums.

    Written here rather than taken from the package because the package needs every group on a dense row,
    which costs ~30x the work on a graph (padding to the max in-degree). With z' = (α-1) z and
    f(τ) = Σ_i [z'_i - τ]_+^(1/(α-1)) - 1, which is convex and decreasing for α <= 2, Newton steps from a
    point left of the root stay left of it and converge monotonically; we start at the Jensen bound
    τ0 = mean(z') - n^(1-α) <= τ* (exact for equal scores). At α = 2 the steps are Michelot's algorithm
    for the simplex projection, exact once the support stops changing; at α = 1.5 they converge
    quadratically. The backward pass is the package's: Jacobian diag(s) - s sᵀ/Σs with s = p^(2-α)
    (Peters et al. 2019, Prop. 2) and dp/dα (Correia et al. 2019, Prop. 1), with group sums. It runs a dozen
    group sums per call, which segment groups do as sparse products without autograd (`Groups.sums`).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, alpha: Tensor | float, groups: Groups, max_steps: int) -> Tensor:
        # Per-group values are kept compact (as `reduce` gives them) and broadcast back to the logits
        # layout (a view on dense rows, a gather on segments) where they meet per-key values or α.
        fixed_alpha = not isinstance(alpha, Tensor)
        scaled = groups.fill_invalid(logits * (alpha - 1.0), float("-inf"))
        power = 1.0 / (alpha - 1.0)
        count = groups.broadcast(groups.group_size(logits)).clamp_min(1.0)
        tau = groups.broadcast(groups.reduce(groups.zero_invalid(scaled), "sum")) / count - count ** (1.0 - alpha)
        # τ* >= max(z') - 1 too, much closer for sparse rows; only where a group max is cheap
        # (on segments it is a scatter costing several Newton steps).
        row_max = groups.max_if_cheap(scaled)
        if row_max is not None:
            tau = torch.maximum(tau, groups.broadcast(row_max) - 1.0)
        eps = torch.finfo(logits.dtype).eps
        tiny = torch.finfo(logits.dtype).tiny
        # Convergence is read on the host every CONVERGENCE_CHECK_EVERY steps only (each read makes the host
        # wait for the GPU). Steps after the one that converged are masked out on the device, so τ, and the
        # weights, are bit-identical to stopping right at it.
        stopped: Tensor | None = None
        for iteration in range(max_steps):
            gap = (scaled - tau).clamp_min(0.0)
            if fixed_alpha and power == 1.0:
                mass, slope = gap, (gap > 0).to(gap.dtype)
            elif fixed_alpha and power == 2.0:
                mass, slope = gap.square(), 2.0 * gap
            else:
                mass = nonnegative_pow(gap, power)
                slope = power * mass / gap.clamp_min(tiny)  # d/dτ of gap^power is -power·gap^power/gap
            total_mass, total_slope = groups.sums(mass, slope)
            step = groups.broadcast(((total_mass - 1.0) / total_slope.clamp_min(tiny)).clamp_min(0.0))
            tau = tau + step if stopped is None else torch.where(stopped, tau, tau + step)
            converged = ~(step > 4 * eps * (1.0 + tau.abs())).any()
            stopped = converged if stopped is None else stopped | converged
            if (iteration + 1) % CONVERGENCE_CHECK_EVERY == 0 and bool(stopped):
                break
        gap = (scaled - tau).clamp_min(0.0)
        probs = groups.zero_invalid(nonnegative_pow(gap, power))
        weights = probs / groups.broadcast(groups.reduce(probs, "sum")).clamp_min(tiny)
        ctx.groups = groups
        ctx.fixed_alpha = alpha if fixed_alpha else None
        ctx.save_for_backward(weights, *(() if fixed_alpha else (alpha,)))
        return weights

    @staticmethod
    def backward(ctx, grad_weights: Tensor):
        weights, *learned = ctx.saved_tensors
        groups: Groups = ctx.groups
        alpha = learned[0] if learned else ctx.fixed_alpha

        def total(x: Tensor) -> Tensor:
            return groups.broadcast(groups.reduce(x, "sum"))

        positive = weights > 0
        # s = 1 / g''(p) = p^(2-α) on the support
        s = torch.where(positive, nonnegative_pow(weights, 2.0 - alpha), 0.0)
        s_total = total(s).clamp_min(torch.finfo(s.dtype).tiny)
        grad_s = grad_weights * s
        grad_logits = grad_s - s * (total(grad_s) / s_total)
        grad_alpha = None
        if ctx.needs_input_grad[1]:
            plogp = weights * weights.clamp_min(torch.finfo(weights.dtype).tiny).log()
            skewed = s / s_total
            am1 = alpha - 1.0
            entropy_term = plogp - skewed * total(plogp)
            per_key = grad_weights * ((weights - skewed) / am1**2 - entropy_term / am1)
            grad_alpha = per_key.sum_to_size(alpha.shape)
        return grad_logits, grad_alpha, None, None


class SyncFreeSparsemax(entmax_package.activations.SparsemaxFunction):
    """The package's sparsemax with a backward that reads nothing on the host: it zeroes the gradient off the support
    with a masked fill where the package assigns through a boolean index (`grad[output == 0] = 0`), which on a GPU
    waits for the device to size the index. The same values bit for bit."""

    @classmethod
    def backward(cls, ctx, grad_output):
        supp_size, output = ctx.saved_tensors
        dim = ctx.dim
        grad_input = grad_output.masked_fill(output == 0, 0)
        v_hat = grad_input.sum(dim=dim) / supp_size.to(output.dtype).squeeze(dim)
        v_hat = v_hat.unsqueeze(dim)
        grad_input = torch.where(output != 0, grad_input - v_hat, grad_input)
        return grad_input, None, None


def sparsemax(x: Tensor, dim: int = -1, k: int | None = None) -> Tensor:
    """`entmax.sparsemax` (exact, sort-based; `k` as the package's partial sort) without a host read in its backward."""
    return SyncFreeSparsemax.apply(x, dim, k)


@register_attention("entmax", learn_alpha=True)
class EntmaxAttention(AttentionKernel):
    """α-entmax: Tsallis-regularised sparse attention with exact zeros (learned α per head for `entmax`)."""

    Config = EntmaxConfig
    scalar_knobs = ("alpha_logit",)
    mechanism = (
        MechanismDiagnostic(
            "support_fraction", "mean fraction of each query's keys with non-zero weight", rule="below", threshold=0.95,
            why="the share of each query's keys the evaluated attention keeps: softmax keeps all (1.0); at least 5% "
                "of the weights exactly zero is sparsity at work"),
        MechanismDiagnostic("alpha", "α of the entmax map, mean over heads (fixed for entmax15 and sparsemax)"),
    )
    """The learned α per head."""
    softmax_limit = {"alpha": 1.0001}
    """α → 1: p_i ∝ [1 + (α-1)(z_i - τ')]_+^{1/(α-1)} → exp(z_i - τ'), a relative error of about
    (α-1) z²/2, i.e. ~1e-4 for the contract test's logits."""
    softmax_limit_atol = 1e-3
    row_separable = True
    """Each query's τ comes from its own row; the diagnostics are means over queries. Where no fused kernel runs (a
    mask) a call on CUDA materialises the weights one block of queries at a time."""

    @property
    def block_weights_vs_q(self) -> float | None:
        """With a learned α, on CUDA, query blocks (`query_block_rows`) of at most a quarter of q's elements in one
        [B, H, rows, Lk] tensor: 16 queries at d = 64 in self-attention. The bisection and its backward keep about nine
        weight-sized tensors of the block alive, so the blocks add about 2.3x q's size to the call's own tensors (q,
        k, v, out, their gradients: SDPA's peak is about eight q's), within 1.5x SDPA's peak at every length (GPU cost
        page; at half q's elements, 32 queries, it was 1.56x). Each block is recomputed in the backward (checkpointing). A fixed α keeps the budget in MiB: its
        unmasked calls take AdaSplash, and its sort-based map keeps fewer temporaries."""
        return 0.25 if self.alpha_logit is not None else None

    def __init__(self, config: EntmaxConfig, shape: HeadShape):
        super().__init__(config, shape)
        if config.learn_alpha:
            # α = 1 + sigmoid(a) starts at config.alpha
            start = math.log((config.alpha - 1.0) / (2.0 - config.alpha))
            self.alpha_logit = nn.Parameter(torch.full((shape.num_heads,), start))
        else:
            self.alpha_logit = None
        self._support_seen: int | None = None

    def alpha(self) -> Tensor | float:
        """Per-head α [H] when learned, else the configured float."""
        if self.alpha_logit is None:
            return float(self.config.alpha)
        return 1.0 + torch.sigmoid(self.alpha_logit)

    def score(self, q: Tensor, k: Tensor, groups: Groups, *, scale: float) -> Tensor:
        # Scores in float32 at least: the support (and so the gradient) of a sparse map jumps with the
        # scores' rounding; bf16 scores gave sparsemax 4x softmax's gradient error on logits of std 3 (measured).
        with full_precision(q, k) as (precise_q, precise_k):
            return groups.scores(precise_q, precise_k, scale)

    def normalize(self, logits: Tensor, groups: Groups, *, q: Tensor, k: Tensor) -> AttentionResult:
        alpha = self.alpha()
        work_dtype = torch.promote_types(logits.dtype, torch.float32)  # sort-based thresholds need >= fp32
        x = logits.to(work_dtype)
        if isinstance(alpha, Tensor):
            alpha = alpha.to(work_dtype)
        if groups.rows_are_dense or self.config.segment_solver == "pad":
            weights = self._padded(x, groups, alpha)
        else:
            steps = self.config.solver_steps or NEWTON_STEP_CAP
            head_alpha = per_head(alpha, x) if isinstance(alpha, Tensor) else alpha
            weights = GroupedEntmax.apply(x, head_alpha, groups, steps)
        # the scores are float32 at least; the values (for the aggregation) are in q's dtype
        weights = weights.to(q.dtype if q is not None else logits.dtype)
        diagnostics = standard_diagnostics(weights, groups, self)
        if (self.alpha_logit is not None and not self.training) or self.measures("alpha"):
            diagnostics["alpha"] = alpha.detach().mean() if isinstance(alpha, Tensor) else weights.new_tensor(float(alpha))
        return AttentionResult(weights, diagnostics=diagnostics)

    def fused_attention(self, q: Tensor, k: Tensor, groups: Groups, *, scale: float) -> FusedAttention | None:
        """AdaSplash where its contract fits (module docstring), the learned-α kernel for `entmax`; None (the eager
        path) elsewhere."""
        if self.alpha_logit is not None:
            return self._learned_alpha_fused(q, k, groups, scale=scale)
        if not isinstance(groups, DenseGroups):
            return None
        if groups.mask is not None or groups.query_valid is not None:
            return None
        if q.shape != k.shape or q.shape[-1] not in ADASPLASH_HEAD_DIMS:
            return None
        library = adasplash_kernel(q)
        if library is None:
            return None
        alpha = float(self.config.alpha)
        # AdaSplash scales the scores by d^-1/2 itself: a kernel called with another scale hands it q rescaled
        rescale = scale * q.shape[-1] ** 0.5

        def run(v: Tensor) -> Tensor:
            device = q.device.type
            # not on autocast's lists: cast as SDPA would be, else bf16 autocast would run it in fp32
            dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else v.dtype
            scaled_q = q if rescale == 1.0 else q * rescale
            # every sequence has the full length: the wrapper passes it to the kernels on the device where their
            # unmasked tiles would not do (below 128 or off a power of two), and reads nothing on the host
            return library(scaled_q.to(dtype).contiguous(), k.to(dtype).contiguous(), v.to(dtype).contiguous(),
                           alpha=alpha, niter=ADASPLASH_STEPS.get(alpha, 20))

        return FusedAttention(None, None, scale, library=LibraryForm("adasplash", run, fits=lambda v: v.shape == q.shape))

    def _learned_alpha_fused(self, q: Tensor, k: Tensor, groups: Groups, *, scale: float) -> FusedAttention | None:
        """The learned-α kernel (modules/attention/triton_entmax.py) on the CUDA path: dense groups without a mask,
        queries and keys of one length, a head dimension up to 128, v shaped as q, no attention dropout."""
        if not isinstance(groups, DenseGroups) or groups.mask is not None or groups.query_valid is not None:
            return None
        if q.shape != k.shape or not LEARNED_ALPHA_HEAD_DIMS[0] <= q.shape[-1] <= LEARNED_ALPHA_HEAD_DIMS[1]:
            return None
        kernel = learned_alpha_kernel(q)
        if kernel is None:
            return None
        alpha = self.alpha()
        diagnostics = {}
        if not self.training or self.measures("alpha"):
            diagnostics["alpha"] = alpha.detach().mean()

        def run(v: Tensor) -> Tensor:
            device = q.device.type
            # not on autocast's lists: cast as SDPA would be (the kernel forms the scores in float32 whatever it is given)
            dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else v.dtype
            return kernel(q.to(dtype), k.to(dtype), v.to(dtype), alpha, scale)

        return FusedAttention(None, None, scale, diagnostics=diagnostics,
                              library=LibraryForm("triton-entmax", run, fits=lambda v: v.shape == q.shape))

    def _partial_sort_size(self, num_keys: int) -> int | None:
        """The package's `k`: sort only the top k scores (it retries with 2k for rows whose support fills
        k). A full sort of 256 keys costs ~2x a top-32 on this CPU (measured), and trained attention
        rows keep few keys, so k follows twice the largest support seen in the previous call."""
        if self._support_seen is None:
            return None
        k = max(16, 1 << (2 * self._support_seen - 1).bit_length())
        return None if k >= num_keys else k

    def _remember_support(self, weights: Tensor) -> None:
        with torch.no_grad():
            rows = weights.reshape(-1, weights.shape[-1])
            sample = rows[:: max(1, rows.shape[0] // 512)]  # a speed hint only: a few hundred rows suffice
            self._support_seen = int((sample > 0).sum(-1).max()) if sample.numel() else None

    def _padded(self, x: Tensor, groups: Groups, alpha: Tensor | float) -> Tensor:
        """The entmax package on each group as a dense row; -inf on masked or missing keys (the package
        gives them exactly 0), 0 on rows without any key (the package's threshold needs one finite entry)."""
        rows, unpad = groups.pad(x, float("-inf"))
        if groups.valid is not None or not groups.rows_are_dense:
            # fully masked rows, destinations without incoming edges
            rows = rows.masked_fill(torch.isneginf(rows).all(-1, keepdim=True), 0.0)
        if isinstance(alpha, Tensor):
            steps = self.config.solver_steps or default_solver_steps(x.dtype)
            out = entmax_package.entmax_bisect(rows, per_head(alpha, rows), dim=-1, n_iter=steps)
        elif alpha in (2.0, 1.5):
            sort_based = sparsemax if alpha == 2.0 else entmax_package.entmax15
            # The partial-sort hint is a CPU speed-up that costs two host reads per call (the hint itself, and
            # the package's check that k sufficed), each a GPU stall; off the CPU rows are sorted fully, which
            # gives the same weights (the threshold only reads the sorted prefix that holds the support). The device
            # policy decides, so that a CPU run "as on CUDA" sorts fully too.
            hinted = not takes_cuda_path(rows)
            out = sort_based(rows, dim=-1, k=self._partial_sort_size(rows.shape[-1]) if hinted else None)
            if hinted:
                self._remember_support(out)
        else:
            steps = self.config.solver_steps or default_solver_steps(x.dtype)
            out = entmax_package.entmax_bisect(rows, alpha, dim=-1, n_iter=steps)
        return unpad(out)


@register_attention("entmax15", alpha=1.5, learn_alpha=False)
class Entmax15Attention(EntmaxAttention):
    """1.5-entmax: Tsallis α = 1.5, sparse attention between softmax and sparsemax (Peters et al. 2019)."""


@register_attention("sparsemax", alpha=2.0, learn_alpha=False)
class SparsemaxAttention(EntmaxAttention):
    """Sparsemax: the Euclidean projection of the scores onto the simplex (Martins & Astudillo 2016)."""
