"""The attention-variant interface: compatibility scores -> a distribution per query -> weighted values."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from contextlib import contextmanager
from typing import Any, ClassVar, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .backends import (  # noqa: F401  (re-exported: variants, plugins and tests import these from kernel)
    BACKENDS,
    BLOCK_BUDGET_ENV,
    Call,
    FLEX_ENV,
    PATHS,
    WEIGHTS_BUDGET_MB,
    FlexForm,
    FusedAttention,
    LibraryForm,
    ScoreMod,
    block_pairs,
    flex_cpu_allowed,
    flex_on_cpu,
    flex_wanted,
    query_block_rows,
    query_blocks,
    replaying,
    choose,
    run_backend,
    run_flex,
    select_path,
)
from .diagnostics import (  # noqa: F401  (re-exported, as above)
    MECHANISM_RULES,
    QK_PROJECTIONS,
    RENAMED_RULES,
    MechanismDiagnostic,
    _all_valid_on_cpu,
    _sorted_points,
    mechanism_diagnostics,
    mechanism_diagnostics_on,
    point_sets,
    qk_diagnostics,
    qk_distance,
    standard_diagnostics,
)
from .groups import DenseGroups, Groups


@dataclass
class AttentionResult:
    weights: Tensor | None
    """>= 0, sums to 1 in every group with a valid key, 0 on masked keys. None only on a fused fast path
    (`need_weights=False`) that never formed the weights."""
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    """Unweighted scalar regularisers, e.g. {"kl": ..., "align": ...}; the config weights them."""
    diagnostics: dict[str, Tensor] = field(default_factory=dict)
    """Detached scalars worth logging, e.g. {"entropy": ..., "support": ...}."""



def attention_paths(model: nn.Module | None) -> dict[str, list[str]]:
    """{'attention_paths': the paths its kernels ran, sorted}, for `Record.execution` (metadata, not part of
    the run key): which implementation a cost column measured. Empty when every call ran eager, so that a
    record without the field ran eager (every graph run: segment groups have no fused kernel) and records
    from before this field read the same."""
    if model is None:
        return {}
    ran = set()
    for module in model.modules():
        if isinstance(module, AttentionKernel):
            ran |= getattr(module, "paths_run", set())
    return {"attention_paths": sorted(ran)} if ran - {"eager"} else {}


HOSTS = ("graph", "text", "vision-language", "any")
ROLES = ("self", "cross", "pool")


@dataclass(frozen=True)
class AttentionSite:
    """Where a kernel sits in its host model. Papers set their variants up differently per host (BAM's GAT
    and GLUE scripts), and some terms exist only at some sites (a relative-position prior needs one ordered
    sequence; the alignment regulariser matches the queries and keys of self-attention): a kernel reads
    this instead of the host checking variant names."""

    host: str = "any"
    """'graph' (GAT over a node's in-edges), 'text' (a text encoder), 'vision-language' (VQA, captioning),
    or 'any' (a host that does not say: the config's own defaults apply)."""
    role: str = "self"
    """'self': queries and keys are the same items; 'cross': queries attend to another set (caption ->
    image grid); 'pool': one or a few learned queries summarise a set."""
    sequence: bool = False
    """Queries and keys are positions of one ordered sequence (tokens), so relative positions mean
    something; False for graphs, image grids, cross-attention and pooling."""

    def __post_init__(self):
        if self.host not in HOSTS:
            raise ValueError(f"AttentionSite host must be one of {HOSTS}, got {self.host!r}")
        if self.role not in ROLES:
            raise ValueError(f"AttentionSite role must be one of {ROLES}, got {self.role!r}")
        if self.sequence and self.role != "self":
            raise ValueError("AttentionSite(sequence=True) needs role='self': positions are shared only within one sequence")


@dataclass(frozen=True)
class AttentionConfig:
    """Base of every variant's frozen config. Fields carry the paper's defaults; a field whose default
    differs by host is None here and filled from `site_defaults` when a kernel is built at a site."""

    schedule_unit: ClassVar[str] = "step"
    """What `loss_weights` counts: 'step' (optimiser steps) or 'epoch' (completed training epochs), so a
    schedule runs in the unit its paper's code used whatever the host's number of steps per epoch."""

    def loss_weights(self, step: int) -> dict[str, float]:
        """Weight of each aux loss at `step`, counted in `schedule_unit` (e.g. BAM's annealed KL weight)."""
        return {}

    @classmethod
    def site_defaults(cls, site: "AttentionSite") -> dict[str, Any]:
        """Per-host paper defaults: field name -> value, for the fields this site sets differently.
        Applied only to fields left None; each value should name its source in the field's docstring."""
        return {}

    def for_site(self, site: "AttentionSite") -> "AttentionConfig":
        """This config with the site's defaults filled into the fields left None."""
        fill = {k: v for k, v in self.site_defaults(site).items() if getattr(self, k) is None}
        return dataclasses.replace(self, **fill) if fill else self

    @classmethod
    def suggest(cls, trial: Any) -> dict[str, Any]:
        """The variant's own Optuna search space: field name -> suggested value."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class HeadShape:
    """What a kernel may need to size its own parameters (per-head priors, discriminators)."""

    num_heads: int
    head_dim: int
    site: AttentionSite = AttentionSite()


class AttentionKernel(nn.Module):
    """Base class of every attention variant.

    Subclasses set `Config` (a frozen dataclass deriving from AttentionConfig) and override `normalize`
    (and `score` if the compatibility is not a scaled dot product, `fused_attention` if the weights are a
    softmax that a fused kernel can compute). Kernels never see the loss, the logger or globals: they
    return unweighted aux terms and detached diagnostics. They reach the layout only through `Groups`.
    """

    Config: ClassVar[type[AttentionConfig]] = AttentionConfig
    version: ClassVar[str] = "1"
    """Bump when the variant's math changes: it is part of every run key, so old results stop counting."""
    name: str = "?"
    softmax_limit: ClassVar[Mapping[str, Any] | None] = None
    """Config values at which the variant reduces to softmax attention (a contract test checks it in
    training mode on dense and segment groups, to `softmax_limit_atol`). None only for softmax itself."""
    softmax_limit_atol: ClassVar[float] = 1e-6
    stochastic: ClassVar[bool] = False
    """True if the weights are sampled in training mode: hosts may then average `mc_samples` predictions,
    each drawn with the kernels (only) in training mode, at evaluation."""
    noise_generator: torch.Generator | None = None
    """Where `draw_noise` draws from; None: torch's global generator. A host sets it to its run's own stream
    (modules/hosts/gat.py), so that a seed's draws do not depend on which other seeds share its process."""
    needs_values: ClassVar[bool] = False
    """True if the weights depend on the values (gmm's EM value iterations): `forward` then hands
    `normalize` the values as `v=` too."""
    scalar_knobs: ClassVar[tuple[str, ...]] = ()
    """Names of the kernel's own nn.Parameter attributes that are scalar knobs: a temperature, an α, a
    precision, a prior coupling per head, each an O(1) quantity of its own parameterisation. They train in
    their own group at `kernel_lr_scale` x the host's rate without weight decay (modules/lit/optimization.py
    says why). Every other kernel parameter (a sub-network: a discriminator, a prior MLP, a bias table)
    trains with the host's parameters, as the authors' codes train them; so the safe default is none. An
    attribute that is None or a buffer (a knob the config fixed) is skipped."""

    mechanism: ClassVar[tuple[MechanismDiagnostic, ...]] = ()
    """The diagnostics that show this variant's idea at work (MechanismDiagnostic says how they are kept and read).
    A plugin declares its own the same way and reports them from `normalize` when `measures(name)`."""
    mechanism_rule: ClassVar[str] = "any"
    """'any': the mechanism is active when any ruled diagnostic says so; 'all': when every one does."""

    host_syncs_why: ClassVar[str | None] = None
    """Why a forward+backward on the CUDA path reads the device on the host (each read waits for every queued kernel),
    or None: it reads nothing. A variant whose algorithm needs a read (a solver's convergence test) says so here, and
    why; the GPU cost page (harness/studies/gpu_cost.py) shows it beside the reads it counts, and the count tests
    (tests/attention/test_gpu_cost.py) hold every other variant to none."""

    row_separable: ClassVar[bool] = False
    """True if each query's weights depend on its own row of logits (and on the keys) only, and every aux loss and
    diagnostic `normalize` returns is a mean over the valid queries, or over the valid (query, key) pairs for
    the names in `pair_means`. Then a call that need not return the weights may run in query blocks
    (`query_block_rows`: on CUDA when the weights would not fit), each block's means weighted by its count."""
    pair_means: ClassVar[tuple[str, ...]] = ()

    independent_heads: ClassVar[bool] = False
    """True if each head's weights come from that head's own logits (and its own slices of q and k) alone, by the
    same map for every head, the call draws no noise and keeps no state between calls, and a call that measures
    nothing (`measures` False for every declared diagnostic; at evaluation, diagnostics off) returns no aux losses
    and no diagnostics. Then, with no parameters and no buffers, one call on the heads of several runs side by side
    ([N, S·H, d]) gives each run the weights its own call would: `folds_heads` is the rule a host reads before folding
    runs into one call. False by default, so a plugin that does not declare it is called once per run."""

    def measures(self, name: str) -> bool:
        """Whether to compute the declared diagnostic `name` in this call: at evaluation always, in training where its
        declaration says `in_training` (a curve of training steps)."""
        return mechanism_diagnostics_on() and any(d.name == name and d.loss_share is None and (d.in_training or not self.training)
                                                 for d in self.mechanism)

    undecayed: ClassVar[tuple[str, ...]] = ()
    """Names of the kernel's sub-network attributes that train at the host's rate but without its weight decay
    (modules/lit/optimization.py): an adversary whose loss reaches it scaled by a small λ, which the host's L2
    would otherwise outweigh (align-gan's discriminator, leaderboards/studies/align-gan-discriminator.md)."""

    def undecayed_parameters(self) -> list[nn.Parameter]:
        """The trainable parameters of the sub-networks `undecayed` names."""
        found = []
        for name in self.undecayed:
            sub = getattr(self, name, None)
            if isinstance(sub, nn.Module):
                found.extend(p for p in sub.parameters() if p.requires_grad)
        return found

    def scalar_knob_parameters(self) -> list[nn.Parameter]:
        """The trainable parameters `scalar_knobs` names."""
        knobs = (getattr(self, name, None) for name in self.scalar_knobs)
        return [p for p in knobs if isinstance(p, nn.Parameter) and p.requires_grad]

    def __init__(self, config: AttentionConfig, shape: HeadShape):
        super().__init__()
        self.site = shape.site
        self.config = config.for_site(shape.site)
        self.shape = shape
        self.paths_run: set[str] = set()
        """The paths (PATHS) this kernel's calls took: read into `Record.execution` by `attention_paths`."""
        self.last_path: str | None = None

    def score(self, q: Tensor, k: Tensor, groups: Groups, *, scale: float) -> Tensor:
        return groups.scores(q, k, scale)

    def normalize(self, logits: Tensor, groups: Groups, *, q: Tensor, k: Tensor) -> AttentionResult:
        """The weights of every group from the logits; q and k (the layouts of `score`'s inputs: dense
        [B,H,L,d], segment node-level [N,H,d]) for kernels that use more than the logits."""
        raise NotImplementedError

    def fused_attention(self, q: Tensor, k: Tensor, groups: Groups, *, scale: float) -> FusedAttention | None:
        """Inputs for the layout's fused kernel when the weights are softmax(scale'·<q', k'> + bias) and the
        host does not ask for them; None = no fused path (the weights are formed and aggregated)."""
        return None

    def draw_noise(self, like: Tensor, distribution: str = "uniform") -> Tensor:
        """Noise for stochastic kernels, one draw per entry of `like`: 'uniform' on [0, 1) or standard
        'normal'. Drawn here, not inline, so that tests can hold it fixed across layouts (the padding
        contract compares a batch with and without padding under the same noise)."""
        generator = self.noise_generator
        if distribution == "uniform":
            return torch.rand(like.shape, generator=generator, dtype=like.dtype, device=like.device)
        if distribution == "normal":
            return torch.randn(like.shape, generator=generator, dtype=like.dtype, device=like.device)
        raise ValueError(f"unknown noise distribution {distribution!r}; use 'uniform' or 'normal'")

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        groups: Groups,
        *,
        scale: float | None = None,
        dropout_p: float = 0.0,
        need_weights: bool = True,
    ) -> tuple[Tensor, AttentionResult]:
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        dropout_p = dropout_p if self.training else 0.0
        self.call_dropout = dropout_p
        try:
            fused = None
            if not need_weights and groups.has_fused_attention:
                fused = self.fused_attention(q, k, groups, scale=scale)
            call = Call(self, fused, groups, q, k, v, dropout_p)
            path, rows = choose(call, need_weights=need_weights)
            self._record_path(path)
            if path == "blocked":
                return self._blocked(q, k, v, groups, scale, dropout_p, rows)
            if path != "eager":
                return run_backend(path, call), AttentionResult(None, fused.aux_losses, fused.diagnostics)
            return self._eager(q, k, v, groups, scale, dropout_p)
        finally:
            self.call_dropout = 0.0

    call_dropout: float = 0.0
    """The attention dropout of the call in progress (`forward`; 0 in evaluation and between calls), for a
    `fused_attention` whose form depends on it: SDPA regenerates its dropout mask in the backward, so a form that
    recomputes its call in the backward (BAM's redrawn noise) or splits it into blocks (fenchel's bias gradient) can
    do so only without dropout."""

    def _eager(self, q: Tensor, k: Tensor, v: Tensor, groups: Groups, scale: float, dropout_p: float) -> tuple[Tensor, AttentionResult]:
        logits = self.score(q, k, groups, scale=scale)
        values = {"v": v} if self.needs_values else {}
        result = self.normalize(logits, groups, q=q, k=k, **values)
        weights = F.dropout(result.weights, dropout_p, self.training) if dropout_p > 0 else result.weights
        return groups.aggregate(weights, v), result

    def _blocked(self, q: Tensor, k: Tensor, v: Tensor, groups: DenseGroups, scale: float, dropout_p: float,
                 rows: int) -> tuple[Tensor, AttentionResult]:
        """The eager call one block of `rows` queries at a time, each checkpointed (torch.utils.checkpoint keeps
        a block's inputs, not its [B, H, rows, Lk] intermediates, and recomputes them in the backward), so that
        at most one block's weights exist at once. Means merge weighted by each block's valid queries (pairs for
        `pair_means`); the weights are not returned (a call that needs them is never blocked)."""
        from torch.utils.checkpoint import checkpoint

        def block_call(part: DenseGroups):
            def call(q_part: Tensor, k_: Tensor, v_: Tensor):
                out, result = self._eager(q_part, k_, v_, part, scale, dropout_p)
                return out, result.aux_losses, result.diagnostics
            return call

        batch, heads, num_queries = q.shape[0], q.shape[1], q.shape[-2]
        outputs, parts = [], []
        for start in range(0, num_queries, rows):
            block = slice(start, min(start + rows, num_queries))
            part = groups.query_rows(block)
            out, aux, diagnostics = checkpoint(replaying(block_call(part), self.noise_generator), q[..., block, :], k, v,
                                               use_reentrant=False, preserve_rng_state=True)
            size = block.stop - block.start
            valid = part.valid_queries
            # counts in float32 (bf16 would round them); the pairs unclamped, so that a block without any weighs 0
            queries = (torch.tensor(float(batch * heads * size), device=q.device) if valid is None
                       else valid.expand(batch, heads, size).sum().float())
            pairs = block_pairs(part, q[..., block, :], k) if self.pair_means else None
            outputs.append(out)
            parts.append((aux, diagnostics, queries, pairs))

        def merged(which: int) -> dict[str, Tensor]:
            names = parts[0][which].keys()
            out = {}
            for name in names:
                dtype = torch.promote_types(parts[0][which][name].dtype, torch.float32)
                weights = [(p[3] if name in self.pair_means else p[2]).to(dtype) for p in parts]
                total = sum(w * p[which][name].to(dtype) for w, p in zip(weights, parts))
                out[name] = (total / torch.stack(weights).sum().clamp_min(1)).to(parts[0][which][name].dtype)
            return out

        return torch.cat(outputs, dim=-2), AttentionResult(None, merged(0), merged(1))

    def _record_path(self, path: str) -> None:
        # the set is touched only on a change: no cost in a steady training step; a plugin kernel built without
        # AttentionKernel.__init__ gets its set here
        if path != getattr(self, "last_path", None):
            self.last_path = path
            vars(self).setdefault("paths_run", set()).add(path)

    def loss_weights(self, step: int, epoch: int | None = None) -> dict[str, float]:
        """Aux-loss weights at optimiser `step` (and completed `epoch`), in the config's schedule unit."""
        if self.config.schedule_unit == "epoch":
            if epoch is None:
                raise ValueError(f"{self.name}: its loss schedule counts epochs; pass epoch=")
            return self.config.loss_weights(epoch)
        return self.config.loss_weights(step)

    def extra_repr(self) -> str:
        return f"{self.name}: {self.config}"


def folds_heads(kernels: Sequence[nn.Module]) -> bool:
    """Whether one call of kernels[0] on the heads of every kernel's run side by side gives each run its own weights:
    the kernels declare `independent_heads`, are of one class, config and mode, are not `stochastic`, hold no
    parameters and no buffers (a per-head one would be sized for one run's heads, and a trained one differs between
    runs), and this call measures no diagnostic (a diagnostic is a mean over the heads, which cannot be split back
    into runs). The one rule for folding runs into the heads axis: a host that folds reads it and nothing else."""
    first = kernels[0]
    if not getattr(first, "independent_heads", False) or getattr(first, "stochastic", False):
        return False
    for kernel in kernels:
        if type(kernel) is not type(first) or getattr(kernel, "config", None) != getattr(first, "config", None):
            return False
        if kernel.training != first.training or next(kernel.parameters(), None) is not None or next(kernel.buffers(), None) is not None:
            return False
    if mechanism_diagnostics_on():
        measures = getattr(first, "measures", None)
        if not first.training or measures is None or any(measures(d.name) for d in getattr(first, "mechanism", ())):
            return False
    return True


def per_head(x: Tensor, like: Tensor) -> Tensor:
    """A per-head [H] tensor shaped to broadcast against `like`. Heads sit on axis 1 in every layout a
    kernel sees: dense logits [B,H,Lq,Lk] and q/k/v [B,H,L,d]; segment logits [E,H], node-level q/k/v
    [N,H,d] and padded rows [N,H,K]."""
    return x.view(1, -1, *([1] * (like.dim() - 2)))




@contextmanager
def full_precision(*tensors: Tensor | None) -> Iterator[tuple[Tensor | None, ...]]:
    """A region for the numerically sensitive part of a kernel (sort-based thresholds, samplers, KL terms,
    Newton and Sinkhorn solves): autocast off, and the given tensors raised to at least float32 (None and
    float64 pass through). Yields them in order; the caller casts its results back to the input dtype.

    Why not rely on autocast: CUDA and CPU autocast disagree (CUDA keeps exp/log/cumsum in fp32 but casts
    cholesky_solve's right-hand side, not its factor; CPU autocast leaves most of these ops in bf16), and
    neither knows that a bf16 uniform has 8 bits (a Weibull sample at k = 1000 then equals its mean) or that
    a bf16 Newton tolerance is ~0.9. Float32 work is unchanged: no cast, and autocast was off already."""
    device = next((t.device.type for t in tensors if t is not None), "cpu")
    raised = tuple(
        t if t is None or not t.is_floating_point() or t.dtype in (torch.float32, torch.float64) else t.float()
        for t in tensors
    )
    with torch.autocast(device, enabled=False):
        yield raised
