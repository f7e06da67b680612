"""`make gpu-cost`: what a GPU would run, counted on the CPU.

For each registered variant (and a plugin's: `--plugin my_variant.py`), one forward+backward on the path a CUDA
run takes (`modules.device_policy.behave_as_cuda`: every device branch forced to its CUDA form on CPU tensors), at
the gpu-perf shapes (H = 12, d = 64; L = 512 and 2048 at B = 32, L = 8192 at B = 4, as `gpu_perf.DENSE`), counted
by a dispatch mode below autograd (`CostCounter`):

- kernels launched: every ATen op that launches work (views, metadata and allocations are not kernels), and each
  Triton launch (AdaSplash's kernels), with its tensor arguments' bytes;
- host syncs: every op that must read the device on the host (`.item()`, `bool(t)`, nonzero, boolean indexing,
  ...: the list of tests/modules/host_syncs.py), with the line that asked for it;
- bytes touched: the sum over kernels of their input and output tensors' bytes (a broadcast dimension counts once);
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
with what it reads and writes, and saves q, k, v, the bias, out and the logsumexp.

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


def is_kernel(func) -> bool:
    """Whether an ATen op launches device work (a view or an allocation does not)."""
    if func.namespace not in ("aten", "prims"):
        return False
    name = func._schema.name
    if name in NOT_KERNELS or name.startswith("prim::"):
        return False
    return not func.is_view


def element_bytes(dtype: torch.dtype) -> int:
    if dtype in (torch.float32, torch.bfloat16, torch.float16):
        return FLOAT_BYTES
    return torch.empty((), dtype=dtype, device="meta").element_size()


def touched_bytes(t: torch.Tensor) -> int:
    """Bytes of `t`'s distinct elements: a broadcast (stride-0) dimension is read once."""
    size = 1
    for n, s in zip(t.shape, t.stride()):
        if s != 0:
            size *= int(n)
    return size * element_bytes(t.dtype)


def storage_bytes(t: torch.Tensor) -> int:
    storage = t.untyped_storage()
    return storage.nbytes() // t.element_size() * element_bytes(t.dtype)


def _caller() -> str:
    """The innermost project frame outside this file and torch: where a sync was asked for."""
    import traceback as tb

    for frame in reversed(tb.extract_stack()[:-2]):
        name = frame.filename
        if "site-packages" in name or name.endswith("gpu_cost.py") or "/torch/" in name or "<" in name:
            continue
        return f"{name.removeprefix(REPO)}:{frame.lineno}"
    return "?"


class CostCounter(TorchDispatchMode):
    """Counts kernels, host syncs, bytes touched, live and peak storage, and FLOPs of the ops below autograd."""

    def __init__(self, where: bool = True):
        super().__init__()
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

    # -- storage ----------------------------------------------------------------------------------------------
    def track(self, *tensors: Any) -> None:
        """Count these tensors' storages as live from now on (inputs, and what a counted fused kernel allocates)."""
        from torch.multiprocessing.reductions import StorageWeakRef

        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            try:
                ref = StorageWeakRef(t.untyped_storage())
            except Exception:  # noqa: BLE001 - a tensor without storage (a nested or sparse one) is not tracked
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

    def sync(self, what: str) -> None:
        self.syncs[(what, _caller() if self.where else "")] += 1

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
            inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            self.kernels += 1
            self.by_kernel[func._schema.name] += 1
            self.bytes += sum(touched_bytes(t) for t in inputs + outputs)
            self.flops += _flops(func, args, kwargs, out)
        self._release()
        self.track(*[t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)])
        return out


def _boolean_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (indices or ()))


def _flops(func, args, kwargs, out) -> int:
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry.get(func._overloadpacket)
    if formula is None:
        return 0
    try:
        return int(formula(*args, **kwargs, out_val=out))
    except Exception:  # noqa: BLE001 - a formula that does not take this overload's arguments counts nothing
        return 0


# ---- SDPA as CUDA runs it -------------------------------------------------------------------------------------

def cuda_sdpa_backend(q: torch.Tensor, attn_mask: torch.Tensor | None, dropout_p: float = 0.0) -> str:
    """The backend CUDA's SDPA picks for a bf16 call on an H100 (sm90): 'flash' without a mask, 'efficient' with one
    (a bias), 'math' where the head dimension is not a multiple of 8 or passes 256 (the fused kernels' tiles)."""
    dim = q.shape[-1]
    if dim % 8 or dim > 256:
        return "math"
    return "flash" if attn_mask is None else "efficient"


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
        counter.track(*grads)
        counter.launch(f"sdpa {ctx.backend} backward", [q, k, v, mask, out, lse, grad], list(grads), int(2.5 * ctx.flops))
        return (*grads[:3], grads[3] if needs_mask else None, None, None, None, None)


_ORIGINAL_SDPA = torch.nn.functional.scaled_dot_product_attention


def _names_cuda(device) -> bool:
    return device is not None and not isinstance(device, int) and torch.device(device).type == "cuda"


class CudaSDPA(TorchFunctionMode):
    """Routes F.scaled_dot_product_attention as CUDA's would: fused backends through `_FusedSDPA`, the math path
    through ATen's math implementation, each op counted. A tensor asked for on "cuda" by name is made on the CPU,
    as the policy's other tensors are."""

    def __init__(self, counter: CostCounter):
        super().__init__()
        self.counter = counter
        self.backends: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not _ORIGINAL_SDPA:
            if _names_cuda(kwargs.get("device")):  # a library allocating on "cuda" by name (AdaSplash's block indices)
                kwargs = {**kwargs, "device": "cpu"}
            return func(*args, **kwargs)
        q, k, v = args[:3]
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        dropout_p = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
        is_causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
        scale = kwargs.get("scale")
        backend = cuda_sdpa_backend(q, mask, dropout_p)
        self.backends[backend] += 1
        if backend == "math":
            return aten._scaled_dot_product_attention_math(q, k, v, mask, dropout_p, is_causal, scale=scale)[0]
        return _FusedSDPA.apply(q, k, v, mask, scale, is_causal, self.counter, backend)


# ---- Triton launches (AdaSplash) ----------------------------------------------------------------------------------

@contextmanager
def triton_launches_counted(counter: CostCounter) -> Iterator[bool]:
    """Triton kernels launched inside count as kernels with their tensor arguments' bytes, and do not run (there is
    no GPU). Yields whether Triton is here to patch."""
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


@contextmanager
def library_kernels_as_on_cuda(counter: CostCounter) -> Iterator[None]:
    """Where AdaSplash is installed, α-entmax's library form is built as on a GPU (entmax.py builds it only where it
    can run): the page then counts the path a GPU with the same packages takes."""
    try:
        from adasplash import adasplash_v1
    except ImportError:
        yield
        return
    from modules.attention.variants import entmax

    previous = entmax._adasplash_reference
    with triton_launches_counted(counter) as patched:
        if patched and previous is None:
            entmax.use_adasplash_reference(adasplash_v1)
        try:
            yield
        finally:
            entmax.use_adasplash_reference(previous)


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
    method: str = "fake"
    """'fake' (fake tensors at the full shape) or 'real x<B·H>' (real tensors at B = H = 1, scaled)."""
    error: str = ""

    @property
    def flash_ideal(self) -> float:
        """FlashAttention's saved bytes: q, k, v, out [B, H, L, d] and the logsumexp [B, H, L], at bf16's size."""
        return (4 * self.batch * HEADS * self.length * DIM + self.batch * HEADS * self.length) * FLOAT_BYTES


def _build(name: str):
    from modules.attention import AttentionSite, build_attention

    torch.manual_seed(0)
    return build_attention({"name": name}, num_heads=HEADS, head_dim=DIM, site=AttentionSite("text", "self", sequence=True)).train()


def count_step(name: str, length: int, batch: int, *, fake: bool = True, heads: int = HEADS, where: bool = True) -> tuple[CostCounter, int, str]:
    """Count one forward+backward of variant `name` on the CUDA path: (counter, saved bytes, path)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.multiprocessing.reductions import StorageWeakRef

    from modules.attention import DenseGroups
    from modules.device_policy import behave_as_cuda

    kernel = _build(name)
    counter = CostCounter(where=where)
    saved: dict[int, int] = {}

    def pack(t):
        if counter.paused:  # a stand-in's own recomputation in the backward: not what the call keeps
            return t
        try:
            saved.setdefault(StorageWeakRef(t.untyped_storage()).cdata, storage_bytes(t))
        except Exception:  # noqa: BLE001
            pass
        return t

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else nullcontext()
    gc.disable()
    try:
        with behave_as_cuda(), library_kernels_as_on_cuda(counter), fake_mode:
            generator = None if fake else torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(batch, heads, length, DIM, generator=generator).requires_grad_() for _ in range(3))
            counter.track(q, k, v, *kernel.parameters(), *kernel.buffers())
            with counter, CudaSDPA(counter), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out, result = kernel(q, k, v, DenseGroups(), need_weights=False)
                # the output's gradient from upstream, and the aux losses' own: no loss graph of the page's own
                aux = [a for a in result.aux_losses.values() if a.requires_grad]
                upstream = torch.ones_like(out)
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


def count_variant(name: str, length: int, batch: int) -> Count:
    """`count_step` on fake tensors; where the code reads values, on real ones at B = H = 1, scaled by B x H."""
    row = Count(name, length, batch)
    try:
        counter, saved, path = count_step(name, length, batch)
        scale = 1
    except Exception as exc:  # noqa: BLE001
        if not any(kind in type(exc).__name__ for kind in DATA_DEPENDENT):
            traceback.print_exc(limit=4)
            row.error = f"{type(exc).__name__}: {str(exc)[:100]}"
            return row
        if length > REAL_MAX_LENGTH:
            row.error = f"reads values (needs real tensors), not counted past L = {REAL_MAX_LENGTH}"
            return row
        try:
            counter, saved, path = count_step(name, length, 1, fake=False, heads=1)
        except Exception as real_exc:  # noqa: BLE001
            traceback.print_exc(limit=4)
            row.error = f"{type(real_exc).__name__}: {str(real_exc)[:100]}"
            return row
        scale = batch * HEADS
        row.method = f"real ×{scale}"
    row.path = path
    row.kernels = counter.kernels
    row.syncs = sum(counter.syncs.values())
    row.sync_where = {f"{what} at {where}": n for (what, where), n in sorted(counter.syncs.items())}
    row.bytes, row.peak, row.saved, row.flops = (counter.bytes * scale, counter.peak * scale, saved * scale,
                                                 counter.flops * scale)
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


# ---- the page -------------------------------------------------------------------------------------------------------

def _gb(x: float) -> str:
    return f"{x / 1e9:.2f}"


def _ratio(x: float, base: float) -> str:
    return f"{x / base:.2f}" if base else ""


def dense_table(rows: list[Count], length: int, batch: int) -> list[str]:
    lines = [f"### L = {length}, B = {batch}", "",
             "| variant | path | kernels | host syncs | bytes touched GB | × SDPA | peak live GB | × SDPA | saved GB | × flash | GFLOP | × SDPA | counted |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    base = next((r for r in rows if r.variant == "softmax" and not r.error), None)
    for r in rows:
        if r.error:
            lines.append(f"| {r.variant} | | | | | | | | | | | | {r.error.replace('|', '/')} |")
            continue
        lines.append(f"| {r.variant} | {r.path} | {r.kernels} | {r.syncs} | {_gb(r.bytes)} | {_ratio(r.bytes, base.bytes if base else 0)} | "
                     f"{_gb(r.peak)} | {_ratio(r.peak, base.peak if base else 0)} | {_gb(r.saved)} | {r.saved / r.flash_ideal:.2f} | "
                     f"{r.flops / 1e9:.1f} | {_ratio(r.flops, base.flops if base else 0)} | {r.method} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=None, help="comma-separated variants (softmax, the ratios' base, is always counted)")
    parser.add_argument("--lengths", default=None, help="comma-separated L among 512,2048,8192")
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE.py", help="a plugin file that registers variants (repeatable)")
    parser.add_argument("--out", default=None, help="folder for gpu-cost.{md,csv} (a full run: leaderboards)")
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
    lines: list[str] = []
    for length, batch in shapes:
        rows = [count_variant(name, length, batch) for name in names]
        table = dense_table(rows, length, batch)
        print("\n".join(table), flush=True)
        for r in rows:
            for where, n in r.sync_where.items():
                print(f"  {r.variant}: {n} × {where}")
        lines += table + [""]
    return 0


if __name__ == "__main__":
    sys.exit(main())
