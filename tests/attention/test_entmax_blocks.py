"""The learned-α entmax on the CUDA path where its fused kernel cannot run (a mask, no Triton): its eager call runs in
query blocks sized by q (`block_weights_vs_q`, read by `query_block_rows`), each recomputed in the backward, which
keeps its peak within 1.5x SDPA's on the GPU cost page's count. Counts only (fake tensors): nothing is timed. The CPU path is untouched."""

from __future__ import annotations

import pytest

from harness.studies import gpu_cost
from modules.attention import DenseGroups
from modules.attention.backends import query_block_rows


class OnCuda:  # the shape arithmetic of the CUDA rule, without a GPU
    def __init__(self, shape):
        self.shape, self.is_cuda = shape, True


def test_learned_alpha_blocks_are_sized_by_q_and_fixed_alpha_keeps_the_budget():
    learned, fixed = gpu_cost._build("entmax"), gpu_cost._build("entmax15")
    for length in (512, 2048, 8192):
        q = OnCuda((32, 12, length, 64))
        assert query_block_rows(learned, DenseGroups(), q, q) == 16  # a quarter of q's elements: 16 rows at d = 64
    assert query_block_rows(fixed, DenseGroups(), OnCuda((32, 12, 512, 64)), OnCuda((32, 12, 512, 64))) is None
    assert query_block_rows(learned, DenseGroups(), OnCuda((2, 2, 16, 64)), OnCuda((2, 2, 16, 64))) is None  # one piece
    q = OnCuda((32, 12, 512, 64))
    assert query_block_rows(learned, DenseGroups(), q, q, budget_mb=1024) is None  # a caller's own budget still rules


@pytest.mark.parametrize("length", [512, 2048])
def test_learned_alpha_peak_stays_within_one_and_a_half_sdpa_and_reads_nothing(length, monkeypatch):
    """Where its fused kernel cannot run (no Triton here, as for a masked call): the blocked path."""
    from modules.attention.variants import entmax as entmax_variant

    monkeypatch.setattr(entmax_variant, "learned_alpha_library", lambda: None)
    softmax, _, _ = gpu_cost.count_step("softmax", length, 2)
    entmax, _, path = gpu_cost.count_step("entmax", length, 2)
    assert path == "blocked"
    assert entmax.peak <= 1.5 * softmax.peak, entmax.peak / softmax.peak
    assert not entmax.syncs, dict(entmax.syncs)
