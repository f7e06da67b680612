"""The Triton softmax kernel (modules/attention/triton_softmax.py) run on CPU by the Triton interpreter
(TRITON_INTERPRET=1), through each variant's fused path as training takes it (`triton_kernels_anywhere`: where the
device policy runs the project's Triton kernels), against the variant's eager path: the output and the gradients of
q, k, v and of every parameter, in float32, with key padding (one sample's last keys masked) and parameters that
differ per head. The interpreter reads TRITON_INTERPRET when a kernel is defined, so each check runs in a fresh
process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]

CHECK = r"""
import json, sys
import torch
from modules.attention import AttentionSite, DenseGroups, build_attention
from modules.device_policy import triton_kernels_anywhere

config, batch, heads, num_queries, length, dim, padded, scale = json.loads(sys.argv[1])
kernel = build_attention(config, num_heads=heads, head_dim=dim,
                         site=AttentionSite("text", "self", sequence=True)).train()
g = torch.Generator().manual_seed(0)
params = [p for p in kernel.parameters() if p.requires_grad]
with torch.no_grad():  # every parameter away from its initial value, differently in each head
    for p in params:
        p.add_(0.3 * torch.randn(p.shape, generator=g))
q = torch.randn(batch, heads, num_queries, dim, generator=g).requires_grad_()
k, v = [torch.randn(batch, heads, length, dim, generator=g).requires_grad_() for _ in range(2)]
upstream = torch.randn(batch, heads, num_queries, dim, generator=g)
key_valid = torch.ones(batch, length, dtype=torch.bool)
key_valid[-1, length - padded:] = False
groups = DenseGroups.from_key_padding(key_valid) if padded else DenseGroups()
inputs = (q, k, v, *params)

with triton_kernels_anywhere():
    fused, _ = kernel(q, k, v, groups, scale=scale, need_weights=False)
    path = kernel.last_path
    fused_grads = torch.autograd.grad(fused, inputs, upstream)
eager, _ = kernel(q, k, v, groups, scale=scale, need_weights=True)
eager_grads = torch.autograd.grad(eager, inputs, upstream)
relative = lambda a, b: float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
print(json.dumps({"path": path, "names": ["out", "q", "k", "v"] + [n for n, p in kernel.named_parameters() if p.requires_grad],
                  "errors": [relative(fused, eager)] + [relative(a, b) for a, b in zip(fused_grads, eager_grads)]}))
"""


def run_check(config, batch, heads, num_queries, length, dim, padded, scale):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", CHECK,
                           json.dumps([config, batch, heads, num_queries, length, dim, padded, scale])],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("config, length, dim, padded", [
    # the learned coupling ρ per head and the key offset ⟨c, ξ⟩: every term; a length off the tiles (32), padding
    ({"name": "gmm", "prior_offset": True}, 40, 16, 7),
    # ρ = 0 (the Gaussian distance alone), a head dimension off a power of two (padded to 32 in the tiles)
    ({"name": "gmm", "prior": "uniform"}, 33, 24, 0),
])
def test_gmm_triton_path_matches_its_eager_path(config, length, dim, padded):
    found = run_check(config, 2, 3, length, length, dim, padded, 0.125)
    assert found["path"] == "triton-softmax", found
    errors = dict(zip(found["names"], found["errors"]))
    assert set(errors) >= {"out", "q", "k", "v", "log_alpha"}, found
    assert max(errors.values()) <= 1e-5, errors

