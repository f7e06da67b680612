"""Issue 37: AdaSplash's own Triton kernels, run on CPU by the Triton interpreter (TRITON_INTERPRET=1), against
the eager path of sparsemax and entmax15, forward and backward, through the kernels' fused path as training
takes it. The stand-in of test_adasplash_path.py checks the plumbing; this checks the library call itself:
its length contract (a power of two from 128 on unless lengths are given, which the wrapper of
modules/attention/adasplash_full_length.py passes on the device), q's rescaling for another scale, and that the
Halley-bisection steps reach fp32's tolerance (1e-5 relative, the issue's) on peaked scores. The kernels are the
library's without block mask; a second check holds them to the block-mask version (`adasplash_v1`), which the path
used before.

The interpreter reads TRITON_INTERPRET when a kernel is defined, so the check runs in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("adasplash")

REPO = Path(__file__).resolve().parents[2]

CHECK = r"""
import json, sys
import torch
from modules.attention import AttentionSite, DenseGroups, build_attention
from modules.attention.variants import entmax as entmax_variant

entmax_variant.use_adasplash_reference(entmax_variant.adasplash_library())
name, batch, heads, length, dim, scale = json.loads(sys.argv[1])
kernel = build_attention({"name": name}, num_heads=heads, head_dim=dim,
                         site=AttentionSite("text", "self", sequence=True)).train()
g = torch.Generator().manual_seed(0)
q, k, v = [(2 * torch.randn(batch, heads, length, dim, generator=g)).requires_grad_() for _ in range(3)]
fused, _ = kernel(q, k, v, DenseGroups(), scale=scale, need_weights=False)
path = kernel.last_path
eager, _ = kernel(q, k, v, DenseGroups(), scale=scale, need_weights=True)
upstream = torch.randn(eager.shape, generator=g)
fused_grads = torch.autograd.grad(fused, (q, k, v), upstream)
eager_grads = torch.autograd.grad(eager, (q, k, v), upstream)
relative = lambda a, b: float((a - b).abs().max() / b.abs().max())
print(json.dumps({"path": path, "output": relative(fused, eager),
                  "grads": [relative(a, b) for a, b in zip(fused_grads, eager_grads)]}))
"""


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("length, scale", [
    # a power of two from 128 on runs unmasked; scores of std ~7, about 1.4 keys in sparsemax's support: the
    # Halley-bisection steps must converge
    (128, 0.3),
    # any other length goes through AdaSplash's lengths argument (it asserts a power of two without, and at 64
    # its unmasked kernels corrupted memory here)
    (40, 0.25),
    # past 128 and not a power of two: the lengths mask the last, partial tiles
    (160, 0.25),
])
def test_adasplash_itself_matches_the_eager_map_forward_and_backward(name, length, scale):
    setting = [name, 1, 2, length, 32, scale]
    # One thread: a fresh-clone CI once saw entmax15 at L = 40 off by 4.9e-4 (1e-6 in every run here since, 12 of
    # them); if AdaSplash's length-masked path reads a lane it never wrote, what it finds there depends on the
    # allocator's history, which a thread pool makes vary between runs.
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", CHECK, json.dumps(setting)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["path"] == "adasplash"
    assert found["output"] <= 1e-5, found
    assert max(found["grads"]) <= 1e-5, found


SAME = r"""
import json, sys
import torch
import adasplash.adasplash_block_mask as block_mask
allocate = block_mask.compute_bidxs_and_cubcounts
# the block-mask version allocates its block lists on "cuda" by default
block_mask.compute_bidxs_and_cubcounts = lambda *a, **kw: allocate(*a, **{**kw, "device": "cpu"})
from adasplash import adasplash_v1
from modules.attention.adasplash_full_length import full_length_adasplash

alpha, length = json.loads(sys.argv[1])
g = torch.Generator().manual_seed(1)
q, k, v = [(2 * torch.randn(1, 2, length, 32, generator=g)).requires_grad_() for _ in range(3)]
upstream = torch.randn(1, 2, length, 32, generator=g)
varlen = None if length >= 128 and length & (length - 1) == 0 else torch.full((1,), length, dtype=torch.int32)
ours = full_length_adasplash(q, k, v, alpha=alpha, niter=20)
theirs = adasplash_v1(q, k, v, alpha=alpha, is_causal=False, varlen=varlen, niter=20)
relative = lambda a, b: float((a - b).abs().max() / b.abs().max())
print(json.dumps([relative(ours, theirs)] + [relative(a, b) for a, b in zip(
    torch.autograd.grad(ours, (q, k, v), upstream), torch.autograd.grad(theirs, (q, k, v), upstream))]))
"""


@pytest.mark.parametrize("alpha, length", [(2.0, 128), (1.5, 40)])
def test_the_kernels_without_block_mask_match_the_block_mask_version(alpha, length):
    """Same algorithm, every block computed: outputs and gradients agree with `adasplash_v1` to fp32 rounding."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", SAME, json.dumps([alpha, length])], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert max(errors) <= 1e-5, errors
