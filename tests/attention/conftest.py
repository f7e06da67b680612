"""Small dense problems and their graph (segment) twins, shared by the attention tests."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from modules.attention import DenseGroups, SegmentGroups


@dataclass
class Problem:
    q: torch.Tensor  # [B, H, L, d]
    k: torch.Tensor
    v: torch.Tensor
    key_valid: torch.Tensor  # [B, L]
    dense: DenseGroups
    segment: SegmentGroups
    edge_b: torch.Tensor
    edge_i: torch.Tensor
    edge_j: torch.Tensor

    def nodes(self, x: torch.Tensor) -> torch.Tensor:
        """[B, H, L, d] -> node layout [B*L, H, d]."""
        b, h, l, d = x.shape
        return x.permute(0, 2, 1, 3).reshape(b * l, h, d)

    def real_nodes(self, x: torch.Tensor) -> torch.Tensor:
        """Node-layout rows [B*L, ...] of the real tokens (padded tokens are nodes without edges)."""
        return x[self.key_valid.reshape(-1)]

    def dense_at_edges(self, logits: torch.Tensor) -> torch.Tensor:
        """Dense [B, H, L, L] values at the segment edges -> [E, H]."""
        return logits[self.edge_b, :, self.edge_i, self.edge_j]


def make_problem(batch=2, heads=2, length=5, dim=4, dtype=torch.float64, seed=0) -> Problem:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, length, dim, generator=g, dtype=dtype) for _ in range(3))
    key_valid = torch.ones(batch, length, dtype=torch.bool)
    key_valid[-1, -2:] = False  # the last sequence is padded
    dense = DenseGroups.from_key_padding(key_valid, query_valid=key_valid)  # self-attention: padded tokens are padded queries too
    # the graph twin: real tokens attend real tokens; a padded token is a node without incoming edges
    b, i, j = torch.nonzero(key_valid[:, :, None] & key_valid[:, None, :], as_tuple=True)
    segment = SegmentGroups(dst=b * length + i, src=b * length + j, num_nodes=batch * length)
    return Problem(q, k, v, key_valid, dense, segment, b, i, j)


@pytest.fixture
def problem() -> Problem:
    return make_problem()
