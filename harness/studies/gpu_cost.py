"""`make gpu-cost`: what a GPU would run, counted on the CPU.

For each registered variant (and a plugin's: `--plugin my_variant.py`), one forward+backward on the path a CUDA
run takes (`modules.device_policy.behave_as_cuda`: every device branch forced to its CUDA form on CPU tensors), at
the gpu-perf shapes (H = 12, d = 64; L = 512 and 2048 at B = 32, L = 8192 at B = 4, as `gpu_perf.DENSE`), counted
by a dispatch mode below autograd (`CostCounter`):

- kernels launched: every ATen op that launches work (views, metadata and allocations are not kernels), and each
  Triton launch: the project's are custom ops (`attnbench::*`, AdaSplash's kernels among them) whose fake forms run
  on fake tensors (the device policy takes the Triton path there, as a GPU with Triton does), each counted as an op
  with what it reads (its arguments) and writes (its results, or the buffers it fills); a plugin's own launch
  outside a custom op counts with its tensor arguments' bytes;
- host syncs: every op that must read the device on the host (`.item()`, `bool(t)`, nonzero, boolean indexing,
  ...: the list of tests/modules/host_syncs.py), with the line that asked for it;
- bytes touched: the sum over kernels of their input and output tensors' bytes (a broadcast dimension counts once;
  a tensor a kernel only writes, or whose shape alone it reads, counts as written only; a gather reads what it
  returns, a scatter into a tensor reads and writes where its source lands: `op_bytes`);
- peak live bytes: storages are tracked from the op that creates them to their release, the inputs included;
- bytes saved for backward (torch.autograd.graph.saved_tensors_hooks, each storage once), against FlashAttention's
  ideal: q, k, v, out and the logsumexp;
- FLOPs (torch.utils.flop_counter's formulas).
Floating tensors count at bf16's 2 bytes an element (the gpu-perf page's bf16 column): the kernels run in fp32 on
the CPU, and CUDA autocast's fp32 islands (softmax, the variants' full_precision regions) are counted at 2 bytes
too, so a materialising variant's bytes are if anything under-counted. Ratios are to SDPA softmax's.

SDPA is counted as CUDA runs it, not as the CPU does: FlashAttention where there is no mask and the head dimension
is a multiple of 8 (at most 256), the memory-efficient kernel where a bias is added, the math path (the weights
materialised, each op counted) otherwise (gmm's head dimension 65). A fused backend counts one launch each way,
with what it reads and writes, and saves q, k, v, the bias, out and the logsumexp; its gradients come back in
q, k and v's layout, as CUDA's allocate them (the CPU's flash backward returns another, which autograd would copy).

Without allocating: the tensors are fake (FakeTensorMode) wherever the variant's code allows; a variant whose code
reads values (a data-dependent loop or output size) is counted on real tensors at B = 1, H = 1, its bytes, peak,
saved bytes and FLOPs scaled by B x H (its kernels and syncs are per call) and marked so; at L = 8192 that is not
done (its L x L tensors would not fit this machine) and the row says so.

The Cora rows count a lone softmax epoch (the runner's Lightning loop) and a 20-seed batch epoch (the seed batch's
own loop), each as the difference of two run lengths per epoch, on the CUDA path: ops dispatched, kernels, host
syncs (and where), and with `--host-time` the host's CPU time outside kernels (one thread), which depends on the
machine and so is printed, never written to the page.

    python -m harness.studies.gpu_cost [--variants a,b] [--lengths 512] [--plugin FILE.py] [--no-cora] [--out leaderboards]

A full run (no --variants, --lengths or --plugin) writes leaderboards/gpu-cost.{md,csv}, byte for byte the same on
every machine; a partial run prints its table (and writes only where --out is given)."""

from __future__ import annotations

import argparse
import csv
import gc
import io
import math
import os
import re
import sys
import traceback
import weakref
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

REPO = str(Path(__file__).resolve().parents[2]) + "/"
HEADS, DIM = 12, 64
DENSE = [(512, 32), (2048, 32), (8192, 4)]
"""(L, B) as gpu_perf.DENSE: the shapes of the H100 page's dense table."""
FLOAT_BYTES = 2
"""Bytes an element of a float32/bf16/fp16 tensor counts for: bf16's."""
REAL_MAX_LENGTH = 2048
"""The longest L counted on real tensors (B = H = 1) where fake ones cannot be: at 8192 a fenchel-exact call keeps
some sixty L x L float32 tensors (16 GB)."""

aten = torch.ops.aten

SYNC_OPS = {
    aten._local_scalar_dense.default: "value read on the host (.item(), bool(), float(), int())",
    aten.nonzero.default: "nonzero", aten.nonzero_static.default: None, aten.masked_select.default: "masked_select",
    aten.equal.default: "torch.equal", aten._unique2.default: "unique", aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique_consecutive", aten.is_nonzero.default: "bool()",
    aten.bincount.default: "bincount (its size is the largest value)",
}
"""Ops that make the host wait for the device (None: listed only to say it does not: nonzero_static has a fixed size)."""

NOT_KERNELS = {
    "aten::detach", "aten::alias", "aten::empty", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
    "aten::empty_like", "aten::lift_fresh", "aten::_unsafe_view", "aten::_local_scalar_dense", "aten::set_",
    "aten::resize_", "aten::_reshape_alias", "aten::sym_size", "aten::sym_stride", "aten::sym_numel",
    "aten::sym_storage_offset", "aten::is_same_size", "aten::_has_compatible_shallow_copy_type", "aten::record_stream",
    "aten::_nested_tensor_from_mask_left_aligned", "aten::result_type",
}
"""ATen ops that launch nothing on a GPU: allocations, aliases and metadata (views are found by their schema)."""


KERNEL_NAMESPACES = ("aten", "prims", "attnbench")
"""Ops that launch device work: ATen's, and the project's Triton launches, each a custom op `attnbench::*` whose
tensors are its arguments and results."""


def is_kernel(func) -> bool:
    """Whether an op launches device work (a view or an allocation does not)."""
    if func.namespace not in KERNEL_NAMESPACES:
        return False
    name = func._schema.name
    if name in NOT_KERNELS or name.startswith("prim::"):
        return False
    return not func.is_view


def element_bytes(dtype: torch.dtype) -> int:
    if dtype in (torch.float32, torch.bfloat16, torch.float16):
        return FLOAT_BYTES
    return torch.empty((), dtype=dtype, device="meta").element_size()


def _sparse_parts(t: torch.Tensor) -> list[torch.Tensor]:
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [t.crow_indices(), t.col_indices(), t.values()]
    if t.layout in (torch.sparse_csc, torch.sparse_bsc):
        return [t.ccol_indices(), t.row_indices(), t.values()]
    return []


def touched_bytes(t: torch.Tensor) -> int:
    """Bytes of `t`'s distinct elements: a broadcast (stride-0) dimension is read once; a sparse tensor's parts."""
    if t.layout != torch.strided:
        return sum(touched_bytes(part) for part in _sparse_parts(t))
    size = 1
    for n, s in zip(t.shape, t.stride()):
        if s != 0:
            size *= int(n)
    return size * element_bytes(t.dtype)


SELF_NOT_READ = {
    "aten::copy_", "aten::fill_", "aten::zero_", "aten::uniform_", "aten::normal_", "aten::exponential_",
    "aten::bernoulli_", "aten::random_", "aten::log_normal_", "aten::geometric_", "aten::cauchy_",
    "aten::new_zeros", "aten::new_ones", "aten::new_full", "aten::zeros_like", "aten::ones_like", "aten::full_like",
    "aten::rand_like", "aten::randn_like", "aten::randint_like",
}
"""Ops that only write `self` (an in-place fill, a copy into it) or read only its shape and dtype (a new tensor like it):
`self` is counted as written (where it is the output), never as read."""

GATHERS = {"aten::index_select", "aten::gather", "aten::index", "aten::embedding", "aten::take"}
"""Ops that read only the elements they return from `self`: `self` counts as many bytes as the output, not its whole."""

SCATTERS_INTO_SELF = {
    "aten::index_add_": "source", "aten::index_copy_": "source", "aten::scatter_": "src",
    "aten::scatter_add_": "src", "aten::scatter_reduce_": "src", "aten::index_put_": "values",
}
"""In-place ops that read and write only the elements of `self` that their source lands on: `self` counts as the
source's bytes read and written, not its whole twice."""


def _arguments(func, args, kwargs) -> Iterator[tuple[Any, Any]]:
    """(schema argument, value) of each argument given to an ATen op."""
    for index, argument in enumerate(func._schema.arguments):
        if index < len(args):
            yield argument, args[index]
        elif argument.name in kwargs:
            yield argument, kwargs[argument.name]


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def op_bytes(func, args, kwargs, out) -> int:
    """Bytes an ATen kernel moves: its outputs written, its tensor inputs read (`touched_bytes` each), except that an
    out= argument and the `self` of SELF_NOT_READ are only written, a gather reads from `self` what it returns, and a
    scatter into `self` reads and writes only where its source lands."""
    name = func._schema.name
    outputs = _tensors(out)
    scatter_source = SCATTERS_INTO_SELF.get(name)
    if scatter_source is not None:
        given = dict((argument.name, value) for argument, value in _arguments(func, args, kwargs))
        moved = sum(touched_bytes(t) for t in _tensors(given.get(scatter_source)))
        others = sum(touched_bytes(t) for argument, value in _arguments(func, args, kwargs) if argument.name != "self"
                     for t in _tensors(value))
        return others + 2 * moved
    total = sum(touched_bytes(t) for t in outputs)
    for argument, value in _arguments(func, args, kwargs):
        if argument.is_out or (argument.name == "self" and name in SELF_NOT_READ):
            continue
        if func.namespace == "attnbench" and argument.alias_info is not None and argument.alias_info.is_write:
            # a buffer a launch writes into (made outside it, e.g. zeroed by a counted fill): written once
            total += sum(touched_bytes(t) for t in _tensors(value))
            continue
        if argument.name == "self" and name in GATHERS:
            total += sum(touched_bytes(t) for t in outputs[:1])
            continue
        total += sum(touched_bytes(t) for t in _tensors(value))
    return total


def storage_bytes(t: torch.Tensor) -> int:
    storage = t.untyped_storage()
    return storage.nbytes() // t.element_size() * element_bytes(t.dtype)


def _caller() -> str:
    """The innermost project frame outside this file and torch: where a sync was asked for."""
    import traceback as tb

    for frame in reversed(tb.extract_stack()[:-2]):
        name = frame.filename
        if name.endswith("gpu_cost.py") or "/torch/" in name or "<" in name:
            continue
        if "site-packages/" in name:  # a library's own read (Lightning, torchmetrics, AdaSplash): named in its package
            return f"{name.split('site-packages/')[-1]}:{frame.lineno}"
        return f"{name.removeprefix(REPO)}:{frame.lineno}"
    return "?"


class CostCounter(TorchDispatchMode):
    """Counts kernels, host syncs, bytes touched, live and peak storage, and FLOPs of the ops below autograd."""

    def __init__(self, where: bool = True, storage: bool = True):
        super().__init__()
        self.storage = storage
        self.phase = ""
        """A label syncs are counted under (the Cora rows: 'training step' while one runs)."""
        self.kernels = 0
        self.ops = 0
        self.syncs: Counter = Counter()
        self.bytes = 0
        self.flops = 0
        self.live: dict[int, tuple[Any, int]] = {}
        self.current = 0
        self.peak = 0
        self.paused = 0
        self.where = where
        self.by_kernel: Counter = Counter()
        self.kernel_time_s = 0.0
        self.timing = False
        self.phase_syncs: Counter = Counter()
        self.phase_where: Counter = Counter()
        self.sdpa_backends: Counter = Counter()
        self.flops_unknown: Counter = Counter()
        """Launches whose FLOPs no formula gives (a Triton kernel without a registered flop formula)."""

    # -- storage ----------------------------------------------------------------------------------------------
    def track(self, *tensors: Any) -> None:
        """Count these tensors' storages as live from now on (inputs, and what a counted fused kernel allocates)."""
        from torch.multiprocessing.reductions import StorageWeakRef

        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            if t.layout != torch.strided:
                self.track(*_sparse_parts(t))
                continue
            try:
                ref = StorageWeakRef(t.untyped_storage())
            except Exception:  # noqa: BLE001 - a tensor without storage (a nested one) is not tracked
                continue
            if ref.cdata in self.live:
                continue
            size = storage_bytes(t)
            self.live[ref.cdata] = (ref, size)
            self.current += size
        self.peak = max(self.peak, self.current)

    def _release(self) -> None:
        gone = [key for key, (ref, _) in self.live.items() if ref.expired()]
        for key in gone:
            self.current -= self.live.pop(key)[1]

    # -- what a kernel costs ----------------------------------------------------------------------------------
    def launch(self, name: str, reads: list, writes: list, flops: int = 0) -> None:
        """Count one launch outside ATen (a fused backend stood in for, a Triton kernel): its tensors' bytes."""
        self.kernels += 1
        self.by_kernel[name] += 1
        self.bytes += sum(touched_bytes(t) for t in [*reads, *writes] if isinstance(t, torch.Tensor))
        self.flops += flops
        if not flops and name.startswith("triton "):
            self.flops_unknown[name] += 1

    def sync(self, what: str) -> None:
        at = _caller() if self.where else ""
        self.syncs[(what, at)] += 1
        if self.phase:
            self.phase_syncs[self.phase] += 1
            self.phase_where[(self.phase, what, at)] += 1

    @contextmanager
    def pause(self) -> Iterator[None]:
        """Ops inside are not counted (a stand-in computes a fused kernel's result; the stand-in counts the launch)."""
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        self.ops += 1
        what = SYNC_OPS.get(func)
        if what:
            self.sync(what)
        elif func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default) and _boolean_index(args):
            self.sync("boolean indexing")
        elif func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            self.sync("repeat_interleave without output_size")
        kernel = is_kernel(func)
        if kernel and self.timing:
            import time

            started = time.thread_time()
            out = func(*args, **kwargs)
            self.kernel_time_s += time.thread_time() - started
        else:
            out = func(*args, **kwargs)
        if kernel:
            self.kernels += 1
            self.by_kernel[func._schema.name] += 1
            self.bytes += op_bytes(func, args, kwargs, out)
            self.flops += _flops(func, args, kwargs, out)
            if func.namespace == "attnbench" and func._overloadpacket not in _flop_registry():
                self.flops_unknown[func._schema.name] += 1
        if self.storage:
            self._release()
            self.track(*[t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)])
        return out


def _boolean_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (indices or ()))


def _flop_registry() -> dict:
    from torch.utils.flop_counter import flop_registry

    return flop_registry


def _flops(func, args, kwargs, out) -> int:
    formula = _flop_registry().get(func._overloadpacket)
    if formula is None:
        return 0
    try:
        return int(formula(*args, **kwargs, out_val=out))
    except Exception:  # noqa: BLE001 - a formula that does not take this overload's arguments counts nothing
        return 0


# ---- SDPA as CUDA runs it -------------------------------------------------------------------------------------

def cuda_sdpa_backend(q: torch.Tensor, attn_mask: torch.Tensor | None, dropout_p: float = 0.0,
                      v: torch.Tensor | None = None) -> str:
    """The backend CUDA's SDPA picks for a bf16 call on an H100 (sm90): 'flash' without a mask where q, k and v have one
    head width, 'efficient' with a mask (a bias) or a v of another width, 'math' where a head width is not a multiple
    of 8 or passes 256 (the fused kernels' tiles; torch's sdp_utils checks)."""
    dims = {q.shape[-1], q.shape[-1] if v is None else v.shape[-1]}
    if any(dim % 8 or dim > 256 for dim in dims):
        return "math"
    return "flash" if attn_mask is None and len(dims) == 1 else "efficient"


class _FusedSDPA(torch.autograd.Function):
    """A fused SDPA backend's cost: one launch forward, reading q, k, v (and the bias) and writing the output and
    the logsumexp; saving those; one launch backward, reading them and the output's gradient, writing dq, dk, dv (and
    the bias's gradient where it needs one). The values are the CPU's SDPA's (not counted)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, is_causal, counter, backend):
        with counter.pause():
            out = _ORIGINAL_SDPA(q, k, v, attn_mask=mask, scale=scale, is_causal=is_causal)
            lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        counter.track(out, lse)
        lq, lk = q.shape[-2], k.shape[-2]
        flops = 4 * math.prod(q.shape[:-2]) * lq * lk * q.shape[-1]
        counter.launch(f"sdpa {backend} forward", [q, k, v, mask], [out, lse], flops)
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.scale, ctx.is_causal, ctx.counter, ctx.backend, ctx.flops = scale, is_causal, counter, backend, flops
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, mask, out, lse = ctx.saved_tensors
        counter = ctx.counter
        needs_mask = mask is not None and ctx.needs_input_grad[3]
        with counter.pause(), torch.enable_grad():
            inputs = [t.detach().requires_grad_() for t in (q, k, v)] + ([mask.detach().requires_grad_()] if needs_mask else [])
            recomputed = _ORIGINAL_SDPA(*inputs[:3], attn_mask=inputs[3] if needs_mask else mask, scale=ctx.scale,
                                        is_causal=ctx.is_causal)
            grads = torch.autograd.grad(recomputed, inputs, grad)
            # laid out as their inputs, as CUDA's fused backwards allocate them (empty_like of q, k, v): the CPU's
            # flash backward returns [B, L, H, d]-strided gradients, which autograd would copy into a contiguous
            # leaf's layout, a copy a GPU run does not make
            grads = tuple(g if g.stride() == t.stride() else torch.empty_like(t).copy_(g) for g, t in zip(grads, inputs))
        counter.track(*grads)
        full_shape = (*q.shape[:-1], k.shape[-2])
        if needs_mask and tuple(mask.shape) != full_shape:
            # CUDA's SDPA expands the bias to [B, H, Lq, Lk] before its memory-efficient kernel, whose backward writes
            # the bias's gradient at that size (one value per pair and sample: the kernel cannot sum over the batch;
            # attention_backward.cu); autograd's expand backward then sums it to the bias's own shape
            with counter.pause():
                full = q.new_empty(full_shape)
            counter.track(full)
            counter.launch(f"sdpa {ctx.backend} backward", [q, k, v, mask, out, lse, grad], [*grads[:3], full],
                           int(2.5 * ctx.flops))
            counter.launch("sum (the bias gradient to the bias's shape)", [full], [grads[3]])
            del full
            counter._release()
        else:
            counter.launch(f"sdpa {ctx.backend} backward", [q, k, v, mask, out, lse, grad], list(grads), int(2.5 * ctx.flops))
        return (*grads[:3], grads[3] if needs_mask else None, None, None, None, None)


_ORIGINAL_SDPA = torch.nn.functional.scaled_dot_product_attention


def _names_cuda(device) -> bool:
    return device is not None and not isinstance(device, int) and torch.device(device).type == "cuda"


def routed_sdpa(counter: CostCounter) -> Callable:
    """F.scaled_dot_product_attention as CUDA's would run it: fused backends through `_FusedSDPA`, the math path
    through ATen's math implementation, each op counted."""

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        backend = cuda_sdpa_backend(query, attn_mask, dropout_p, value)
        counter.sdpa_backends[backend] += 1
        if backend == "math":
            return aten._scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)[0]
        return _FusedSDPA.apply(query, key, value, attn_mask, scale, is_causal, counter, backend)

    return sdpa


class CudaSDPA(TorchFunctionMode):
    """SDPA as CUDA runs it (`routed_sdpa`, put in torch.nn.functional for the block: a module attribute, not this
    mode, so that checkpointing's recomputation in the backward, which runs without the forward's modes, routes the
    same way), and a tensor asked for on "cuda" by name made on the CPU, as the policy's other tensors are."""

    def __init__(self, counter: CostCounter):
        super().__init__()
        self.counter = counter

    def __enter__(self):
        torch.nn.functional.scaled_dot_product_attention = routed_sdpa(self.counter)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.nn.functional.scaled_dot_product_attention = _ORIGINAL_SDPA
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _names_cuda(kwargs.get("device")):  # a library allocating on "cuda" by name (AdaSplash's block indices)
            kwargs = {**kwargs, "device": "cpu"}
        host_read(self.counter, func, args, kwargs)
        return func(*args, **kwargs)


HOST_COPIES = {torch.Tensor.tolist: ".tolist()", torch.Tensor.numpy: ".numpy()", torch.Tensor.cpu: ".cpu()"}
"""Tensor methods that copy to the host: on a CPU tensor they dispatch no ATen op (the dispatch mode cannot see them),
on a GPU one each waits for the device."""


def host_read(counter: CostCounter, func, args, kwargs) -> None:
    """Count `func` as a sync where it copies a tensor to the host (HOST_COPIES). Not `.to(device)`: where the run's
    device is the CPU, a move to the run's device and a copy to the host look the same."""
    what = HOST_COPIES.get(func)
    if what is not None and not counter.paused:
        counter.sync(f"copy to the host ({what})")


class HostReads(TorchFunctionMode):
    """The host copies of HOST_COPIES counted as syncs (the dispatch mode counts every other read)."""

    def __init__(self, counter: CostCounter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        host_read(self.counter, func, args, kwargs)
        return func(*args, **kwargs)


# ---- Triton launches outside a custom op -----------------------------------------------------------------------------

@contextmanager
def triton_launches_counted(counter: CostCounter) -> Iterator[bool]:
    """Triton kernels launched directly inside (a plugin's own kernel, not wrapped in a custom op as the project's are:
    on fake tensors those run their fake forms and launch nothing) count as kernels with their tensor arguments' bytes,
    and do not run (there is no GPU). Yields whether Triton is here to patch."""
    try:
        from triton.runtime.jit import KernelInterface
    except ImportError:
        yield False
        return
    original = KernelInterface.__getitem__

    def name_of(kernel) -> str:
        while hasattr(kernel, "fn"):  # an autotuner or heuristics wraps the JIT function, which wraps the Python one
            kernel = kernel.fn
        return getattr(kernel, "__name__", "?")

    def getitem(self, grid):
        def launch(*args, **kwargs):
            tensors = [a for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)]
            counter.launch(f"triton {name_of(self)}", tensors, [])
        return launch

    KernelInterface.__getitem__ = getitem  # JITFunction, Autotuner and Heuristics all launch through it
    try:
        yield True
    finally:
        KernelInterface.__getitem__ = original


# ---- one variant's forward+backward ---------------------------------------------------------------------------------

@dataclass
class Count:
    variant: str
    length: int
    batch: int
    path: str = ""
    kernels: int = 0
    syncs: int = 0
    sync_where: dict = field(default_factory=dict)
    bytes: float = 0.0
    peak: float = 0.0
    saved: float = 0.0
    flops: float = 0.0
    flops_unknown: tuple = ()
    """Launches counted without FLOPs (Triton kernels no flop formula describes): the row's FLOPs leave them out."""
    method: str = "fake"
    """'fake' (fake tensors at the full shape) or 'real x<B·H>' (real tensors at B = H = 1, scaled)."""
    error: str = ""

    @property
    def flash_ideal(self) -> float:
        """FlashAttention's saved bytes: q, k, v, out [B, H, L, d] and the logsumexp [B, H, L], at bf16's size."""
        return (4 * self.batch * HEADS * self.length * DIM + self.batch * HEADS * self.length) * FLOAT_BYTES


def _build(name: str, heads: int = HEADS):
    from modules.attention import AttentionSite, build_attention

    torch.manual_seed(0)
    return build_attention({"name": name}, num_heads=heads, head_dim=DIM, site=AttentionSite("text", "self", sequence=True)).train()


def count_step(name: str, length: int, batch: int, *, fake: bool = True, heads: int = HEADS, where: bool = True) -> tuple[CostCounter, int, str]:
    """Count one forward+backward of variant `name` on the CUDA path: (counter, saved bytes, path)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.multiprocessing.reductions import StorageWeakRef

    from modules.attention import DenseGroups
    from modules.device_policy import behave_as_cuda

    kernel = _build(name, heads)
    counter = CostCounter(where=where)
    saved: dict[int, int] = {}

    in_backward = False

    def pack(t):
        # What the forward keeps: not a stand-in's own recomputation, nor what a recomputation in the backward
        # (checkpointed blocks, a replayed call) saves for its own backward. Those storages are made while the
        # forward's are being freed, so the allocator may reuse an address already counted, and the count would
        # change from run to run.
        if counter.paused or in_backward:
            return t
        try:
            saved.setdefault(StorageWeakRef(t.untyped_storage()).cdata, storage_bytes(t))
        except Exception:  # noqa: BLE001
            pass
        return t

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else nullcontext()
    gc.disable()
    try:
        with behave_as_cuda(), triton_launches_counted(counter), fake_mode:
            generator = None if fake else torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(batch, heads, length, DIM, generator=generator).requires_grad_() for _ in range(3))
            counter.track(q, k, v, *kernel.parameters(), *kernel.buffers())
            with counter, CudaSDPA(counter), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out, result = kernel(q, k, v, DenseGroups(), need_weights=False)
                # the output's gradient from upstream, and the aux losses' own: no loss graph of the page's own
                aux = [a for a in result.aux_losses.values() if a.requires_grad]
                upstream = torch.ones_like(out)
                in_backward = True
                torch.autograd.backward([out, *aux], [upstream, *(torch.ones_like(a) for a in aux)])
                del out, result, aux, upstream
                counter._release()
    finally:
        gc.enable()
        if fake:
            drop_cached_fakes()
    return counter, sum(saved.values()), kernel.last_path or "?"


def drop_cached_fakes() -> int:
    """Remove fake tensors that module-level caches (dicts) of the project's modules and plugins kept from a fake
    count: a later count would otherwise meet them (a real one reads a fake table; another fake mode refuses them).
    Returns how many entries went."""
    from torch._subclasses.fake_tensor import FakeTensor

    dropped = 0
    for name, module in list(sys.modules.items()):
        if not (name.startswith(("modules.", "datamodules.", "attnbench_plugin_"))) or module is None:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, dict):
                for key in [k for k, v in value.items() if any(isinstance(t, FakeTensor) for t in tree_flatten(v)[0])]:
                    del value[key]
                    dropped += 1
    return dropped


DATA_DEPENDENT = ("DataDependentOutput", "DynamicOutputShape", "GuardOnDataDependent", "UnsupportedOperator")


REAL_PEAK_LIMIT = 4e9
"""Past REAL_MAX_LENGTH, a count on real tensors (B = H = 1) runs only where the longest one counted before it
predicts at most this many bytes of float32 at the new L (its peak grown as L²): AdaSplash's rows, not fenchel-exact."""


def count_variant(name: str, length: int, batch: int, shorter: Count | None = None) -> Count:
    """`count_step` on fake tensors; where the code reads values, on real ones at B = H = 1, scaled by B x H (past
    REAL_MAX_LENGTH only where `shorter`, its count at a shorter L, predicts it fits: REAL_PEAK_LIMIT)."""
    row = Count(name, length, batch)
    try:
        counter, saved, path = count_step(name, length, batch)
        scale = 1
    except Exception as exc:  # noqa: BLE001
        if not any(kind in type(exc).__name__ for kind in DATA_DEPENDENT):
            traceback.print_exc(limit=4)
            row.error = f"{type(exc).__name__}: {str(exc)[:100]}"
            return row
        fits = (shorter is not None and not shorter.error and shorter.method != "fake"
                and shorter.peak / (shorter.batch * HEADS) * (4 / FLOAT_BYTES) * (length / shorter.length) ** 2 <= REAL_PEAK_LIMIT)
        if length > REAL_MAX_LENGTH and not fits:
            row.error = f"reads values (needs real tensors), too large for this machine past L = {REAL_MAX_LENGTH}"
            return row
        try:
            counter, saved, path = count_step(name, length, 1, fake=False, heads=1)
        except Exception as real_exc:  # noqa: BLE001
            traceback.print_exc(limit=4)
            row.error = f"{type(real_exc).__name__}: {str(real_exc)[:100]}"
            return row
        scale = batch * HEADS
        row.method = f"real ×{scale}"
    ours = any(name.startswith("attnbench::") for name in counter.by_kernel)
    # a torch-form path that also ran Triton kernels of ours (align's regulariser beside SDPA's attention): another
    # workload than the same path without them, which a page measured before those kernels existed did not run
    row.path = f"{path}+triton" if ours and path in ("sdpa", "eager", "blocked") else path
    row.kernels = counter.kernels
    row.syncs = sum(counter.syncs.values())
    row.sync_where = {f"{what} at {where}": n for (what, where), n in sorted(counter.syncs.items())}
    row.bytes, row.peak, row.saved, row.flops = (counter.bytes * scale, counter.peak * scale, saved * scale,
                                                 counter.flops * scale)
    row.flops_unknown = tuple(sorted(counter.flops_unknown))
    return row


def variants_to_count(pattern: str | None) -> list[str]:
    from modules.attention import list_attentions

    names = sorted(list_attentions())
    if pattern:
        wanted = [p.strip() for p in pattern.split(",") if p.strip()]
        unknown = [p for p in wanted if p not in names]
        if unknown:
            raise SystemExit(f"gpu-cost: unknown variant(s) {', '.join(unknown)}; registered: {', '.join(names)}")
        names = wanted
    return ["softmax", *[n for n in names if n != "softmax"]]


# ---- Cora: a lone epoch and a seed batch's ---------------------------------------------------------------------

CORA_EPOCHS = (10, 14)
"""Each Cora figure is the difference of runs of these lengths, per epoch: the epochs alone, without the run's setup,
data load, sanity check and test pass. Epochs 10-13 measure no validation diagnostics (those are the first 8 epochs
and every 8th after: modules/lit/attention_terms.diagnosed_validation), as nearly every epoch of a long fit does not;
a paper-gat fit runs hundreds of epochs."""
CORA_SEEDS = 20


@contextmanager
def training_steps_marked(counter: CostCounter) -> Iterator[None]:
    """Syncs between Lightning's on_train_batch_start and on_train_batch_end of the node-classification module (the
    forward, backward and optimiser step of one training step) count under the phase 'training step'."""
    from modules.lit.node_classification import NodeClassificationModule

    saved = {name: NodeClassificationModule.__dict__.get(name) for name in ("on_train_batch_start", "on_train_batch_end")}
    base_start, base_end = NodeClassificationModule.on_train_batch_start, NodeClassificationModule.on_train_batch_end

    def start(self, *args, **kwargs):
        counter.phase = "training step"
        return base_start(self, *args, **kwargs)

    def end(self, *args, **kwargs):
        counter.phase = ""
        return base_end(self, *args, **kwargs)

    NodeClassificationModule.on_train_batch_start, NodeClassificationModule.on_train_batch_end = start, end
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                delattr(NodeClassificationModule, name)
            else:
                setattr(NodeClassificationModule, name, value)


def _lone_run(epochs: int, data_root: str | None, variant: str = "softmax") -> None:
    from harness.plan.spec import make_spec
    from harness.run import runner

    record = runner.execute(make_spec("cora", variant, 0, {"max_epochs": epochs, "patience": epochs + 1}), data_root=data_root)
    if record.error:
        raise RuntimeError(record.error)


def _batch_run(epochs: int, data_root: str | None, seeds: int, variant: str = "softmax") -> None:
    """A Cora seed batch's training loop (built as `execute_batch` builds it; no test pass)."""
    import lightning as L

    from modules.tasks import get_task

    task = get_task("cora")
    params = task.params({"max_epochs": epochs, "patience": epochs + 1})
    modules, datamodule = [], None
    for seed in range(seeds):
        L.seed_everything(seed, verbose=False)
        dm, module = task.build(params, variant, data_root=data_root, cache_dir=None)
        datamodule = datamodule or dm
        modules.append(module)
    errors = []
    task.train_seed_batch(params, datamodule, modules, [task.stopping_rule(params) for _ in modules],
                          lambda outcome: errors.append(outcome.error) if outcome.error else None)
    if errors:
        raise RuntimeError(errors[0])


@dataclass
class EpochCount:
    """Per epoch (the difference of two run lengths): ops dispatched, kernels, syncs and where, syncs inside training
    steps."""

    ops: float
    kernels: float
    syncs: float
    step_syncs: float
    where: dict
    step_where: dict = field(default_factory=dict)


def count_epochs(run: Callable[[int], None], epochs: tuple[int, int] = CORA_EPOCHS) -> EpochCount:
    """Count `run(n)` (a fit of n epochs) on the CUDA path at both lengths; per epoch of the difference."""
    from modules.device_policy import behave_as_cuda

    with behave_as_cuda():  # once uncounted: what a process builds on its first run (cached tables) is not an epoch's
        run(epochs[0])
    counters = []
    for n in epochs:
        counter = CostCounter(where=True, storage=False)
        with behave_as_cuda(), training_steps_marked(counter), counter, HostReads(counter):
            run(n)
        counters.append(counter)
    short, long = counters
    extra = epochs[1] - epochs[0]
    where = {f"{what} at {at}": (long.syncs[(what, at)] - short.syncs.get((what, at), 0)) / extra
             for (what, at) in sorted(long.syncs) if long.syncs[(what, at)] != short.syncs.get((what, at), 0)}
    step_where = {f"{what} at {at}": (n - short.phase_where.get((phase, what, at), 0)) / extra
                  for (phase, what, at), n in sorted(long.phase_where.items())
                  if phase == "training step" and n != short.phase_where.get((phase, what, at), 0)}
    return EpochCount(ops=(long.ops - short.ops) / extra, kernels=(long.kernels - short.kernels) / extra,
                      syncs=(sum(long.syncs.values()) - sum(short.syncs.values())) / extra,
                      step_syncs=(long.phase_syncs["training step"] - short.phase_syncs["training step"]) / extra, where=where,
                      step_where=step_where)


HOST_TIME_EPOCHS = (10, 60)
"""The host-time figure's two run lengths: 50 epochs between them (about 1.7 s of work on this CPU) against a run's
setup, whose cost moves by some 100 ms from run to run; CORA_EPOCHS' 4 epochs between were lost in it (its figure
swung from -9 to 16 ms). The epochs between include every 8th's diagnosed validation, as a long fit's do."""
HOST_TIME_REPEATS = 3


def host_time_ms(data_root: str | None, epochs: tuple[int, int] = HOST_TIME_EPOCHS,
                 repeats: int = HOST_TIME_REPEATS) -> tuple[float, float, list[float]]:
    """(CPU ms per lone epoch without the counter, CPU ms inside kernels, each repeat's difference of the two), one
    thread, on the CUDA path, each from two run lengths, medians of `repeats` alternated runs. The host's own time
    outside kernels is about the first less the second: a difference of separate runs, rough on a loaded machine.
    Depends on the machine: printed, never on the page."""
    import statistics
    import time

    from modules.device_policy import behave_as_cuda

    with behave_as_cuda():
        _lone_run(epochs[0], data_root)  # warm: cached tables built
    plain, kernels = [], []
    for _ in range(repeats):
        took, inside = [], []
        for n in epochs:
            with behave_as_cuda():
                started = time.thread_time()
                _lone_run(n, data_root)
                took.append(time.thread_time() - started)
            counter = CostCounter(where=False, storage=False)
            counter.timing = True
            with behave_as_cuda(), counter:
                _lone_run(n, data_root)
            inside.append(counter.kernel_time_s)
        plain.append((took[1] - took[0]) / (epochs[1] - epochs[0]) * 1000)
        kernels.append((inside[1] - inside[0]) / (epochs[1] - epochs[0]) * 1000)
    outside = [a - b for a, b in zip(plain, kernels)]
    return statistics.median(plain), statistics.median(kernels), outside


# ---- the page -------------------------------------------------------------------------------------------------------

GOAL_BYTES = [  # (variants, the most bytes touched × SDPA at L = 512)
    (("fenchel", "gmm", "align-gan", "align-ct", "align-ot"), 1.3),
    (("bam-weibull", "bam-lognormal"), 2.0),
    (("sparsemax", "entmax15"), 2.5),
    (("entmax",), 4.0),
]
GOAL_PEAK = 1.5
GOAL_SAVED = 1.5
CARD_BYTES = 80e9
"""An 80 GB card: every variant but fenchel-exact must fit at L = 8192, B = 4."""
EXEMPT = ("fenchel-exact",)
"""Exact Fenchel-Young attention's Newton solve: exempt from the memory and sync goals (the issue's own rule)."""
CORA_GOALS = {"ops": 300, "step_syncs": 0, "epoch_syncs": 2, "batch_ratio": 2.5}


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f}"


def _ratio(x: float, base: float) -> str:
    return f"{x / base:.2f}" if base else ""


def _base(rows: list[Count]) -> Count | None:
    return next((r for r in rows if r.variant == "softmax" and not r.error), None)


def dense_table(rows: list[Count], length: int, batch: int) -> list[str]:
    lines = [f"### L = {length}, B = {batch}", "",
             "| variant | path | kernels | host syncs | bytes touched GB | × SDPA | peak live GB | × SDPA | saved GB | × flash | GFLOP | × SDPA | counted |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    base = _base(rows)
    for r in rows:
        if r.error:
            lines.append(f"| {r.variant} | | | | | | | | | | | | {r.error.replace('|', '/')} |")
            continue
        lines.append(f"| {r.variant} | {r.path} | {r.kernels} | {r.syncs} | {_gb(r.bytes)} | {_ratio(r.bytes, base.bytes if base else 0)} | "
                     f"{_gb(r.peak)} | {_ratio(r.peak, base.peak if base else 0)} | {_gb(r.saved)} | {r.saved / r.flash_ideal:.2f} | "
                     f"{_gflop(r)} | {'' if r.flops_unknown else _ratio(r.flops, base.flops if base else 0)} | {r.method} |")
    return lines


def _gflop(r: Count) -> str:
    """The row's GFLOP, or what it leaves out: a Triton launch no flop formula describes."""
    return f"{r.flops / 1e9:.1f}" if not r.flops_unknown else f"{r.flops / 1e9:.1f} + Triton's (not counted)"


def sync_lines(rows: list[Count]) -> list[str]:
    """Where each host sync of the L = 512 counts was asked for, and what the variant declares about it."""
    from modules.attention import attention_entry

    lines = []
    for r in rows:
        if not r.sync_where:
            continue
        why = _declared_why(r.variant)
        lines.append(f"- {r.variant}: " + "; ".join(f"{n} × {where}" for where, n in r.sync_where.items())
                     + (f". Declared: {why}" if why else ". Not declared (`host_syncs_why`)"))
    return lines or ["- none"]


def _declared_why(name: str) -> str | None:
    try:
        return getattr(_build(name), "host_syncs_why", None)
    except Exception:  # noqa: BLE001
        return None


def goal_rows(counts: dict[tuple[str, int], Count], cora: dict | None) -> list[tuple[str, str, str]]:
    """(goal, figure, 'met' / 'NOT met' / 'not counted') for each of the page's goals."""
    out = []

    def get(name, length):
        row = counts.get((name, length))
        return row if row is not None and not row.error else None

    base512, base2048 = get("softmax", 512), get("softmax", 2048)
    for names, limit in GOAL_BYTES:
        for name in names:
            row = get(name, 512)
            if row is None or base512 is None:
                out.append((f"{name}: bytes touched ≤ {limit}× SDPA at L = 512", "", "not counted"))
                continue
            ratio = row.bytes / base512.bytes
            out.append((f"{name}: bytes touched ≤ {limit}× SDPA at L = 512", f"{ratio:.2f}×", "met" if ratio <= limit else "NOT met"))
    names = sorted({name for name, _ in counts} - {"softmax", *EXEMPT})
    for length, base in ((512, base512), (2048, base2048)):
        for name in names:
            row = get(name, length)
            if row is None or base is None:
                out.append((f"{name}: peak live ≤ {GOAL_PEAK}× SDPA at L = {length}", "", "not counted"))
                continue
            ratio = row.peak / base.peak
            out.append((f"{name}: peak live ≤ {GOAL_PEAK}× SDPA at L = {length}", f"{ratio:.2f}×", "met" if ratio <= GOAL_PEAK else "NOT met"))
    for name in names:
        row = get(name, 8192)
        figure = "" if row is None else f"{row.peak / 1e9:.1f} GB"
        out.append((f"{name}: fits an 80 GB card at L = 8192, B = 4 (peak live)", figure,
                    "not counted" if row is None else "met" if row.peak <= CARD_BYTES else "NOT met"))
    for name in names:
        row = get(name, 2048)
        # the goal's "SDPA path": every flash-style path, SDPA's and the Triton kernels' that stand in for it
        if row is None or row.path in ("eager", "blocked", "?", ""):
            continue
        ratio = row.saved / row.flash_ideal
        out.append((f"{name} ({row.path} path): saved for backward ≤ {GOAL_SAVED}× flash's ideal at L = 2048", f"{ratio:.2f}×",
                    "met" if ratio <= GOAL_SAVED else "NOT met"))
    for name in names:
        rows = [get(name, length) for length, _ in DENSE]
        counted = [r for r in rows if r is not None]
        if not counted:
            out.append((f"{name}: 0 host syncs in a forward+backward", "", "not counted"))
            continue
        most = max(r.syncs for r in counted)
        out.append((f"{name}: 0 host syncs in a forward+backward", f"{most}", "met" if most == 0 else "NOT met"))
    if cora is None:
        out.append(("Cora (lone epoch ≤ 300 ops, 0 syncs per training step, ≤ 2 per epoch; 20-seed batch ≤ 2.5× a lone epoch's ops)", "", "not counted"))
        return out
    lone, batch = cora["lone"], cora["batch"]
    out.append((f"Cora: a lone softmax epoch ≤ {CORA_GOALS['ops']} ops", f"{lone.ops:.0f}", "met" if lone.ops <= CORA_GOALS["ops"] else "NOT met"))
    out.append(("Cora: 0 host syncs in a training step", f"{lone.step_syncs:g}", "met" if lone.step_syncs == 0 else "NOT met"))
    out.append((f"Cora: ≤ {CORA_GOALS['epoch_syncs']} host syncs in a lone epoch", f"{lone.syncs:g}",
                "met" if lone.syncs <= CORA_GOALS["epoch_syncs"] else "NOT met"))
    ratio = batch.ops / lone.ops
    out.append((f"Cora: a {CORA_SEEDS}-seed batch epoch ≤ {CORA_GOALS['batch_ratio']}× a lone epoch's ops", f"{ratio:.2f}×",
                "met" if ratio <= CORA_GOALS["batch_ratio"] else "NOT met"))
    out.append(("Cora: host CPU time per lone epoch (outside kernels, one thread) ≤ 5 ms", "",
                "not on this page (machine-dependent: `--host-time` prints it)"))
    return out


# ---- the measured page beside the prediction ------------------------------------------------------------------------

def measured_pages(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.md") if p.name != "README.md")


def read_measured(page: Path) -> dict[tuple[int, str], dict]:
    """{(L, variant): {"path", "ms_ratio", "peak_ratio"}} from a gpu-perf page's dense table (bf16 columns)."""
    found, length = {}, None
    for line in page.read_text().splitlines():
        heading = re.match(r"### L = (\d+), B = (\d+)", line)
        if heading:
            length = int(heading.group(1))
            continue
        if length is None or not line.startswith("| ") or line.startswith("| variant") or line.startswith("|---"):
            if line.startswith("## ") and not line.startswith("## (b)"):
                length = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 8:
            continue

        def number(text):
            try:
                return float(text)
            except ValueError:
                return None

        # a page with the cost page's prediction beside each row names the path counted for its own commit's code
        found[(length, cells[0])] = {"path": cells[1], "ms_ratio": number(cells[3]), "peak_ratio": number(cells[7]),
                                     "path_counted": cells[8] if len(cells) >= 11 else None}
    return found


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None under three pairs."""
    if len(xs) < 3:
        return None

    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for m in range(i, j + 1):
                out[order[m]] = (i + j) / 2 + 1
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else None


def comparison_lines(counts: dict[tuple[str, int], Count], page: Path) -> list[str]:
    measured = read_measured(page)
    lines = [f"### Beside {page.stem} (`leaderboards/gpu-perf/{page.name}`)", "",
             "Measured: that page's bf16 time and peak memory as × SDPA softmax. Predicted: this page's bytes touched and "
             "peak live bytes as × SDPA. A row is comparable where the path measured is the path counted here (the "
             "variants changed since the page was measured; '+triton': a torch path beside Triton kernels of ours, such "
             "as align's regulariser, which a page measured before them did not run; a page that sets the cost page's "
             "prediction beside each row is read by the path counted for its own code); Spearman's rank correlation is "
             "over the comparable rows "
             "of each L.", ""]
    for length, batch in DENSE:
        base = counts.get(("softmax", length))
        rows = [(name, r) for (name, L), r in sorted(counts.items()) if L == length and not r.error and (length, name) in measured]
        if not rows or base is None or base.error:
            continue
        lines += [f"L = {length}, B = {batch}", "",
                  "| variant | path counted | path measured | bytes × (predicted) | time × (measured) | peak × (predicted) | peak × (measured) |",
                  "|---|---|---|---:|---:|---:|---:|"]
        pairs_time, pairs_peak = [], []
        for name, r in sorted(rows, key=lambda item: (item[0] != "softmax", item[0])):
            m = measured[(length, name)]
            bytes_ratio, peak_ratio = r.bytes / base.bytes, r.peak / base.peak
            # comparable: the workload measured is the one counted here (for a page without its own prediction,
            # the path it measured; with one, the path counted for the code it measured)
            same = (m["path_counted"] or m["path"]) == r.path
            if same and m["ms_ratio"] is not None:
                pairs_time.append((bytes_ratio, m["ms_ratio"]))
            if same and m["peak_ratio"] is not None:
                pairs_peak.append((peak_ratio, m["peak_ratio"]))
            fmt = lambda x: "" if x is None else f"{x:.2f}"  # noqa: E731
            lines.append(f"| {name} | {r.path} | {m['path'] or 'not run'} | {bytes_ratio:.2f} | {fmt(m['ms_ratio'])} | "
                         f"{peak_ratio:.2f} | {fmt(m['peak_ratio'])} |")
        rho_t = spearman(*zip(*pairs_time)) if len(pairs_time) >= 3 else None
        rho_p = spearman(*zip(*pairs_peak)) if len(pairs_peak) >= 3 else None
        lines += ["", f"Spearman, bytes touched against time: {'%.2f' % rho_t if rho_t is not None else 'fewer than 3 comparable rows'} "
                      f"({len(pairs_time)} rows); peak live against peak memory: {'%.2f' % rho_p if rho_p is not None else 'fewer than 3 comparable rows'} "
                      f"({len(pairs_peak)} rows).", ""]
    return lines


# ---- writing ----------------------------------------------------------------------------------------------------------

CSV_FIELDS = ["variant", "length", "batch", "path", "kernels", "host_syncs", "bytes_touched", "bytes_x_sdpa", "peak_live_bytes",
              "peak_x_sdpa", "saved_bytes", "saved_x_flash", "flops", "flops_x_sdpa", "counted", "error"]


def csv_text(counts: dict[tuple[str, int], Count]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for length, _ in DENSE:
        rows = [r for (name, L), r in counts.items() if L == length]
        base = _base(rows)
        for r in rows:
            if r.error:
                writer.writerow({"variant": r.variant, "length": r.length, "batch": r.batch, "error": r.error})
                continue
            writer.writerow({"variant": r.variant, "length": r.length, "batch": r.batch, "path": r.path, "kernels": r.kernels,
                             "host_syncs": r.syncs, "bytes_touched": int(r.bytes), "bytes_x_sdpa": _ratio(r.bytes, base.bytes if base else 0),
                             "peak_live_bytes": int(r.peak), "peak_x_sdpa": _ratio(r.peak, base.peak if base else 0),
                             "saved_bytes": int(r.saved), "saved_x_flash": f"{r.saved / r.flash_ideal:.2f}", "flops": int(r.flops),
                             "flops_x_sdpa": "" if r.flops_unknown else _ratio(r.flops, base.flops if base else 0),
                             "counted": r.method, "error": ""})
    return out.getvalue()


def page_text(counts: dict[tuple[str, int], Count], cora: dict | None, measured: list[Path]) -> str:
    goals = goal_rows(counts, cora)
    met = sum(1 for _, _, verdict in goals if verdict == "met")
    missed = sum(1 for _, _, verdict in goals if verdict == "NOT met")
    lines = ["# GPU cost, counted on the CPU", "",
             "What a GPU would run for each variant, counted on the CPU with every device branch on its CUDA form "
             "(`modules.device_policy.behave_as_cuda`) by a dispatch mode below autograd (`harness/studies/gpu_cost.py` says "
             "how), on fake tensors (FakeTensorMode), where the project's Triton kernels run as on a GPU with Triton: each "
             "launch a custom op (`attnbench::*`) whose fake form gives its outputs (real CPU tensors keep the torch forms, "
             "as a Triton kernel cannot run on them). No time is measured: every figure is a count, the same on every machine. Regenerate with `make gpu-cost`.", "",
             f"Goals: {met} met, {missed} not met, of {len(goals)}.", "",
             "## Goals", "", "| goal | figure | verdict |", "|---|---:|---|"]
    lines += [f"| {goal} | {figure} | {verdict} |" for goal, figure, verdict in goals]
    lines += ["", "## Dense forward+backward", "",
              f"H = {HEADS}, d = {DIM}, no mask, `need_weights=False`, training mode; one forward and one backward (the output's "
              "gradient from upstream, the aux losses' own). Bytes at bf16's 2 bytes a floating element. Kernels: ATen ops that "
              "launch work, fused SDPA as one launch each way, Triton launches. Saved × flash: bytes kept for the backward over "
              "FlashAttention's q, k, v, out and logsumexp. Counted 'real ×N': on real tensors at B = H = 1 (the variant's code "
              "reads values, which fake tensors cannot give), its bytes, peak, saved bytes and FLOPs × N = B·H. A kernel's bytes "
              "are what it reads and writes once each (a tensor only written, or only its shape read, counts once; a gather "
              "reads what it returns; a scatter reads and writes where its source lands); a Triton launch (a custom op, "
              "`attnbench::*`) counts its arguments read and its results (or the buffers it fills) written once, so that a "
              "kernel that passes over its inputs several times (AdaSplash's and the learned-α kernel's τ searches) is counted "
              "at its floor. GFLOP: ATen's flop formulas, and a Triton launch's where its module registers one; a row marked "
              "'Triton's (not counted)' leaves out launches without one. Fused SDPA's gradients come back in q, k and v's "
              "layout, as on CUDA.", ""]
    for length, batch in DENSE:
        rows = [r for (name, L), r in counts.items() if L == length]
        if rows:
            lines += dense_table(rows, length, batch) + [""]
    lines += ["Host syncs at L = 512, where asked for:", ""]
    lines += sync_lines([r for (name, L), r in counts.items() if L == 512 and not r.error]) + [""]
    if cora is not None:
        lone, batch = cora["lone"], cora["batch"]
        first, last = CORA_EPOCHS
        lines += ["## Cora, softmax", "",
                  f"Per epoch on the CUDA path: a {last}-epoch run less a {first}-epoch one, over the {last - first} epochs between "
                  f"(epochs whose validation measures no diagnostics, as nearly all of a long fit's do). The "
                  f"lone run is `attnbench run`'s (the runner's Lightning loop: training step, validation pass); the batch is "
                  f"{CORA_SEEDS} seeds in the seed batch's own loop. Ops: every ATen op dispatched; kernels: those that launch work.", "",
                  "| run | ops per epoch | kernels | host syncs per epoch | of which in training steps |", "|---|---:|---:|---:|---:|",
                  f"| lone epoch | {lone.ops:.1f} | {lone.kernels:.1f} | {lone.syncs:g} | {lone.step_syncs:g} |",
                  f"| {CORA_SEEDS}-seed batch epoch | {batch.ops:.1f} | {batch.kernels:.1f} | {batch.syncs:g} | {batch.step_syncs:g} |",
                  f"| batch ÷ lone | {batch.ops / lone.ops:.2f}× | {batch.kernels / lone.kernels:.2f}× | | |", "",
                  "Host syncs per epoch, where asked for:", ""]
        for label, found in (("lone", lone), ("batch", batch)):
            lines += [f"- {label}: " + ("; ".join(f"{n:g} × {where}" for where, n in found.where.items()) or "none")]
            if found.step_where:
                lines += [f"  - of which in training steps: " + "; ".join(f"{n:g} × {where}" for where, n in found.step_where.items())]
        lines += ["", "The host's CPU time outside kernels is not on this page: it depends on the machine. "
                  "`python -m harness.studies.gpu_cost --host-time` prints it.", ""]
    if measured:
        lines += ["## Predicted beside measured", ""]
        for page in measured:
            lines += comparison_lines(counts, page)
        lines += ["The H100 page's seed batch (its section (c)) printed each seed's share of a batch epoch as the batch epoch: "
                  "its \"12.4 ms (all 20 seeds)\" is the share, so the batch epoch was about 248 ms and its \"63.6× by epoch\" "
                  "about 3.2×. gpu-perf now prints both, each named (`gpu_perf.batch_epoch_figures`).", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=None, help="comma-separated variants (softmax, the ratios' base, is always counted)")
    parser.add_argument("--lengths", default=None, help="comma-separated L among 512,2048,8192")
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE.py", help="a plugin file that registers variants (repeatable)")
    parser.add_argument("--no-cora", action="store_true", help="leave out the Cora epochs")
    parser.add_argument("--host-time", action="store_true", help="also print the host's CPU time per lone Cora epoch (machine-dependent)")
    parser.add_argument("--data-root", default=os.environ.get("ATTNBENCH_DATA"))
    parser.add_argument("--out", default=None, help="write gpu-cost.{md,csv} here (a full run's page: leaderboards)")
    args = parser.parse_args(argv)

    from modules.registry import load_plugin_file

    for plugin in args.plugin:
        load_plugin_file(plugin)
    torch.set_num_threads(1)
    names = variants_to_count(args.variants)
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else [L for L, _ in DENSE]
    shapes = [(L, B) for L, B in DENSE if L in lengths]
    if len(shapes) != len(lengths):
        raise SystemExit(f"gpu-cost: --lengths takes values among {', '.join(str(L) for L, _ in DENSE)}")
    partial = bool(args.variants or args.lengths or args.plugin)
    counts: dict[tuple[str, int], Count] = {}
    for length, batch in shapes:
        for name in names:
            shorter = [counts[(name, L)] for L, _ in shapes if L < length and (name, L) in counts]
            counts[(name, length)] = count_variant(name, length, batch, shorter[-1] if shorter else None)
        print("\n".join(dense_table([counts[(n, length)] for n in names], length, batch)), flush=True)
        for name in names:
            for where, n in counts[(name, length)].sync_where.items():
                print(f"  {name}: {n} × {where}")
        print()
    cora = None
    if not args.no_cora and not partial:
        from harness.run.runner import quiet_lightning

        quiet_lightning()
        cora = {"lone": count_epochs(lambda n: _lone_run(n, args.data_root)),
                "batch": count_epochs(lambda n: _batch_run(n, args.data_root, CORA_SEEDS))}
        print(f"Cora lone epoch: {cora['lone']}\nCora {CORA_SEEDS}-seed batch epoch: {cora['batch']}", flush=True)
    if args.host_time:
        from harness.run.runner import quiet_lightning

        quiet_lightning()
        plain, kernels, outside = host_time_ms(args.data_root)
        first, last = HOST_TIME_EPOCHS
        print(f"host CPU per lone Cora epoch on the CUDA path (one thread, this machine, kernels run on the CPU; a {last}-epoch "
              f"run less a {first}-epoch one, median of {len(outside)}): {plain:.1f} ms; inside kernels {kernels:.1f} ms (timed "
              f"in other runs, under the counter); outside kernels ≈ {plain - kernels:.1f} ms (each repeat: "
              f"{', '.join(f'{x:.1f}' for x in outside)}), a difference of separate runs: rough on a loaded machine")
    measured = measured_pages(Path(REPO) / "leaderboards" / "gpu-perf")
    text = page_text(counts, cora, measured)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu-cost.md").write_text(text)
        (out / "gpu-cost.csv").write_text(csv_text(counts))
        print(f"gpu-cost: written to {out / 'gpu-cost.md'} and {out / 'gpu-cost.csv'}")
    elif not partial:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
