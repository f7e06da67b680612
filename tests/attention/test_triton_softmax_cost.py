"""What the Triton softmax path costs gmm and fenchel on the GPU cost page (B = 32, H = 12, d = 64, counted on the CPU
with every device branch in its CUDA form): the kernel's three launches and the harness's upstream gradient, 16 passes
over a [B, H, L, d] tensor (the forward reads q, k, v and writes the output; the dq pass reads q, k, v and the output's
gradient and writes dq; the dk/dv pass reads q, k, v and the output's gradient and writes dk and dv), plus the per-row
and per-program sums; peak live as SDPA softmax's; saved for backward FlashAttention's set less the output; no host
sync."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")


@pytest.mark.parametrize("name", ["gmm", "fenchel"])
def test_triton_softmax_path_costs_sixteen_tensor_passes(name):
    from harness.studies.gpu_cost import Count, count_step

    length, batch = 512, 32
    found, saved, path = count_step(name, length, batch)
    softmax, _, _ = count_step("softmax", length, batch)
    assert path == "triton-softmax"
    tensor = batch * 12 * length * 64 * 2  # one [B, H, L, d] tensor at 2 bytes an element
    assert found.bytes <= 16.2 * tensor, found.bytes / tensor
    assert found.peak <= 1.05 * softmax.peak, found.peak / softmax.peak
    assert saved <= 0.8 * Count(name, length, batch).flash_ideal  # q, k, v, the logsumexp and small terms
    assert sum(found.syncs.values()) == 0
