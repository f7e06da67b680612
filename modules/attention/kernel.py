"""The attention-variant interface: compatibility scores -> a distribution per query -> weighted values."""

from __future__ import annotations

import dataclasses
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..device_policy import host_reads_are_cheap, takes_cpu_path, takes_cuda_path
from .groups import DenseGroups, Groups, SegmentGroups


@dataclass
class AttentionResult:
    weights: Tensor | None
    """>= 0, sums to 1 in every group with a valid key, 0 on masked keys. None only on a fused fast path
    (`need_weights=False`) that never formed the weights."""
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    """Unweighted scalar regularisers, e.g. {"kl": ..., "align": ...}; the config weights them."""
    diagnostics: dict[str, Tensor] = field(default_factory=dict)
    """Detached scalars worth logging, e.g. {"entropy": ..., "support": ...}."""


@dataclass
class FusedAttention:
    """What a kernel hands the layout's fused kernel (SDPA on dense groups): the output is
    softmax(scale·<q, k> + bias) @ v, computed without forming the weights. A kernel whose map is not a
    softmax (α-entmax) gives q = k = None and a `library` form instead: then SDPA is not an option."""

    q: Tensor | None
    k: Tensor | None
    scale: float
    bias: Tensor | None = None
    """Additive logits bias broadcastable to [B, H, Lq, Lk] (e.g. a log prior), or None."""
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    """Aux losses that do not need the weights (alignment's regulariser), returned with the output."""
    diagnostics: dict[str, Tensor] = field(default_factory=dict)
    """Detached diagnostics that do not need the weights (the query/key distance), returned with the output."""
    flex: "FlexForm | None" = None
    """The same logits as a FlexAttention score_mod, for CUDA (see `select_path`); None: SDPA only."""
    library: "LibraryForm | None" = None
    """A field library's fused kernel for a map that is not a softmax (adasplash's α-entmax), built only
    where it can run; None: none."""


ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass
class FlexForm:
    """softmax(score_mod(scale·<q, k>)) @ v as FlexAttention computes it. The score_mod's captured tensors
    are per head, shape [H] and never 0-d: a 0-d captured parameter breaks FlexAttention's backward
    (pytorch #145208). A variant's own tensor form of the logits (SDPA's q', k' and bias) can differ from
    this one: gmm's SDPA form appends a column to q and k, which FlexAttention need not pay for."""

    q: Tensor
    k: Tensor
    scale: float
    score_mod: ScoreMod


@dataclass
class LibraryForm:
    """The output `run(v)` of a library kernel that never forms the weights, for the call's q and k. `fits(v)`
    says whether this v is in the library's contract (e.g. v shaped as q); `path` is the name recorded."""

    path: str
    run: Callable[[Tensor], Tensor]
    fits: Callable[[Tensor], bool] = lambda v: True


PATHS = ("sdpa", "flex", "adasplash", "blocked", "eager")
"""How a kernel call ran: torch SDPA on a FusedAttention, FlexAttention on its FlexForm, a library kernel on
its LibraryForm (adasplash for α-entmax), the weights materialised one block of queries at a time and
recomputed in the backward (`query_block_rows`), or the weights materialised (`normalize` then `aggregate`)."""

BLOCK_BUDGET_ENV = "ATTNBENCH_WEIGHTS_BUDGET_MB"
WEIGHTS_BUDGET_MB = 1024
"""Above this many MiB for one [B, H, Lq, Lk] float32 tensor, a row-separable kernel's eager call on CUDA runs
in query blocks of at most this size (BLOCK_BUDGET_ENV overrides it). The first gpu-perf on an H100 ran out of
memory with the materialising variants at L = 2048 (B = 32, H = 12: 6.4 GB a tensor) and L = 8192 (B = 4:
12.9 GB), where entmax and BAM keep several such tensors for the backward; at L = 512 (0.4 GB) the call stays
whole, as measured there. Blocks cost one more forward of the block in the backward (checkpointing)."""

_forced_block_rows: int | None = None


@contextmanager
def query_blocks(rows: int | None) -> Iterator[None]:
    """Run row-separable kernels' eager calls in blocks of `rows` queries on any device (tests, CPU memory
    measurements); None: the rule of `query_block_rows`."""
    global _forced_block_rows
    previous, _forced_block_rows = _forced_block_rows, rows
    try:
        yield
    finally:
        _forced_block_rows = previous


def query_block_rows(kernel: "AttentionKernel", groups: Groups, q: Tensor, k: Tensor, budget_mb: float | None = None) -> int | None:
    """Queries per block for a call that forms the weights but need not return them, or None (one piece):
    only for a kernel that declares itself `row_separable`, on dense groups, and on CUDA when one [B, H, Lq, Lk]
    float32 tensor would pass `budget_mb` (default WEIGHTS_BUDGET_MB, or BLOCK_BUDGET_ENV), or wherever
    `query_blocks` forces it."""
    if not getattr(kernel, "row_separable", False) or not isinstance(groups, DenseGroups):
        return None
    num_queries = q.shape[-2]
    if _forced_block_rows is not None:
        return _forced_block_rows if _forced_block_rows < num_queries else None
    if not takes_cuda_path(q):
        return None
    budget = float(budget_mb if budget_mb is not None else os.environ.get(BLOCK_BUDGET_ENV, WEIGHTS_BUDGET_MB)) * 2**20
    row_bytes = 4 * q.shape[0] * q.shape[1] * k.shape[-2]
    if row_bytes * num_queries <= budget:
        return None
    return max(16, int(budget // row_bytes))


def block_pairs(part: DenseGroups, q: Tensor, k: Tensor) -> Tensor:
    """The valid (query, key) pairs of valid queries in a query block (`part`, its queries `q`), in float32 and
    unclamped, so that a block without any weighs 0 where blocks merge a per-pair mean."""
    like = q.new_zeros((), dtype=torch.float32).expand(q.shape[0], q.shape[1], q.shape[-2], k.shape[-2])
    return part.sum_over_pairs(like.new_ones((1, 1, 1, 1)), like)


def replaying(fn: Callable[..., Any], generator: torch.Generator | None) -> Callable[..., Any]:
    """`fn` as checkpointing recomputes it: the recomputation draws what the forward drew from `generator` (a
    run's own stream, which checkpoint's RNG preservation does not cover: it restores torch's global ones), and
    leaves the generator where it was, so that later draws are not repeated."""
    if generator is None:
        return fn
    start = generator.get_state()
    calls = 0

    def run(*args):
        nonlocal calls
        calls += 1
        if calls == 1:
            return fn(*args)
        now = generator.get_state()
        generator.set_state(start)
        try:
            return fn(*args)
        finally:
            generator.set_state(now)

    return run

_flex_on_cpu = False


@contextmanager
def flex_on_cpu(enabled: bool = True) -> Iterator[None]:
    """Let `select_path` pick FlexAttention on CPU too. Only for tests: on CPU its forward runs unfused
    (slower than SDPA) and it has no backward, but it shows there that a FlexForm computes the eager logits."""
    global _flex_on_cpu
    previous, _flex_on_cpu = _flex_on_cpu, enabled
    try:
        yield
    finally:
        _flex_on_cpu = previous


FLEX_ENV = "ATTNBENCH_FLEX"
"""Set to 1 to let CUDA calls take FlexAttention where a kernel gives a FlexForm. Off by default because it was
measured slower than the same kernels' SDPA forms: on an H100 with torch 2.11 (leaderboards/gpu-perf/, commit
11bd97f; B=32, H=12, L=512, d=64) fenchel took 99.8 ms in fp32 against 21.7 ms for SDPA softmax, gmm 183 ms in
bf16 against 2.7 ms, and fenchel's bf16 backward did not compile (its Triton template needed 344 KB of shared
memory against the H100's 227 KB). The FlexForms stay (their fp32 forward and backward matched eager there),
so that a later gpu-perf run can time them again."""


def flex_wanted() -> bool:
    """FlexAttention on CUDA is asked for (FLEX_ENV=1) or a test turned it on for CPU (`flex_on_cpu`)."""
    return _flex_on_cpu or os.environ.get(FLEX_ENV, "") == "1"


def flex_cpu_allowed() -> bool:
    """Whether `flex_on_cpu` is on: kernels then build their FlexForm on CPU tensors too."""
    return _flex_on_cpu


def select_path(fused: FusedAttention | None, groups: Groups, q: Tensor, *, need_weights: bool,
                dropout_p: float = 0.0, v: Tensor | None = None) -> str:
    """Which path a kernel call takes, decided once per call as timm's Attention picks its fused path.

    - 'eager' whenever the host needs the weights (need_weights=True: hosts ask for them for probes and for
      the diagnostics that read them), the layout has no fused kernel (segment groups), or the kernel
      returned no fused form (its weights are not a softmax of a dot product, or the config turns on terms
      that need the weights: gmm's EM);
    - 'flex' on CUDA, when asked for (FLEX_ENV: it was measured slower than SDPA), where the kernel gives a
      FlexForm, no attention dropout is asked for (FlexAttention
      has no dropout) and the head dimension is a power of two of at least 16 (what its Triton kernels
      tile without padding): its score_mod keeps per-head factors out of the q projection, where SDPA needs
      them folded into q' and k';
    - the library form's path (adasplash) where the kernel built one (it does so only where the library can
      run), no attention dropout is asked for (the library has none) and `v` fits its contract; else eager,
      since such a map has no SDPA form;
    - 'sdpa' otherwise. On CPU that keeps every result as it was before FlexAttention existed here."""
    if need_weights or fused is None or not groups.has_fused_attention:
        return "eager"
    if fused.library is not None:
        return fused.library.path if dropout_p == 0.0 and (v is None or fused.library.fits(v)) else "eager"
    if fused.q is None:
        return "eager"
    if (fused.flex is not None and dropout_p == 0.0 and (takes_cuda_path(q) or _flex_on_cpu) and flex_wanted()
            and _flex_head_dim(fused.flex.q.shape[-1]) and _flex_attention() is not None):
        return "flex"
    return "sdpa"


def _flex_head_dim(dim: int) -> bool:
    return dim >= 16 and dim & (dim - 1) == 0


def _flex_attention():
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:  # torch before 2.5
        return None
    return flex_attention


_compiled_flex: dict[str, Any] = {}


def run_flex(form: FlexForm, v: Tensor, groups: Groups) -> Tensor:
    """FlexAttention on `form` within dense groups: the boolean mask becomes -inf in the score_mod (a
    BlockMask would skip blocks, but building one per call costs more than it saves at these lengths).
    Compiled on CUDA, where uncompiled FlexAttention materialises the scores; eager on CPU (tests only).
    Shapes are left to compile's automatic dynamic marking: text batches vary in length, and one
    static graph per length would exhaust the recompile limit and fall back to the unfused form."""
    flex = _flex_attention()
    if takes_cuda_path(form.q):
        if "cuda" not in _compiled_flex:
            _compiled_flex["cuda"] = torch.compile(flex)
        flex = _compiled_flex["cuda"]
    score_mod = form.score_mod
    mask = getattr(groups, "mask", None)
    if mask is not None:
        full = mask.expand(form.q.shape[0], 1, form.q.shape[2], form.k.shape[2])
        inner = score_mod

        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.where(full[b, 0, q_idx, kv_idx], inner(score, b, h, q_idx, kv_idx), float("-inf"))

    q, k = form.q, form.k
    # FlexAttention is not on autocast's lists: cast as SDPA would be, or bf16 autocast would run it in fp32
    device = q.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else v.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    return flex(q, k, v, score_mod=score_mod, scale=form.scale)


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


MECHANISM_RULES = ("above", "below", "moved", "below-baseline")
RENAMED_RULES = {"final>": "above", "final<": "below"}
"""Rule names of declarations written before issue 51, which read the last training epoch; they now read the
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
    step and no rule reads there (the query/key distance's sorts: half a lone Cora fit, issue 51); evaluation passes
    always measure every diagnostic, since the rules read the test pass's values."""
    loss_share: str | None = None
    """Set when the host, not the kernel, computes the value: the weighted share of this aux loss term in the
    loss (the weighted term over task loss + weighted aux terms); the kernel does not report it."""

    def __post_init__(self):
        if self.rule in RENAMED_RULES:
            object.__setattr__(self, "rule", RENAMED_RULES[self.rule])
        if self.rule == "max>":
            raise ValueError(f"MechanismDiagnostic {self.name!r}: rule 'max>' read a training curve's peak; rules read the value "
                             f"at the evaluated weights since issue 51 (a peak long before the kept epoch says nothing of the "
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

    row_separable: ClassVar[bool] = False
    """True if each query's weights depend on its own row of logits (and on the keys) only, and every aux loss and
    diagnostic `normalize` returns is a mean over the valid queries, or over the valid (query, key) pairs for
    the names in `pair_means`. Then a call that need not return the weights may run in query blocks
    (`query_block_rows`: on CUDA when the weights would not fit), each block's means weighted by its count."""
    pair_means: ClassVar[tuple[str, ...]] = ()

    def measures(self, name: str) -> bool:
        """Whether to compute the declared diagnostic `name` in this call: at evaluation always, in training where its
        declaration says `in_training` (a curve of training steps)."""
        return _mechanism_diagnostics_on and any(d.name == name and d.loss_share is None and (d.in_training or not self.training)
                                                 for d in self.mechanism)

    undecayed: ClassVar[tuple[str, ...]] = ()
    """Names of the kernel's sub-network attributes that train at the host's rate but without its weight decay
    (modules/lit/optimization.py): an adversary whose loss reaches it scaled by a small λ, which the host's L2
    would otherwise outweigh (align-gan's discriminator, README "align-gan")."""

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
        fused = None
        if not need_weights and groups.has_fused_attention:
            fused = self.fused_attention(q, k, groups, scale=scale)
        dropout_p = dropout_p if self.training else 0.0
        path = select_path(fused, groups, q, need_weights=need_weights, dropout_p=dropout_p, v=v)
        rows = query_block_rows(self, groups, q, k) if path == "eager" and not need_weights else None
        if rows is not None:
            path = "blocked"
        self._record_path(path)
        if path == "blocked":
            return self._blocked(q, k, v, groups, scale, dropout_p, rows)
        if fused is not None and fused.library is not None and path == fused.library.path:
            return fused.library.run(v), AttentionResult(None, fused.aux_losses, fused.diagnostics)
        if path == "flex":
            return run_flex(fused.flex, v, groups), AttentionResult(None, fused.aux_losses, fused.diagnostics)
        if path == "sdpa":
            out = groups.fused_attention(fused.q, fused.k, v, bias=fused.bias, scale=fused.scale, dropout_p=dropout_p)
            return out, AttentionResult(None, fused.aux_losses, fused.diagnostics)
        return self._eager(q, k, v, groups, scale, dropout_p)

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


def per_head(x: Tensor, like: Tensor) -> Tensor:
    """A per-head [H] tensor shaped to broadcast against `like`. Heads sit on axis 1 in every layout a
    kernel sees: dense logits [B,H,Lq,Lk] and q/k/v [B,H,L,d]; segment logits [E,H], node-level q/k/v
    [N,H,d] and padded rows [N,H,K]."""
    return x.view(1, -1, *([1] * (like.dim() - 2)))


def standard_diagnostics(weights: Tensor, groups: Groups, kernel: nn.Module | None = None) -> dict[str, Tensor]:
    """Entropy and support of the weights, and `support_fraction` where the kernel declares it; while `kernel`
    trains only what its mechanism declares: the rest nobody reads there, and it would cost a sizeable
    share of a small graph's training step (measured on Cora).
    At evaluation also `uniform_entropy`, the entropy uniform weights over the same keys would have (the mean
    log of each query's key count): how far `entropy` sits below it says how far the attention is from uniform,
    which bounds what any variant can change on a host (issue 51: GAT's attention on Cora is near uniform)."""
    measures = getattr(kernel, "measures", None)
    wanted = {"entropy", "support", "uniform_entropy"} if kernel is None or not kernel.training else set()
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
        _projections[key] = F.normalize(directions, dim=0).to(device=device, dtype=dtype)
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
