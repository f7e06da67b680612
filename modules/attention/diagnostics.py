"""A kernel's diagnostics: the declaration of a mechanism diagnostic and its rules, the switch that turns them
off, and the measures every variant shares (entropy and support of the weights, the query/key distance). Kept out
of kernel.py, the variant interface: a diagnostic is evidence about a run, never part of its result."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..device_policy import host_reads_are_cheap, takes_cpu_path
from .groups import DenseGroups, Groups, SegmentGroups

if TYPE_CHECKING:
    from .kernel import AttentionKernel


MECHANISM_RULES = ("above", "below", "moved", "below-baseline")
RENAMED_RULES = {"final>": "above", "final<": "below"}
"""Rule names of declarations written when rules read the last training epoch; they now read the
evaluated weights like every rule."""


@dataclass(frozen=True)
class MechanismDiagnostic:
    """A quantity that shows a variant's idea at work ("is the mechanism on?"), and how to read it.

    The kernel puts its value into `AttentionResult.diagnostics` under `name` (a detached scalar) whenever
    mechanism diagnostics are on; the LightningModules keep it as curves in the record's history, `diag/<name>`
    (mean over an epoch's training steps) and `val/diag/<name>` (validation passes), and the test pass's value as
    `Record.diagnostics["test/diag/<name>"]`: the value at the evaluated weights, those that gave the run's test
    numbers (the epoch the stopping rule kept). modules/attention/mechanism.py applies the rules to that value;
    the claims board calls it before it gives a negative verdict."""

    name: str
    meaning: str
    """One line: what the number is."""
    rule: str | None = None
    """How `mechanism_active` reads the value at the evaluated weights (None: shown, not a rule):
    'above' / 'below': it is above / below `threshold`;
    'moved': it differs from the first epoch's training value by more than `threshold`, relative to that;
    'below-baseline': it is below `threshold` x the same diagnostic of the `baseline` variant's record at the same
    task and seed (at that record's evaluated weights)."""
    threshold: float | None = None
    why: str = ""
    """What the threshold measures, in units a reader can judge, and why that size means the mechanism changed
    the attention: what an inactive mechanism would give, and the margin over it."""
    baseline: str | None = None
    """'below-baseline' only: the variant whose record this one is compared with (softmax)."""
    in_training: bool = True
    """Whether training steps measure it too (a curve of `diag/<name>`). False for what costs a sizeable share of a
    step and no rule reads there (the query/key distance's sorts: half a lone Cora fit); evaluation passes
    always measure every diagnostic, since the rules read the test pass's values."""
    loss_share: str | None = None
    """Set when the host, not the kernel, computes the value: the weighted share of this aux loss term in the
    loss (the weighted term over task loss + weighted aux terms); the kernel does not report it."""

    def __post_init__(self):
        if self.rule in RENAMED_RULES:
            object.__setattr__(self, "rule", RENAMED_RULES[self.rule])
        if self.rule == "max>":
            raise ValueError(f"MechanismDiagnostic {self.name!r}: rule 'max>' read a training curve's peak; rules read the value "
                             f"at the evaluated weights (a peak long before the kept epoch says nothing of the "
                             f"weights tested): use 'above', or rule=None to show the value without a rule")
        if self.rule is not None and self.rule not in MECHANISM_RULES:
            raise ValueError(f"MechanismDiagnostic {self.name!r}: rule must be one of {MECHANISM_RULES}, got {self.rule!r}")
        if self.rule is not None and self.threshold is None:
            raise ValueError(f"MechanismDiagnostic {self.name!r}: a rule needs a threshold")
        if (self.rule == "below-baseline") != (self.baseline is not None):
            raise ValueError(f"MechanismDiagnostic {self.name!r}: a baseline goes with rule 'below-baseline' only")


_mechanism_diagnostics_on = True


@contextmanager
def mechanism_diagnostics(enabled: bool) -> Iterator[None]:
    """Mechanism diagnostics on or off in this process (on by default). Off, kernels skip them: a test runs
    the same fit both ways to show that they change no training number."""
    global _mechanism_diagnostics_on
    previous, _mechanism_diagnostics_on = _mechanism_diagnostics_on, enabled
    try:
        yield
    finally:
        _mechanism_diagnostics_on = previous


def mechanism_diagnostics_on() -> bool:
    return _mechanism_diagnostics_on



def standard_diagnostics(weights: Tensor, groups: Groups, kernel: nn.Module | None = None) -> dict[str, Tensor]:
    """Entropy and support of the weights, and `support_fraction` where the kernel declares it; while `kernel`
    trains only what its mechanism declares: the rest nobody reads there, and it would cost a sizeable
    share of a small graph's training step (measured on Cora).
    At evaluation also `uniform_entropy`, the entropy uniform weights over the same keys would have (the mean
    log of each query's key count): how far `entropy` sits below it says how far the attention is from uniform,
    which bounds what any variant can change on a host (GAT's attention on Cora is near uniform)."""
    measures = getattr(kernel, "measures", None)
    # at evaluation only while diagnostics are on: a pass that measures none (a graph fit's unmeasured validation
    # passes, mechanism_diagnostics(False)) logs none of these, so it computes none
    evaluating = kernel is None or not kernel.training
    wanted = {"entropy", "support", "uniform_entropy"} if evaluating and mechanism_diagnostics_on() else set()
    if measures is not None:
        wanted |= {name for name in ("entropy", "support", "support_fraction") if measures(name)}
    if not wanted:
        return {}
    out = {}
    with torch.no_grad():
        if "entropy" in wanted:
            out["entropy"] = groups.entropy(weights).detach()
        if "support" in wanted:
            out["support"] = groups.support(weights).detach()
        if wanted & {"support_fraction", "uniform_entropy"}:
            size = groups.reduce(groups.zero_invalid(torch.ones_like(weights)), "sum").clamp_min(1)
        if "support_fraction" in wanted:
            nonzero = groups.reduce((weights > 0).to(weights.dtype), "sum")
            out["support_fraction"] = groups.mean_over_queries(nonzero / size).detach()
        if "uniform_entropy" in wanted:
            out["uniform_entropy"] = groups.mean_over_queries(size.log()).detach()
    return out


QK_PROJECTIONS = 32
"""Directions of the sliced distance: enough for a stable mean over head_dim 8-64 (its spread over re-drawn
directions was under 5% of its value on Cora's GAT, measured)."""
_QK_QUANTILES = 64
_QK_SEED = 0x51CE
_projections: dict[tuple[int, torch.device, torch.dtype], Tensor] = {}


def _fixed_directions(dim: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """[dim, QK_PROJECTIONS] unit directions from a private generator seeded by a constant: the same in every
    run, and no draw from the run's generators (its training numbers stay as they were)."""
    key = (dim, device, dtype)
    if key not in _projections:
        directions = torch.randn(dim, QK_PROJECTIONS, generator=torch.Generator().manual_seed(_QK_SEED), dtype=torch.float64)
        directions = F.normalize(directions, dim=0).to(device=device, dtype=dtype)
        if type(directions) is not Tensor:  # a fake tensor (the GPU cost page's counting) is never kept for real runs
            return directions
        _projections[key] = directions
    return _projections[key]


def _sorted_points(values: Tensor) -> Tensor:
    """values [C, n, P] sorted along n. On CPU by NumPy: its SIMD sort (x86-simd-sort) took 3.4 ms where torch's
    took 58 ms on Cora's first layer (8 heads x 32 directions x 2708 points, one thread, Intel Xeon), and the
    diagnostic runs every epoch: torch's sort made a Cora epoch ~4x slower. Both give the same order. Torch's sort
    elsewhere: on GPUs, and for the dtypes NumPy lacks (bf16, which CPU autocast gives the projections)."""
    if not takes_cpu_path(values) or values.dtype not in (torch.float32, torch.float64):
        return values.sort(dim=1).values
    import numpy as np

    # sorted rows contiguous first: the copy and the sort took 2.2 ms where the strided sort took 3.4 (Cora's layer)
    return torch.from_numpy(np.sort(np.ascontiguousarray(values.transpose(1, 2).numpy()), axis=-1)).transpose(1, 2)


def _all_valid_on_cpu(valid: Tensor) -> bool:
    """Whether a CPU mask is all True, read through NumPy. On a CPU the read costs nothing and lets the diagnostic
    skip its masking passes (every node of Cora is a key: ~1.5 ms of a layer's ~13 ms); a GPU tensor never takes
    the branch, so a GPU step still reads nothing (tests/modules/test_host_syncs.py counts ATen reads)."""
    return host_reads_are_cheap(valid) and bool(valid.numpy().all())


def _quantiles(values: Tensor, valid: Tensor | None) -> Tensor:
    """values [C, n, P] -> [C, QUANTILES, P]: each cloud's empirical quantiles at the mid-levels (i + 1/2)/M,
    over its valid points. Invariant to repeating every point (a copied graph in a batch) and to padding."""
    n = values.shape[1]
    if valid is None:
        count = torch.full((values.shape[0], 1, 1), n, device=values.device)
    else:
        if not _all_valid_on_cpu(valid):  # all valid, the fill changes nothing
            values = values.masked_fill(~valid.unsqueeze(-1), float("inf"))
        count = valid.sum(-1).view(-1, 1, 1)
    ordered = _sorted_points(values)
    levels = (torch.arange(_QK_QUANTILES, device=values.device, dtype=torch.float64) + 0.5) / _QK_QUANTILES
    index = (levels.view(1, -1, 1) * count).floor().long().clamp(max=n - 1).clamp(min=0)
    return ordered.gather(1, index.expand(-1, -1, values.shape[-1]))


def point_sets(q: Tensor, k: Tensor, groups: Groups) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """`groups.query_and_key_sets` without its host read (on graphs, whether every node is a key): a
    diagnostic must add no sync to a training step (tests/modules/test_host_syncs.py)."""
    if isinstance(groups, SegmentGroups):
        heads = q.shape[1]
        rows = groups.valid_queries  # cached on the groups after their first use
        q_valid = None if rows is None else rows.squeeze(-1).expand(heads, -1)
        return q.transpose(0, 1), k.transpose(0, 1), q_valid, (groups._out_degree > 0).expand(heads, -1)
    if isinstance(groups, DenseGroups):
        # the masks as query_and_key_sets builds them, without its reads of whether every row is valid
        batch, heads, lq, lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        rows = None if groups.query_valid is None else groups.query_valid[:, None, :]
        if groups.mask is not None:
            with_keys = groups.mask.any(-1)
            rows = with_keys if rows is None else rows & with_keys
        q_valid = None if rows is None else rows.expand(batch, heads, lq).reshape(batch * heads, lq)
        k_valid = None if groups.mask is None else groups.mask.any(-2).expand(batch, heads, lk).reshape(batch * heads, lk)
        return q.flatten(0, 1), k.flatten(0, 1), q_valid, k_valid
    return groups.query_and_key_sets(q, k)


def qk_distance(q: Tensor, k: Tensor, groups: Groups) -> Tensor:
    """Relative sliced Wasserstein-1 distance between the query and the key point clouds of each head (and
    each sample on dense groups), averaged: over fixed directions θ, the mean gap between the quantiles of
    <q, θ> and of <k, θ>, divided by the spread (std) of the two pooled. Scale-free, so runs and variants
    compare; 0 for identical distributions, ~1.1 for two unit Gaussians two standard deviations apart.
    The same measure for every variant at a self-attention site, softmax included, so that the alignment
    variants' distance can be read against softmax's at the same seed."""
    with torch.no_grad():
        q, k, q_valid, k_valid = point_sets(q.detach(), k.detach(), groups)
        dtype = torch.promote_types(q.dtype, torch.float32)  # bf16 quantiles would be coarser than the gaps they measure
        directions = _fixed_directions(q.shape[-1], q.device, dtype)
        pq, pk = q.to(dtype) @ directions, k.to(dtype) @ directions  # [C, n, P]
        gap = (_quantiles(pq, q_valid) - _quantiles(pk, k_valid)).abs().mean(1)  # [C, P]
        both = torch.cat([pq, pk], 1)
        if q_valid is None and k_valid is None:
            spread = both.std(1, correction=0)
            has_points = torch.ones(both.shape[0], dtype=torch.bool, device=both.device)
        else:
            qv = q_valid if q_valid is not None else torch.ones(pq.shape[:2], dtype=torch.bool, device=pq.device)
            kv = k_valid if k_valid is not None else torch.ones(pk.shape[:2], dtype=torch.bool, device=pk.device)
            valid = torch.cat([qv, kv], 1).unsqueeze(-1).to(both.dtype)
            count = valid.sum(1).clamp_min(1)
            if _all_valid_on_cpu(qv) and _all_valid_on_cpu(kv):  # x * 1.0 is x: the same sums, bit for bit, without the products
                mean = both.sum(1) / count
                spread = (((both - mean.unsqueeze(1)) ** 2).sum(1) / count).sqrt()
            else:
                mean = (both * valid).sum(1) / count
                spread = (((both - mean.unsqueeze(1)) ** 2 * valid).sum(1) / count).sqrt()
            has_points = (qv.any(-1) & kv.any(-1))
        relative = gap / spread.clamp_min(1e-12)  # [C, P]
        per_cloud = relative.mean(-1)
        return (torch.where(has_points, per_cloud, 0.0).sum() / has_points.sum().clamp_min(1)).detach()


def qk_diagnostics(kernel: "AttentionKernel", q: Tensor, k: Tensor, groups: Groups) -> dict[str, Tensor]:
    """{"qk_distance": ...} where the kernel measures it and sits at a self-attention site (queries and keys of
    the same items, where aligning them means something); in training only where declared `in_training`."""
    if not kernel.measures("qk_distance") or kernel.site.role != "self" or q is None or k is None:
        return {}  # a caller that normalises logits alone (no queries or keys) gets the weights without the distance
    return {"qk_distance": qk_distance(q, k, groups)}

