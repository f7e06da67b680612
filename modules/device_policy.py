"""Where device behaviour is decided: every branch that a CUDA run takes differently from a CPU run asks here.

Five questions decide them:
- `takes_cuda_path(x)`: run the form a GPU runs (fused or blocked kernels, fused Adam, compiled FlexAttention where
  the device allows it), rather than the CPU's bit-identical reference form;
- `host_reads_are_cheap(x)`: may a shortcut read a value on the host (on a GPU that read waits for every queued
  kernel, a sync; under torch.compile it is a graph break);
- `takes_cpu_path(x)`: run the CPU's own form (a NumPy sort where torch's is slow on a CPU);
- `takes_triton_path(x)`: run the project's own Triton kernels (a fused map no library kernel computes);
- `as_on_cuda()`: the policy itself.

A CPU run can set the policy to "as on CUDA" (`behave_as_cuda()`): then every branch takes the path a CUDA run
takes, on CPU tensors. The GPU cost page (`harness.studies.gpu_cost`) counts kernels, syncs and bytes that way, so
what it counts is what a GPU would run. The default is the device's own behaviour, so CPU results are unchanged."""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Iterator

import torch

_as_cuda = False
_triton_anywhere = False


def as_on_cuda() -> bool:
    """Whether this process behaves as on CUDA whatever its tensors' device (set by `behave_as_cuda`)."""
    return _as_cuda


@contextmanager
def behave_as_cuda(enabled: bool = True) -> Iterator[None]:
    """Within the block, every device branch takes the CUDA path (or, with enabled=False, the device's own)."""
    global _as_cuda
    previous, _as_cuda = _as_cuda, enabled
    try:
        yield
    finally:
        _as_cuda = previous


def _device_type(x: torch.Tensor | torch.device | str) -> str:
    if isinstance(x, torch.Tensor):
        return x.device.type
    if isinstance(x, (torch.device, str)):
        return torch.device(x).type
    # a tensor-like that says only where it lives (a test's stand-in for a CUDA tensor's shape)
    return "cuda" if getattr(x, "is_cuda", False) else torch.device(getattr(x, "device", "cpu")).type


def takes_cuda_path(x: torch.Tensor | torch.device | str) -> bool:
    """Whether the code for `x` (a tensor or a device) runs what a GPU runs: on CUDA, or anywhere as on CUDA."""
    return _as_cuda or _device_type(x) == "cuda"


def takes_cpu_path(x: torch.Tensor | torch.device | str) -> bool:
    """Whether the code for `x` runs the CPU's own form (a NumPy sort, a host-side shortcut): on a CPU tensor, and
    not as on CUDA. Not simply `not takes_cuda_path(x)`: other accelerators (MPS) take neither CPU form."""
    return not _as_cuda and _device_type(x) == "cpu"


def host_reads_are_cheap(x: torch.Tensor | torch.device | str) -> bool:
    """Whether reading a value of `x` on the host is cheap. On CPU it is a memory read, which a shortcut such as
    "every query has keys, so no mask is needed" repays; on an accelerator it waits for every queued kernel (a
    device sync) and costs more than the masked operations it would spare, so the shortcuts are skipped there and
    under the "as on CUDA" policy. Under torch.compile a read is a graph break, so there too (the shortcuts change
    no result)."""
    return takes_cpu_path(x) and not torch.compiler.is_compiling()


@contextmanager
def triton_kernels_anywhere(enabled: bool = True) -> Iterator[None]:
    """Within the block, `takes_triton_path` holds for tensors on any device: for the Triton interpreter
    (TRITON_INTERPRET=1, tests on CPU) and for the GPU cost page, which counts the kernels' launches instead of
    running them."""
    global _triton_anywhere
    previous, _triton_anywhere = _triton_anywhere, enabled
    try:
        yield
    finally:
        _triton_anywhere = previous


@functools.cache
def triton_installed() -> bool:
    """Whether Triton can be imported (the gpu extra; a CPU install may lack it)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def takes_triton_path(x: torch.Tensor | torch.device | str) -> bool:
    """Whether a call on `x` runs the project's own Triton kernels (each launch a custom op, `attnbench::*`, with a
    fake form): where Triton is installed, on a CUDA tensor; as on CUDA, on a fake tensor (FakeTensorMode: the ops'
    fake forms give the outputs' shapes, nothing launches, and a dispatch mode sees each launch as one op); and anywhere
    inside `triton_kernels_anywhere`. Not for real CPU tensors as on CUDA: a Triton kernel cannot run on them outside
    the interpreter, so those keep the CUDA path's torch forms (SDPA)."""
    if not triton_installed():
        return False
    if _triton_anywhere or _device_type(x) == "cuda":
        return True
    return _as_cuda and _is_fake(x)


def _is_fake(x) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(x, FakeTensor)
