"""Counting the operations of a code block that make a GPU wait for the host (or the host for the GPU), on CPU.

CUDA's `torch.cuda.set_sync_debug_mode("error")` flags them on a GPU; CPU has no such switch, so this mode
watches the same operations at the ATen level: reading a value on the host (`.item()`, `bool(t)`,
`float(t)`, `if t:`), and operations whose output size depends on the data (nonzero, boolean indexing,
masked_select, unique, repeat_interleave without output_size, bincount)."""

from __future__ import annotations

import traceback
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = str(Path(__file__).resolve().parents[2]) + "/"
"""Frames are named relative to the checkout, wherever it lives."""

aten = torch.ops.aten
ALWAYS = {
    aten._local_scalar_dense.default: "value read on the host (.item(), bool(), float(), int())",
    aten.nonzero.default: "nonzero", aten.masked_select.default: "masked_select", aten.equal.default: "torch.equal",
    aten._unique2.default: "unique", aten.unique_dim.default: "unique", aten.unique_consecutive.default: "unique_consecutive",
    aten.is_nonzero.default: "bool()",
}


def _boolean_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (indices or ()))


class HostSyncs(TorchDispatchMode):
    """`with HostSyncs() as syncs: ...` then `syncs.count` and `syncs.where` (op -> project frames that called it)."""

    def __init__(self):
        super().__init__()
        self.where: Counter = Counter()

    @property
    def count(self) -> int:
        return sum(self.where.values())

    def _note(self, what: str) -> None:
        frames = [f"{f.filename.removeprefix(REPO)}:{f.lineno}" for f in traceback.extract_stack()[:-2]
                  if "site-packages" not in f.filename and "host_syncs" not in f.filename and "/tests/" not in f.filename]
        self.where[(what, frames[-1] if frames else "?")] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in ALWAYS:
            self._note(ALWAYS[func])
        elif func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default) and _boolean_index(args):
            self._note("boolean indexing")
        elif func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            self._note("repeat_interleave without output_size")
        elif func is aten.bincount.default:
            self._note("bincount (its size is the largest value)")
        return func(*args, **kwargs)
