"""The backends a kernel call can run on, and the rule that picks one: a table, in one place.

A kernel hands the layout a `FusedAttention` (its logits as SDPA inputs, a FlexForm, or a library's form) or
nothing; `BACKENDS` lists, in the order they are tried, each backend with what it needs from the kernel's forms
(`offered`) and what it needs from the call and the device (`chosen`); `select_path` takes the first chosen, and
`offered_paths` lists every one a kernel offers whatever the device (gpu-perf's correctness check runs each).
What the device allows is the device policy's (`modules.device_policy`): a CPU run "as on CUDA" picks what a CUDA
run picks."""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
from torch import Tensor

from ..device_policy import takes_cuda_path
from .groups import DenseGroups, Groups

if TYPE_CHECKING:
    from .kernel import AttentionKernel


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



PATHS = ("sdpa", "flex", "adasplash", "triton-entmax", "triton-softmax", "triton-noisy-softmax", "blocked", "eager")
"""How a kernel call ran: torch SDPA on a FusedAttention, FlexAttention on its FlexForm, a library kernel on
its LibraryForm (adasplash for a fixed α-entmax; our Triton kernels: triton-entmax for the learned α, triton-softmax
for a softmax whose logits carry terms SDPA would take as an L×L bias, triton-noisy-softmax for a softmax of logits
with noise drawn inside the kernel), the weights materialised one block of queries at a time and
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
    `query_blocks` forces it. A kernel may set `block_weights_vs_q` (a float): then on CUDA its blocks are sized by
    q instead, one block's float32 weights at most that many times q's elements (no budget given)."""
    if not getattr(kernel, "row_separable", False) or not isinstance(groups, DenseGroups):
        return None
    num_queries = q.shape[-2]
    if _forced_block_rows is not None:
        return _forced_block_rows if _forced_block_rows < num_queries else None
    if not takes_cuda_path(q):
        return None
    row_bytes = 4 * q.shape[0] * q.shape[1] * k.shape[-2]
    relative = getattr(kernel, "block_weights_vs_q", None)
    if relative is not None and budget_mb is None:
        # a kernel whose block keeps many weight-sized temporaries: one block's [B, H, rows, Lk] float32 tensor at most
        # `relative` times q's elements at float32, so that its blocks stay a fixed share of the call's own tensors at
        # every length and batch (a budget in MiB would let them grow to many times q's size at short lengths)
        rows = int(relative * 4 * math.prod(q.shape) // row_bytes)
        return max(16, rows) if max(16, rows) < num_queries else None
    budget = float(budget_mb if budget_mb is not None else os.environ.get(BLOCK_BUDGET_ENV, WEIGHTS_BUDGET_MB)) * 2**20
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


@dataclass(frozen=True)
class Call:
    """What decides a call's backend: the kernel, its fused form (None: it gave none), the layout, q, k, v, the
    attention dropout asked for."""

    kernel: "AttentionKernel | None"
    fused: FusedAttention | None
    groups: Groups
    q: Tensor
    k: Tensor | None = None
    v: Tensor | None = None
    dropout_p: float = 0.0


@dataclass(frozen=True)
class Backend:
    """One row of the table: a path (PATHS), what it needs from the kernel's forms, what it needs from the call and
    the device, and how it computes the output (None: the kernel's own method, `_blocked` or `_eager`)."""

    path: str
    offered: Callable[[Call], bool]
    """The kernel's forms allow it here, whatever the device and the call's options."""
    chosen: Callable[[Call], bool]
    """Of an offered backend: the call (dropout, v) and the device policy allow it."""
    run: Callable[[Call], Tensor] | None
    why: str


def _library_offered(call: Call) -> bool:
    return call.fused is not None and call.fused.library is not None


def _sdpa_offered(call: Call) -> bool:
    return call.fused is not None and call.fused.library is None and call.fused.q is not None


def _flex_offered(call: Call) -> bool:
    return _sdpa_offered(call) and call.fused.flex is not None and _flex_head_dim(call.fused.flex.q.shape[-1])


def _blocked_offered(call: Call) -> bool:
    """A row-separable kernel on dense groups, unless a library kernel alone computes its output: a library form
    that also carries the softmax form SDPA runs (BAM's SDPA replayed in the backward) blocks as that form does."""
    return (getattr(call.kernel, "row_separable", False) and isinstance(call.groups, DenseGroups)
            and (not _library_offered(call) or call.fused.q is not None))


BACKENDS: tuple[Backend, ...] = (
    Backend("library", _library_offered,
            lambda c: c.dropout_p == 0.0 and (c.v is None or c.fused.library.fits(c.v)),
            lambda c: c.fused.library.run(c.v),
            "a field library's kernel for a map that is not a softmax (AdaSplash's α-entmax), built only where it can "
            "run; no dropout; v in its contract. Its path is the library's name"),
    Backend("flex", _flex_offered,
            lambda c: (c.dropout_p == 0.0 and (takes_cuda_path(c.q) or _flex_on_cpu) and flex_wanted()
                       and _flex_attention() is not None),
            lambda c: run_flex(c.fused.flex, c.v, c.groups),
            "FlexAttention on the kernel's FlexForm: on the CUDA path, when asked for (FLEX_ENV), no dropout, a head "
            "dimension its Triton kernels tile (a power of two >= 16)"),
    Backend("sdpa", _sdpa_offered, lambda c: True,
            lambda c: c.groups.fused_attention(c.fused.q, c.fused.k, c.v, bias=c.fused.bias, scale=c.fused.scale,
                                               dropout_p=c.dropout_p),
            "torch SDPA on the kernel's softmax form, on every device"),
    Backend("blocked", _blocked_offered, lambda c: query_block_rows(c.kernel, c.groups, c.q, c.k) is not None, None,
            "the eager call in query blocks, recomputed in the backward: a row-separable kernel on dense groups, on "
            "the CUDA path when its weights would pass the budget (query_block_rows)"),
    Backend("eager", lambda c: True, lambda c: True, None, "the weights formed, then aggregated"),
)
"""In the order they are tried. 'library' stands for the library form's own path name (adasplash)."""


def backend_path(backend: Backend, call: Call) -> str:
    """The path a backend records: the library's own name for 'library'."""
    return call.fused.library.path if backend.path == "library" and _library_offered(call) else backend.path


def select_path(fused: FusedAttention | None, groups: Groups, q: Tensor, *, need_weights: bool,
                dropout_p: float = 0.0, v: Tensor | None = None) -> str:
    """Which path a kernel call takes, decided once per call as timm's Attention picks its fused path.

    - 'eager' whenever the host needs the weights (need_weights=True: hosts ask for them for probes and for
      the diagnostics that read them), the layout has no fused kernel (segment groups), or the kernel
      returned no fused form (its weights are not a softmax of a dot product, or the config turns on terms
      that need the weights: gmm's EM);
    - 'flex' on the CUDA path (the device policy), when asked for (FLEX_ENV: it was measured slower than SDPA), where the kernel gives a
      FlexForm, no attention dropout is asked for (FlexAttention
      has no dropout) and the head dimension is a power of two of at least 16 (what its Triton kernels
      tile without padding): its score_mod keeps per-head factors out of the q projection, where SDPA needs
      them folded into q' and k';
    - the library form's path (adasplash) where the kernel built one (it does so only where the library can
      run), no attention dropout is asked for (the library has none) and `v` fits its contract; else eager,
      since such a map has no SDPA form;
    - 'sdpa' otherwise. On CPU that keeps every result as it was before FlexAttention existed here.
    Each rule is a row of BACKENDS."""
    if need_weights or fused is None or not groups.has_fused_attention:
        return "eager"
    call = Call(None, fused, groups, q, None, v, dropout_p)
    fused_rows = [b for b in BACKENDS if b.run is not None]
    for backend in fused_rows:
        if backend.offered(call) and backend.chosen(call):
            return backend_path(backend, call)
    return "eager"  # a library form not chosen: such a map has no SDPA form


def choose(call: Call, *, need_weights: bool) -> tuple[str, int | None]:
    """(path, rows) of a kernel call: `select_path`, then query blocks (rows per block) for an eager call that need
    not return the weights where the blocked backend is chosen."""
    path = select_path(call.fused, call.groups, call.q, need_weights=need_weights, dropout_p=call.dropout_p, v=call.v)
    if path == "eager" and not need_weights:
        rows = query_block_rows(call.kernel, call.groups, call.q, call.k)
        if rows is not None:
            return "blocked", rows
    return path, None


def offered_paths(kernel: "AttentionKernel", fused: FusedAttention | None, groups: Groups, q: Tensor) -> list[str]:
    """Every backend but eager that `kernel` offers for this call whatever the device: what a check of the fused
    paths against eager runs. With an SDPA form, 'blocked' means the call under forced query blocks (BAM blocks its KL
    while its output takes SDPA)."""
    call = Call(kernel, fused, groups, q)
    return [backend_path(b, call) for b in BACKENDS if b.path != "eager" and b.offered(call)]


def run_backend(path: str, call: Call) -> Tensor:
    """The output of a fused backend (library, flex, sdpa) on `call`."""
    for backend in BACKENDS:
        if backend.run is not None and backend.offered(call) and backend_path(backend, call) == path:
            return backend.run(call)
    raise ValueError(f"no fused backend {path!r} here")


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
