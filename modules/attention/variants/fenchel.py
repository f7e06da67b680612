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
* `fenchel-exact` (eq. 13-16): λ* from damped Newton on the dual (Armijo backtracking per query, to a gradient
  tolerance relative to the spread of each query's templates, under an iteration cap), differentiated by the
  implicit function theorem. Every forward reports the fraction of unconverged (query, head) pairs as the
  diagnostic `unconverged` and raises FenchelNotConverged above `max_unconverged` (default 0), so a run is
  never silently trained on wrong weights or gradients. Cost: one d×d Cholesky per query and head and step,
  O(Lk·d² + d³) per query (d = 8 on GAT, 32 in MiniLM); late steps run on the unconverged graph nodes only.
  Measured on Cora's GAT (one thread, softmax and this variant timed alternately): 6.3-6.9x softmax per
  epoch at initialisation and 6.8x after 60 epochs, against 5.5x and 6.9x for version 2's five undamped
  steps, which left queries unconverged; 1-3 full steps per solve.

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
from collections import OrderedDict
from dataclasses import dataclass
from typing import Annotated, Any, Callable, ClassVar, NamedTuple

from annotated_types import Ge, Gt, Interval
import torch
from torch import Tensor, nn

from ...device_policy import takes_cuda_path, takes_triton_path
from ..groups import DenseGroups, Groups, host_reads_are_cheap
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
    MechanismDiagnostic,
    full_precision,
    per_head,
    standard_diagnostics,
)
from ..registry import register_attention

PRIORS = ("position", "degree", "uniform")


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


def _put(full: Tensor, rows: Tensor | None, part: Tensor) -> None:
    """Write the loop's working rows back into the full per-query state (in place; all rows when None)."""
    if rows is None:
        full.copy_(part)
    else:
        full.index_copy_(0, rows, part)


def _negated_hessian_of(groups: Groups, outer: Tensor, diagonal: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
    """(weights, mean) -> I/α + Cov_p(t) = diagonal + E_p[t tᵀ] - mean meanᵀ per query and head, [..., d, d],
    for the per-key outer products `outer` = t tᵀ flattened ([..., d²], computed once per solve: the groups
    are rebuilt when the loop drops converged queries, the templates are not), aggregated by the groups'
    `weighted_sum_operator`, whose index structure they build once per call here."""
    d = diagonal.shape[-1]
    add_second_moment = groups.weighted_sum_operator(outer)

    def negated_hessian(weights: Tensor, mean: Tensor) -> Tensor:
        base = torch.addcmul(diagonal, mean.unsqueeze(-1), mean.unsqueeze(-2), value=-1)  # baddbmm: 3x slower
        return add_second_moment(weights, base.flatten(-2)).unflatten(-1, (d, d))

    return negated_hessian


BUCKET_TABLES = 8
"""How many bucket tables `bucket_table` keeps: one per (num_buckets, max_distance, device) in use, least recently
used dropped first."""
BUCKET_TABLE_MAX = 4096
"""The longest sequence whose table is kept (int64: 128 MiB at 4096); longer ones are computed per call."""
_bucket_tables: "OrderedDict[tuple[int, int, torch.device], Tensor]" = OrderedDict()


def bucket_table(num_buckets: int, max_distance: int, length: int, device: torch.device) -> Tensor:
    """[M, M] T5 buckets of (key - query) for positions 0..M-1, M >= length: every (Lq, Lk) with Lk <= M is its
    slice [Lk - Lq:Lk, :Lk]. Bounded: one table per (num_buckets, max_distance, device), shared by every kernel,
    at most BUCKET_TABLES of them (LRU), grown to the next power of two when a longer sequence comes (so its size
    is under 4x the longest sequence's L², int64), none kept past BUCKET_TABLE_MAX. Was a table per (Lq, Lk) per
    kernel, never dropped: 342 MB per kernel after lengths 1..512."""
    device = torch.device(device)
    key = (num_buckets, max_distance, device)
    table = _bucket_tables.get(key)
    if table is None or table.shape[0] < length:
        size = 1 << max(length - 1, 0).bit_length()
        keep = size <= BUCKET_TABLE_MAX
        with torch.inference_mode(False):  # a table built in inference mode must serve training forwards too
            n = size if keep else length
            # Entry (i, j) is the bucket of j - i, one of 2n - 1 relative positions: bucket those once and lay them out
            # as a Hankel view (entry (i', j) = relative position i' + j - (n - 1)) flipped over its rows, one [n, n]
            # write instead of the bucketing's dozen or so [n, n] passes; the same integers.
            relative = t5_relative_position_bucket(torch.arange(1 - n, n, device=device), num_buckets=num_buckets,
                                                   max_distance=max_distance)
            table = relative.as_strided((n, n), (1, 1)).flip(0)
        # a fake tensor (the GPU cost page counts under FakeTensorMode) is never kept: a real forward would read it
        if not keep or type(table) is not Tensor:
            return table
        _bucket_tables[key] = table
    _bucket_tables.move_to_end(key)
    while len(_bucket_tables) > BUCKET_TABLES:
        _bucket_tables.popitem(last=False)
    return table


_relative_bucket_lookups: "OrderedDict[tuple[int, int, torch.device], Tensor]" = OrderedDict()


def relative_buckets(num_buckets: int, max_distance: int, length: int, device: torch.device) -> Tensor:
    """int32 [2·length - 1]: the T5 bucket of each relative position key - query from 1 - length to length - 1, what
    the Triton kernel reads (triton_softmax.py) for the position prior; the integers of `t5_relative_position_bucket`,
    as `bucket_table` lays them out. One kept per (num_buckets, max_distance, device), grown to the next power of two,
    at most BUCKET_TABLES (LRU): a call then slices it instead of bucketing again; a fake tensor is never kept."""
    device = torch.device(device)
    key = (num_buckets, max_distance, device)
    lookup = _relative_bucket_lookups.get(key)
    if lookup is None or lookup.shape[0] < 2 * length - 1:
        size = 1 << max(length - 1, 0).bit_length()
        with torch.inference_mode(False):
            lookup = t5_relative_position_bucket(torch.arange(1 - size, size, device=device), num_buckets=num_buckets,
                                                 max_distance=max_distance).to(torch.int32)
        if type(lookup) is not Tensor:
            return lookup[size - length:size + length - 1]
        _relative_bucket_lookups[key] = lookup
    _relative_bucket_lookups.move_to_end(key)
    while len(_relative_bucket_lookups) > BUCKET_TABLES:
        _relative_bucket_lookups.popitem(last=False)
    middle = (lookup.shape[0] - 1) // 2
    return lookup[middle - (length - 1):middle + length]


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
    version: ClassVar[str] = "3"
    """3: the position-bias table trains with the host (its learning rate and weight decay), as a sub-network;
    log α and the degree coupling stay scalar knobs at the kernels' rate (were all at 1e-2, undecayed).
    2: the position prior only at sequence self-attention sites (1 put it on every dense layout:
    image grids, cross-attention, pooling)."""
    scalar_knobs = ("log_alpha", "degree_weight")
    pair_mask_parameters: ClassVar[tuple[str, ...]] = ("degree_weight",)
    """Parameters read only where keys have different degrees: graphs, and dense layouts given a per-pair mask
    [B, 1, Lq, Lk] (causal, sliding windows). Under a key-padding mask or none every key of a sample has the same
    degree and the degree prior is uniform, so a host that knows a layer gets no per-pair mask (the Hugging Face
    door, at a layer that is not causal) freezes them there, for DistributedDataParallel's default settings."""
    """The reliability α and the degree prior's coupling; the position-bias table is a sub-network (host rate)."""
    softmax_limit: ClassVar[dict[str, Any]] = {"prior": "uniform", "alpha": 1.0, "learn_alpha": False}
    mechanism = (
        MechanismDiagnostic(
            "prior_tv", "mean total-variation distance between softmax(α·logits + log u) and the prior-free "
            "softmax(α·logits)", rule="above", threshold=0.01,
            why="the share of each query's attention mass the learned prior moves, at the evaluated weights: it "
                "starts uniform (0), and a prior that moves under 1% of each query's weight has not learned a "
                "preference"),
        MechanismDiagnostic(
            "alpha", "the reliability α, mean over heads", rule="moved", threshold=0.05,
            why="α at the evaluated weights against the first epoch's, relative: a learned α that moved by under 5% "
                "changed the logits' sharpness, hence every query's weights, by as little (a fixed α never moves: "
                "the prior alone then decides)"),
    )

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
        # A parameter this site never reads is frozen, so that DistributedDataParallel does not wait for its gradient
        # (it fails on the second step otherwise): the position table away from token sequences, the degree coupling
        # where the position prior applies. Nothing that is read changes.
        if self.position_bias is not None and not shape.site.sequence:
            self.position_bias.weight.requires_grad_(False)
        if self.position_bias is not None and self.degree_weight is not None and shape.site.sequence:
            self.degree_weight.requires_grad_(False)

    # ---- the preference prior log u -------------------------------------------------------------
    def alpha(self) -> Tensor:
        return self.log_alpha.exp()

    def _buckets(self, num_queries: int, num_keys: int, device: torch.device) -> Tensor:
        """[Lq, Lk] T5 buckets of key - query positions, queries the last `num_queries` positions (as DenseGroups'
        causal mask aligns them): a slice of one shared table (`bucket_table`), never a table per length."""
        return bucket_table(self.config.num_buckets, self.config.max_distance, num_keys, device)[num_keys - num_queries:num_keys, :num_keys]

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
            return self._prior_mechanism(bias, logits, groups)
        with torch.no_grad():
            out = {"alpha": self.alpha().mean().detach(), **self._prior_mechanism(bias, logits, groups)}
            if bias is None:
                out["prior_std"] = torch.zeros((), dtype=logits.dtype, device=logits.device)
            else:
                bias = bias.expand_as(logits)
                centred = bias - groups.mean(bias)
                out["prior_std"] = groups.mean_over_queries(groups.reduce(centred * centred, "mean").sqrt()).detach()
            return out

    def _prior_mechanism(self, bias: Tensor | None, logits: Tensor, groups: Groups) -> dict[str, Tensor]:
        out = {}
        with torch.no_grad():
            if self.measures("alpha"):
                out["alpha"] = self.alpha().mean().detach()
            if self.measures("prior_tv"):
                if bias is None:
                    out["prior_tv"] = torch.zeros((), dtype=logits.dtype, device=logits.device)
                else:
                    tempered = logits if self.fixed_alpha == 1.0 else logits * per_head(self.alpha(), logits).to(logits.dtype)
                    gap = (groups.softmax(tempered + bias) - groups.softmax(tempered)).abs()
                    out["prior_tv"] = (0.5 * groups.mean_over_queries(groups.reduce(groups.zero_invalid(gap), "sum"))).detach()
        return out

    # ---- the kernel ------------------------------------------------------------------------------
    def normalize(self, logits: Tensor, groups: Groups, *, q: Tensor, k: Tensor) -> AttentionResult:
        exponent, bias = self.first_order_logits(logits, groups)
        weights = groups.softmax(exponent)
        diagnostics = {**standard_diagnostics(weights, groups, self), **self.prior_diagnostics(bias, logits, groups)}
        return AttentionResult(weights, diagnostics=diagnostics)

    def fused_attention(self, q: Tensor, k: Tensor, groups: Groups, *, scale: float) -> FusedAttention | None:
        # softmax(α·scale·<q,k> + log u) is the fused kernel with q scaled per head and an additive bias.
        triton_form = self._triton_form(q, k, groups, scale)
        if triton_form is not None:
            return triton_form
        flex = self._flex_form(q, k, groups, scale)
        raw_q = q
        if self.fixed_alpha != 1.0:
            q = q * per_head(self.alpha(), q).to(q.dtype)
        bias = self.log_prior(raw_q.new_zeros(()).expand(*raw_q.shape[:-1], k.shape[-2]), groups)
        # α is a parameter read: the fused path keeps that curve; prior_tv needs the weights (eager calls only)
        diagnostics = {"alpha": self.alpha().mean().detach()} if self.measures("alpha") else {}
        blocks = self._bias_gradient_blocks(q, k, bias, groups) if flex is None else None
        if blocks is not None:
            chunked = _BiasGradientBlocks(q, k, bias, groups, scale, *blocks)
            return FusedAttention(q, k, scale, bias, diagnostics=diagnostics, library=LibraryForm("sdpa", chunked.run))
        return FusedAttention(q, k, scale, bias, flex=flex, diagnostics=diagnostics)

    def _triton_form(self, q: Tensor, k: Tensor, groups: Groups, scale: float) -> FusedAttention | None:
        """The project's Triton softmax kernel (modules/attention/triton_softmax.py) where the device policy runs it
        (`takes_triton_path`): α per head and the position prior's bucket table read in each score tile, their
        gradients summed out of the tiles. Through SDPA the prior is an [H, Lq, Lk] float bias that needs a gradient,
        which CUDA's memory-efficient kernel writes at [B, H, Lq, Lk] for autograd to sum (3.0x SDPA softmax's bytes
        touched on the GPU cost page at B=32, H=12, L=512, d=64, 8.7x at L=2048), and α·q is a full-tensor pass each
        way. Dense groups with no mask or a key-padding one (under which the degree prior is uniform), a head
        dimension the kernel takes, no attention dropout (the kernel has none: with dropout the SDPA form stays), no
        FlexAttention asked for; None elsewhere."""
        if not takes_triton_path(q) or self.call_dropout != 0.0 or flex_wanted():
            return None
        if not isinstance(groups, DenseGroups) or q.shape[-1] != k.shape[-1] or q.shape[-2] > k.shape[-2]:
            return None
        mask = groups.mask
        if mask is not None and not (mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1):
            return None  # a mask per pair or per head (causal, windows; the degree prior's): the SDPA form
        from .. import triton_softmax
        if triton_softmax.triton is None or not triton_softmax.HEAD_DIMS[0] <= q.shape[-1] <= triton_softmax.HEAD_DIMS[1]:
            return None
        table = lookup = None
        if self.position_bias is not None and self.site.sequence:
            table = self.position_bias.weight.t()  # [H, buckets]
            lookup = self._relative_buckets(k.shape[-2], k.device)
        alpha = None if self.fixed_alpha == 1.0 else self.alpha()
        key_valid = None if mask is None else mask[:, 0, 0, :]

        def run(v: Tensor) -> Tensor:
            device = v.device.type
            # not on autocast's lists: cast as SDPA would be (the kernel forms the scores in float32 whatever it is given)
            dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else v.dtype
            return triton_softmax.biased_softmax_attention(q.to(dtype), k.to(dtype), v.to(dtype), scale=scale, a=alpha,
                                                           table=table, lookup=lookup, key_valid=key_valid)

        # α is a parameter read: the fused path keeps that curve; prior_tv needs the weights (eager calls only)
        diagnostics = {"alpha": self.alpha().mean().detach()} if self.measures("alpha") else {}
        return FusedAttention(None, None, scale, diagnostics=diagnostics,
                              library=LibraryForm("triton-softmax", run, fits=lambda v: v.shape == k.shape))

    def _relative_buckets(self, num_keys: int, device: torch.device) -> Tensor:
        """int32 [2·Lk - 1]: the T5 bucket of each key - query position from 1 - Lk to Lk - 1 (`relative_buckets`)."""
        return relative_buckets(self.config.num_buckets, self.config.max_distance, num_keys, device)

    def _bias_gradient_blocks(self, q: Tensor, k: Tensor, bias: Tensor | None, groups: Groups) -> tuple[int, int] | None:
        """(samples, heads) per SDPA call where the fused call runs in blocks (`_BiasGradientBlocks`), None for one call.

        CUDA's SDPA expands a bias that broadcasts over the batch (the position prior's [H, Lq, Lk]) to [B, H, Lq, Lk]
        before its memory-efficient kernel, whose backward writes the bias's gradient at that size, B times the
        bias's own (autograd's expand backward then sums it). Where the bias needs a gradient, on the CUDA path, the
        call runs in blocks of heads and samples, so that one block's gradient exists at a time, each summed as it
        comes, within `BIAS_GRADIENT_BUDGET`: whole heads of every sample where one fits, else one head and as many
        samples as fit; one head of every sample where the bias alone is past the budget. The bias's gradient is
        still written and summed at its full size over the blocks. Off the CUDA path (CPU records), without a
        gradient, under attention dropout (the blocked form takes none) or where one block would be the whole call:
        one call, as before."""
        if (bias is None or not bias.requires_grad or not torch.is_grad_enabled() or self.call_dropout != 0.0
                or not takes_cuda_path(q) or not isinstance(groups, DenseGroups)):
            return None
        batch, heads, pairs = q.shape[0], q.shape[1], q.shape[-2] * k.shape[-2]
        if bias.numel() >= batch * heads * pairs:
            return None  # one value per pair, head and sample already: nothing is expanded
        budget = BIAS_GRADIENT_BUDGET * q.numel() - 2 * bias.numel()
        if budget >= batch * pairs:
            samples, block_heads = batch, max(1, int(min(heads, budget // (batch * pairs))))  # inf: one call
        elif budget >= pairs:
            samples, block_heads = int(budget // pairs), 1
        else:
            # the bias alone is past the budget (long sequences, few samples): blocks of samples could not bring the
            # peak within it and each would read its slice of the bias again, so whole heads of every sample
            samples, block_heads = batch, 1
        return None if samples >= batch and block_heads >= heads else (samples, block_heads)

    def _flex_form(self, q: Tensor, k: Tensor, groups: Groups, scale: float) -> FlexForm | None:
        """`α[h]·s + log u` as a FlexAttention score_mod, built only where it can run (CUDA, or a test that
        asks for it). log u is read from its factors (the bucket table, the degrees) instead of an L×L bias,
        so that FlexAttention never materialises it; captured tensors are [H] or larger, never 0-d."""
        if not ((takes_cuda_path(q) and flex_wanted()) or flex_cpu_allowed()):
            return None
        alpha = self.alpha()
        batch, heads, lq, lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        if self.position_bias is not None and self.site.sequence:
            table, buckets = self.position_bias.weight, self._buckets(lq, lk, q.device)

            def score_mod(score, b, h, q_idx, kv_idx):
                return alpha[h] * score + table[buckets[q_idx, kv_idx], h]
        elif self.degree_weight is not None and groups.key_degree() is not None:
            weight = self.degree_weight
            log_degree = groups.key_degree().clamp_min(1).log().expand(batch, 1, lk)[:, 0].contiguous()

            def score_mod(score, b, h, q_idx, kv_idx):
                return alpha[h] * score + weight[h] * log_degree[b, kv_idx]
        else:
            def score_mod(score, b, h, q_idx, kv_idx):
                return alpha[h] * score
        return FlexForm(q, k, scale, score_mod)


BIAS_GRADIENT_BUDGET = 3.0
"""What `_BiasGradientBlocks` may add to a fused call's live memory in its backward, as a multiple of q's size: the
bias and its gradient (two bias-sized tensors) and one block's [samples, heads, Lq, Lk] gradient. SDPA's own forward
and backward hold about 8 q-sized tensors (q, k, v, the output, its gradient, dq, dk, dv), so this keeps the peak
near 1.4x theirs. As few blocks as the budget allows: each block of samples reads the bias again (forward and
backward) and adds its gradient up, and the blocks' pieces of q, k, v and the output are joined by a cat."""


class _BiasGradientBlocks:
    """softmax(scale·<q, k> + bias) @ v through SDPA one block of heads and samples at a time: each call reads its
    block's q, k, v (its samples' mask) and its heads' slice of the bias, so that its backward writes a [samples,
    heads, Lq, Lk] bias gradient, summed into that slice's gradient before the next block's backward runs. Blocks of
    heads read disjoint slices of the bias: only blocks of samples read a slice again (and add their gradients up).
    The same numbers per sample and head as one call; a slice's gradient is a sum in another order."""

    def __init__(self, q: Tensor, k: Tensor, bias: Tensor, groups: DenseGroups, scale: float, samples: int, heads: int):
        self.q, self.k, self.bias, self.groups, self.scale = q, k, bias, groups, scale
        batch, all_heads = q.shape[0], q.shape[1]
        self.samples = [min(samples, batch - start) for start in range(0, batch, samples)]
        self.heads = [min(heads, all_heads - start) for start in range(0, all_heads, heads)]

    def part(self, samples: slice) -> DenseGroups:
        if len(self.samples) == 1:
            return self.groups
        mask, valid = self.groups.mask, self.groups.query_valid
        return DenseGroups(None if mask is None or mask.shape[0] == 1 else mask[samples],
                           None if valid is None else valid[samples])

    @staticmethod
    def _split(t: Tensor, sizes: list[int], dim: int) -> list[Tensor]:
        """`t` in pieces of `sizes` along `dim` (all of it for each where it broadcasts there): splits, not a slice per
        piece, whose backwards join the pieces' gradients in one pass each."""
        if len(sizes) == 1 or t.dim() + dim < 0 or t.shape[dim] != sum(sizes):
            return [t] * len(sizes)
        return list(t.split(sizes, dim=dim))

    def run(self, v: Tensor) -> Tensor:
        q, k = self.q, self.k
        # cast once (as DenseGroups.fused_attention casts it per call), not once per block
        device = q.device.type
        bias = self.bias.to(torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else q.dtype)
        starts = [sum(self.samples[:i]) for i in range(len(self.samples))]
        parts = [self.part(slice(start, start + size)) for start, size in zip(starts, self.samples)]
        outputs = []
        by_heads = [self._split(t, self.heads, 1) for t in (q, k, v)] + [self._split(bias, self.heads, -3)]
        for q_h, k_h, v_h, bias_h in zip(*by_heads):
            by_samples = [self._split(t, self.samples, 0) for t in (q_h, k_h, v_h)] + [self._split(bias_h, self.samples, -4)]
            pieces = [part.fused_attention(q_b, k_b, v_b, bias=bias_b, scale=self.scale, dropout_p=0.0)
                      for part, q_b, k_b, v_b, bias_b in zip(parts, *by_samples)]
            outputs.append(torch.cat(pieces, dim=0) if len(pieces) > 1 else pieces[0])
        return torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0]


class FenchelNotConverged(RuntimeError):
    """The dual solve left queries above its gradient tolerance. Their weights are not eq. 15's and the
    implicit-function gradient is wrong there, so the forward stops with this reason (the harness records the
    run as failed with the message) instead of training on them."""


class DualSolution(NamedTuple):
    delta: Tensor
    """λ* - αz per query and head ([B,H,Lq,d] dense, [N,H,d] segment), differentiable by the implicit
    function theorem."""
    converged: Tensor
    """Per query and head (bool): the gradient of (13) met the tolerance before the last Newton step."""
    iterations: int
    """Damped Newton steps taken (the most any query needed, up to the cap `steps`)."""
    seen_all_converged: bool = False
    """True when the solver's own host read saw every pair converged, so the unconverged fraction is 0
    without reading `converged` again; False means not seen (a cap reached), not that some pair missed."""


# Sufficient-increase constant of the Armijo test: 0.25, within Boyd & Vandenberghe's 0.01-0.3 for Newton's
# method (Convex Optimization, §9.2-9.5); any c < 1/2 still takes the full step near the optimum, so convergence
# stays quadratic. Version 3 used the customary 1e-4 and 2-cycled: on easy-vqa after one epoch a (query, head)
# pair with image-grid templates whose <t, s> reached 13 had every full step accepted at 0.2% of its predicted
# increase, flipping its top weight between 0.58 and 0.02 for 30 steps (run recorded FenchelNotConverged); at
# 0.25 it converges in 2 steps. On random problems (α 0.25-4, logit std 1-4, d = 16, float32) the most steps
# any solve took fell from 15 to 11, the total over 45 solves from 311 to 210.
ARMIJO = 0.25
# Step halvings before a query is given up for this iteration (it then stays unconverged and is reported): 2^-40
# is far below any step that still changes λ, so only non-finite values get there.
MAX_HALVINGS = 40
# Off the CPU every host read of the solver (is anyone left unconverged? has every line search passed?) waits
# for the device, so there it reads only every few iterations and halvings: converged pairs take no step and an
# accepted step length stays accepted, so the extra rounds leave δ unchanged.
CONVERGENCE_CHECK_EVERY = 4


def _log_sum_exp(groups: Groups, x: Tensor) -> Tensor:
    """log Σ_i exp(x_i) within each group (-inf keys excluded; an empty group gives log(tiny), not NaN)."""
    top = groups.reduce(x, "max")
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    total = groups.reduce(torch.exp(x - groups.per_query(top)), "sum")
    return top + total.clamp_min(torch.finfo(x.dtype).tiny).log()


def _log_mean_exp_centred(groups: Groups, weights: Tensor, log_weights: Tensor, x: Tensor) -> Tensor:
    """log E_p[exp(x)] per group for x with E_p[x] = 0, accurate also when it is tiny: near the optimum the
    Armijo test compares increases of the dual of order eps·scale², which log-sum-exp (absolute error
    eps·|log-sum-exp|) cannot resolve. While every x <= 1: log1p(E_p[expm1(x)]), normalised by Σp against the
    softmax's own rounding. Otherwise log-sum-exp of log p + x, with log p from the log-softmax rather than
    log(p): a key whose weight underflowed to 0 can still dominate after the step (seen in float32 at α = 16)."""
    small = x.clamp_max(1.0)
    terms = torch.where(weights > 0, weights * torch.expm1(small), torch.zeros_like(x))
    mass = groups.reduce(weights, "sum").clamp_min(torch.finfo(x.dtype).tiny)
    near = torch.log1p(groups.reduce(terms, "sum") / mass)
    # The usual case after the first steps, every x <= 1, tested by one global max (a max per group is a scatter
    # on segments, 2-3% of a Cora epoch, measured): then the second pass is skipped.
    if host_reads_are_cheap(x) and bool(groups.fill_invalid(x, float("-inf")).max() <= 1.0):
        return near
    is_small = groups.reduce(x, "max") <= 1.0
    return torch.where(is_small, near, _log_sum_exp(groups, log_weights + x))


@dataclass(frozen=True)
class FenchelExactConfig(FenchelConfig):
    steps: Annotated[int, Ge(0)] = 30
    """Cap on the damped Newton steps of the dual solve (it stops as soon as every query meets `tolerance`;
    measured on logits of std up to 4 at α up to 4: at most ~12 steps); 0 gives `fenchel` (λ = αz)."""
    tolerance: Annotated[float | None, Gt(0)] = None
    """Convergence test per query and head: ||∇ of (13)|| <= tolerance · spread + 4·eps·magnitude·√keys, with
    spread = max_i ||t_i - μ|| over the query's keys (the gradient μ - E_p[t] - δ/α is a difference of points of
    that cloud, so this is relative to the problem's scale and invariant to shifting all templates) and the
    second term the gradient's own rounding error (magnitude = max_i ||t_i||, templates centred per head).
    None = √eps of the compute dtype (1.5e-8 in float64, 3.5e-4 in float32): the returned λ* is one more full
    Newton step, which squares the relative error, so the weights come out accurate to about eps."""
    max_unconverged: Annotated[float, Interval(ge=0, le=1)] = 0.0
    """Largest fraction of (query, head) pairs that may miss `tolerance` before the forward raises
    FenchelNotConverged. 0: damped Newton converges on every strongly concave dual, so a miss means a cap too
    low for the problem or non-finite inputs, and the implicit-function gradient would be silently wrong."""
    ridge: Annotated[float, Ge(0)] = 1e-6
    """Added to the negated Hessian's diagonal, relative to 1/α, against round-off in Cov_p(t)."""

    def __post_init__(self):
        super().__post_init__()
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.tolerance is not None and not self.tolerance > 0:
            raise ValueError(f"tolerance must be positive (or None for the dtype's default), got {self.tolerance}")
        if not 0.0 <= self.max_unconverged <= 1.0:
            raise ValueError(f"max_unconverged is a fraction in [0, 1], got {self.max_unconverged}")

    @classmethod
    def suggest(cls, trial: Any) -> dict[str, Any]:
        # The cap and tolerance are solver accuracy, not model choices: only α is searched, over the range
        # where the default cap converges with a wide margin (tests/attention/test_fenchel.py's grid).
        return {"alpha": trial.suggest_float("alpha", 0.25, 4.0, log=True)}


@register_attention("fenchel-exact")
class FenchelExactAttention(FenchelAttention):
    """Fenchel-dual attention, eq. 13-16: weights from λ* of the dual, solved to a gradient tolerance by damped
    Newton and differentiated by the implicit function theorem; raises FenchelNotConverged rather than
    returning the weights of an unconverged solve."""

    Config = FenchelExactConfig
    # Version 3: damped Newton to a tolerance with a convergence check (version 2's 5 undamped steps left up
    # to a third of the queries unconverged at α = 1 on logits of std 4).
    # Version 4: Armijo constant 0.25 instead of 1e-4 (see ARMIJO): same solution, reached without the 2-cycles
    # that left an easy-vqa run unconverged.
    # Version 5: the position-bias table trains with the host (FenchelAttention version 3).
    version: ClassVar[str] = "5"
    softmax_limit: ClassVar[dict[str, Any]] = {"prior": "uniform", "alpha": 1.0, "learn_alpha": False, "steps": 0}
    host_syncs_why: ClassVar[str | None] = (
        "its damped Newton solve runs until every (query, head) pair has converged, so it reads on the host whether "
        "any pair is left (and whether every line search passed), every CONVERGENCE_CHECK_EVERY iterations and "
        "halvings; a fixed step count would drop the tolerance the exact form promises")

    def fused_attention(self, q: Tensor, k: Tensor, groups: Groups, *, scale: float) -> FusedAttention | None:
        # Version 2: the fused first-order path of `fenchel` is exact only at steps=0; version 1 took it on
        # dense groups whenever weights were not requested, so it trained as plain `fenchel` there.
        return super().fused_attention(q, k, groups, scale=scale) if self.config.steps == 0 else None

    def templates(self, k: Tensor) -> Tensor:
        """t = k·d^(-1/4): with z = q·d^(-1/4), <t, z> is the standard scaled dot product."""
        return k * self.shape.head_dim ** -0.25

    def solve_dual(self, exponent: Tensor, groups: Groups, templates: Tensor, bias: Tensor | None) -> DualSolution:
        """δ = λ* - αz per query and head ([B,H,Lq,d] or [N,H,d]); `exponent` is α·<t, z> + log u, the
        exponent at δ = 0. In δ the dual (13) is, up to a constant per query,

            f(δ) = <δ, μ> - ||δ||²/(2α) - log Σ_i exp(exponent_i + <t_i, δ>),

        with gradient μ - E_p[t] - δ/α and negated Hessian I/α + Cov_p(t) (SPD), p ∝ u·exp(α<t, z> + <t, δ>).

        Damped Newton from δ = 0, without autograd: the Newton direction H⁻¹∇f, shortened by halving until
        the Armijo test f(δ + ηs) >= f(δ) + c·η·<∇f, s> holds per query (globally convergent on a strongly
        concave f; near the optimum the full step passes and convergence is quadratic). Queries meeting the
        tolerance are frozen. Then one full Newton step δ + H⁻¹·∇f(δ) with ∇f differentiable and H detached:
        its Jacobian is the implicit-function-theorem derivative of λ* (exact because δ is converged), at the
        cost of one step's backward."""
        alpha = per_head(self.alpha().to(templates.dtype), templates)
        prior = groups.softmax(exponent.new_zeros(()).expand_as(exponent) if bias is None else bias.expand_as(exponent))
        mu = groups.aggregate(prior, templates)
        if self.config.steps == 0:
            return DualSolution(torch.zeros_like(mu), torch.ones(mu.shape[:-1], dtype=torch.bool, device=mu.device), 0, True)
        d = templates.shape[-1]
        with torch.no_grad():
            exponent_, alpha_ = exponent.detach(), alpha.detach()
            # (13) is unchanged by shifting every template by one vector (the shift cancels between <λ, μ> and
            # the log-partition); centring per head keeps E_p[ttᵀ] - mmᵀ free of cancellation in float32.
            axes = [i for i in range(templates.dim()) if i not in (1, templates.dim() - 1)]
            centre = templates.detach().mean(dim=axes, keepdim=True)
            templates_, mu_ = templates.detach() - centre, mu.detach() - centre
            squared_distance = (groups.per_key(templates_.square().sum(-1)) - 2 * groups.scores(mu_, templates_, 1.0)
                                + groups.per_query(mu_.square().sum(-1)))
            spread = groups.reduce(squared_distance, "max").clamp_min(0).sqrt()
            tolerance = self.config.tolerance or torch.finfo(templates.dtype).eps ** 0.5
            # Floor: the rounding error of the computed gradient, a difference of weighted means of vectors up to
            # `magnitude` long, grows like eps·magnitude·√keys. Near-duplicate keys (spread ≪ magnitude) put
            # tolerance·spread below it: measured on Cora's second GAT layer in float32, gradients stalled at
            # 0.6-1.7 eps·magnitude for 11 of 2708 nodes with two nearly equal neighbours.
            magnitude = groups.reduce(groups.per_key(templates_.square().sum(-1)), "max").clamp_min(0).sqrt()
            keys = groups.group_size(exponent_)
            threshold = tolerance * spread + 4 * torch.finfo(templates.dtype).eps * magnitude * keys.sqrt()
            inverse_alpha = alpha_.reciprocal()
            diagonal = ((1.0 + self.config.ridge) * inverse_alpha).unsqueeze(-1) * torch.eye(d, dtype=mu.dtype, device=mu.device)
            # The state of every pair; the loop works on `rows` of it (all queries, or on graphs the nodes
            # still unconverged, see Groups.restrict_queries) and writes back what it leaves behind.
            delta_all = torch.zeros_like(mu_)
            chol_all = torch.empty(*mu_.shape, d, dtype=mu_.dtype, device=mu_.device)  # factor at each pair's latest δ (all set at step 0)
            converged_all = torch.zeros(mu_.shape[:-1], dtype=torch.bool, device=mu_.device)
            rows, work, exponent_w, mu_w, threshold_w = None, groups, exponent_, mu_, threshold
            delta, chol, needs_factor = delta_all, chol_all, ~converged_all
            outer = (templates_.unsqueeze(-1) * templates_.unsqueeze(-2)).flatten(-2)
            negated_hessian = _negated_hessian_of(work, outer, diagonal)
            cheap_reads = host_reads_are_cheap(exponent_)

            def read_due(round_: int) -> bool:
                return cheap_reads or round_ % CONVERGENCE_CHECK_EVERY == CONVERGENCE_CHECK_EVERY - 1

            seen_all_converged = False
            for iteration in range(self.config.steps + 1):
                active = needs_factor.any(-1)
                if cheap_reads and iteration > 0 and groups.can_restrict_queries and 2 * int(active.sum()) < active.numel():
                    _put(delta_all, rows, delta), _put(chol_all, rows, chol), _put(converged_all, rows, ~needs_factor)
                    keep = active.nonzero().squeeze(1)
                    rows = keep if rows is None else rows[keep]
                    work, edges = groups.restrict_queries(rows)
                    exponent_w, mu_w, threshold_w = exponent_.index_select(0, edges), mu_.index_select(0, rows), threshold.index_select(0, rows)
                    delta, chol, needs_factor = delta.index_select(0, keep), chol.index_select(0, keep), needs_factor.index_select(0, keep)
                    negated_hessian = _negated_hessian_of(work, outer, diagonal)
                # At δ = 0 the scores <t, δ> are zero: skipped.
                shifted = work.fill_invalid(exponent_w if iteration == 0 else exponent_w + work.scores(delta, templates_, 1.0), float("-inf"))
                log_weights = shifted - work.per_query(_log_sum_exp(work, shifted))
                weights = log_weights.exp()
                mean = work.aggregate(weights, templates_)
                gradient = mu_w - mean - delta * inverse_alpha
                converged = gradient.norm(dim=-1) <= threshold_w
                # I/α + Cov_p(t) is SPD: Cholesky (batched LU fails on this CPU build, DESIGN.md §7). Only pairs
                # that moved last iteration are refactored: after 3 steps < 1% of Cora's pairs are left, and
                # the d×d factorisations are LAPACK calls one matrix at a time (~0.4 µs each, measured).
                hessian = negated_hessian(weights, mean)
                moved = needs_factor.flatten().nonzero().squeeze(1) if cheap_reads else None
                if moved is None or moved.numel() == needs_factor.numel():
                    chol = torch.linalg.cholesky(hessian)
                else:
                    chol.view(-1, d, d)[moved] = torch.linalg.cholesky(hessian.expand(*mean.shape, d).reshape(-1, d, d)[moved])
                needs_factor = ~converged
                if iteration == self.config.steps:
                    break
                if read_due(iteration) and not bool(needs_factor.any()):
                    seen_all_converged = True
                    break
                if cheap_reads:
                    stepping = needs_factor.flatten().nonzero().squeeze(1)
                    step = torch.zeros_like(gradient)
                    step.view(-1, d)[stepping] = torch.cholesky_solve(gradient.reshape(-1, d, 1)[stepping], chol.view(-1, d, d)[stepping]).squeeze(-1)
                else:
                    solved = torch.cholesky_solve(gradient.unsqueeze(-1), chol).squeeze(-1)
                    step = torch.where(needs_factor.unsqueeze(-1), solved, torch.zeros_like(solved))
                slope = (gradient * step).sum(-1)  # <∇f, s> = ∇fᵀH⁻¹∇f >= 0
                curvature = (step.square() * inverse_alpha).sum(-1)  # ||s||²/α
                # f(δ + ηs) - f(δ) = η·slope - η²||s||²/(2α) - log E_p[exp(η·c)], c = <t, s> - <E_p[t], s>: the
                # increase itself, not a difference of two values of f (see _log_mean_exp_centred).
                centred = work.scores(step, templates_, 1.0) - work.per_query((mean * step).sum(-1))
                eta = torch.ones_like(slope)
                for halving in range(MAX_HALVINGS):
                    increase = eta * slope - 0.5 * eta.square() * curvature - _log_mean_exp_centred(work, weights, log_weights, work.per_query(eta) * centred)
                    accepted = converged | (increase >= ARMIJO * eta * slope)
                    if read_due(halving) and bool(accepted.all()):
                        break
                    eta = torch.where(accepted, eta, 0.5 * eta)
                else:
                    eta = torch.where(accepted, eta, torch.zeros_like(eta))  # no ascent (non-finite values): stays unconverged
                delta = delta + eta.unsqueeze(-1) * step
            _put(delta_all, rows, delta), _put(chol_all, rows, chol), _put(converged_all, rows, converged)
            delta, chol, converged = delta_all, chol_all, converged_all
        weights = groups.softmax(exponent + groups.scores(delta, templates, 1.0))
        gradient = mu - groups.aggregate(weights, templates) - delta / alpha
        delta = delta + torch.cholesky_solve(gradient.unsqueeze(-1), chol).squeeze(-1)
        return DualSolution(delta, converged, iteration, seen_all_converged)

    def normalize(self, logits: Tensor, groups: Groups, *, q: Tensor, k: Tensor) -> AttentionResult:
        exponent, bias = self.first_order_logits(logits, groups)
        if self.config.steps == 0:
            weights = groups.softmax(exponent)
            diagnostics = {**standard_diagnostics(weights, groups, self), **self.prior_diagnostics(bias, logits, groups)}
            return AttentionResult(weights, diagnostics=diagnostics)
        templates = self.templates(k)
        # The dual solve in float32 at least (autocast off): under CUDA autocast cholesky_solve gets an fp32
        # factor and a bf16 right-hand side, a bf16 Hessian of peaky logits is not positive-definite, and
        # the default tolerance √eps is ~0.09 in bf16. A no-op in float32.
        with full_precision(exponent, templates, bias) as (precise_exponent, precise_templates, precise_bias):
            precise = self.solve_dual(precise_exponent, groups, precise_templates, precise_bias)
        solution = precise._replace(delta=precise.delta.to(templates.dtype))
        unconverged = self._unconverged_fraction(solution, groups, exponent)
        weights = groups.softmax(exponent + groups.scores(solution.delta, templates, 1.0))
        diagnostics = {**standard_diagnostics(weights, groups, self), **self.prior_diagnostics(bias, logits, groups),
                       "unconverged": unconverged, "newton_steps": unconverged.new_tensor(float(solution.iterations))}
        if not self.training:
            diagnostics.update(self._dual_diagnostics(solution.delta, weights, exponent, groups, q))
        return AttentionResult(weights, diagnostics=diagnostics)

    def _unconverged_fraction(self, solution: DualSolution, groups: Groups, exponent: Tensor) -> Tensor:
        """Fraction of (query, head) pairs with keys that missed the tolerance; raises FenchelNotConverged
        above `max_unconverged`. A host read only when the solve stopped at its cap: a solve that stopped on
        convergence already read that every pair converged (what a GPU step would otherwise sync for)."""
        if solution.seen_all_converged:
            return exponent.new_zeros(())
        with torch.no_grad():
            has_keys = groups.reduce(torch.ones_like(exponent), "sum") > 0
            missed = (~solution.converged & has_keys).sum()
            fraction = missed / has_keys.sum().clamp_min(1)
            if fraction.item() > self.config.max_unconverged:
                finite = bool(torch.isfinite(solution.delta).all() and torch.isfinite(exponent).all())
                alphas = ", ".join(f"{a:.3g}" for a in self.alpha().detach().tolist())
                tolerance = self.config.tolerance or torch.finfo(exponent.dtype).eps ** 0.5
                raise FenchelNotConverged(
                    f"fenchel-exact: {fraction.item():.2%} of (query, head) pairs ({int(missed)} of {int(has_keys.sum())}) did not "
                    f"reach ||grad|| <= {tolerance:.2g}·spread (+ rounding floor) on the dual within steps={self.config.steps} damped Newton steps "
                    f"(alpha per head: {alphas}; max_unconverged={self.config.max_unconverged})"
                    + ("; the inputs or the solve are not finite, so the run diverged before the solver" if not finite else
                       "; raise `steps`, or lower alpha (the dual's curvature 1/alpha weakens as alpha grows)")
                )
            return fraction.to(exponent.dtype).detach()

    def _dual_diagnostics(self, delta: Tensor, weights: Tensor, exponent: Tensor, groups: Groups, q: Tensor) -> dict[str, Tensor]:
        """kl_to_first_order: KL(p* || first-order weights of eq. 22), the cost of the small-α approximation.
        key_space_deviation: ||λ* - αz|| / ||λ*|| with the kernel's templates t = k·d^(-1/4) and evidence
        z = q·d^(-1/4). This is §8's relative deviation (Fig. 4) measured in key space: §8 factorises BERT's
        logits through the hidden states (t_i = x_i/√d', z = KᵀQx), which a kernel never sees, so the values
        differ from the paper's. Left out on graph hosts, where the logits are not <q, k> and αz means nothing."""
        with torch.no_grad():
            first_order = groups.softmax(exponent)
            ratio = torch.where(weights > 0, weights.clamp_min(1e-30).log() - first_order.clamp_min(1e-30).log(), 0.0)
            out = {"kl_to_first_order": groups.mean_over_queries(groups.reduce(weights * ratio, "sum")).detach()}
            if q.shape == delta.shape and self.site.host != "graph":
                lam_first = self.templates(q) * per_head(self.alpha(), q).to(q.dtype)
                deviation = delta.norm(dim=-1) / (lam_first + delta).norm(dim=-1).clamp_min(1e-12)
                out["key_space_deviation"] = groups.mean_over_queries(deviation).detach()
            return out
