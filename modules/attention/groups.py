"""Where each query's key set lives in a logits tensor.

A variant is written once against these few operations and then runs both as transformer attention
(`DenseGroups`: logits [B, H, Lq, Lk], a query's keys are the last axis, masked keys excluded) and as
graph attention (`SegmentGroups`: logits [E, H], a node's keys are its incoming edges).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

import torch
from torch import Tensor
from torch_geometric.utils import scatter, to_dense_batch
from torch_geometric.utils import softmax as segment_softmax


class Groups(ABC):
    """The layout of attention logits and the reductions a variant needs within each group."""

    @abstractmethod
    def scores(self, q: Tensor, k: Tensor, scale: float) -> Tensor:
        """Scaled dot products <q, k> * scale for every (query, key) pair, in logits layout."""

    @abstractmethod
    def per_query(self, x: Tensor) -> Tensor:
        """Broadcast a per-query quantity (dense [B,H,Lq], segment [N,H]) to logits layout."""

    @abstractmethod
    def per_key(self, x: Tensor) -> Tensor:
        """Broadcast a per-key quantity (dense [B,H,Lk], segment [Nk,H]) to logits layout."""

    @abstractmethod
    def reduce(self, x: Tensor, how: str = "sum") -> Tensor:
        """Reduce a logits-layout tensor within each group: 'sum', 'max' or 'mean' over valid keys.
        Returns one value per group (dense [B,H,Lq], segment [N,H])."""

    @abstractmethod
    def softmax(self, logits: Tensor) -> Tensor:
        """Softmax within each group; zero on masked keys."""

    @abstractmethod
    def aggregate(self, weights: Tensor, v: Tensor) -> Tensor:
        """Weighted sum of values: dense v [B,H,Lk,dv] -> [B,H,Lq,dv]; segment v [Nk,H,dv] -> [N,H,dv]."""

    @abstractmethod
    def pad(self, x: Tensor, fill: float) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
        """A dense view [..., K] with each group on the last axis, `fill` on masked or missing keys,
        and the function that maps such a tensor back to logits layout. For sort-based maps
        (sparsemax, entmax) and packages that only take dense input."""

    @property
    @abstractmethod
    def valid(self) -> Tensor | None:
        """Boolean mask broadcastable to logits layout (True = key takes part), or None if all do."""

    # ---- derived operations, shared by both layouts -------------------------------------------
    def broadcast(self, per_group: Tensor) -> Tensor:
        """Per-group values back to logits layout."""
        return self.per_query(per_group)

    def sum(self, x: Tensor) -> Tensor:
        return self.broadcast(self.reduce(self.zero_invalid(x), "sum"))

    def max(self, x: Tensor) -> Tensor:
        return self.broadcast(self.reduce(x, "max"))

    def mean(self, x: Tensor) -> Tensor:
        return self.broadcast(self.reduce(x, "mean"))

    def fill_invalid(self, x: Tensor, value: float) -> Tensor:
        mask = self.valid
        return x if mask is None else x.masked_fill(~mask, value)

    def zero_invalid(self, x: Tensor) -> Tensor:
        return self.fill_invalid(x, 0.0)

    def normalize(self, positive: Tensor, eps: float = 0.0) -> Tensor:
        """Divide non-negative values by their group sum (0 where a group has no mass)."""
        positive = self.zero_invalid(positive)
        total = self.sum(positive)
        return positive / total.clamp_min(torch.finfo(positive.dtype).tiny if eps == 0 else eps)

    def entropy(self, weights: Tensor) -> Tensor:
        """Mean Shannon entropy (nats) of the per-group distributions."""
        plogp = torch.where(weights > 0, weights * weights.clamp_min(1e-30).log(), torch.zeros_like(weights))
        return -self.reduce(plogp, "sum").mean()

    def support(self, weights: Tensor) -> Tensor:
        """Mean number of keys with non-zero weight per group."""
        return self.reduce((weights > 0).to(weights.dtype), "sum").mean()

    def count(self, like: Tensor) -> Tensor:
        """Number of valid keys per group, broadcast to logits layout."""
        return self.sum(torch.ones_like(like))


class DenseGroups(Groups):
    """Transformer attention: logits [B, H, Lq, Lk]; `mask` (bool, broadcastable, True = attend) as in
    torch's scaled_dot_product_attention."""

    def __init__(self, mask: Tensor | None = None):
        if mask is not None and mask.dtype != torch.bool:
            raise TypeError("DenseGroups mask must be boolean with True where a query may attend to a key")
        self.mask = mask

    @classmethod
    def from_key_padding(cls, key_valid: Tensor, *, causal: bool = False, num_queries: int | None = None) -> "DenseGroups":
        """key_valid [B, Lk] (True = real token) and optional causal masking for decoders."""
        mask = key_valid[:, None, None, :]
        if causal:
            lk = key_valid.shape[1]
            lq = num_queries or lk
            tri = torch.ones(lq, lk, dtype=torch.bool, device=key_valid.device).tril(diagonal=lk - lq)
            mask = mask & tri
        return cls(mask)

    @property
    def valid(self) -> Tensor | None:
        return self.mask

    def scores(self, q: Tensor, k: Tensor, scale: float) -> Tensor:
        return torch.matmul(q, k.transpose(-1, -2)) * scale

    def per_query(self, x: Tensor) -> Tensor:
        return x.unsqueeze(-1)

    def per_key(self, x: Tensor) -> Tensor:
        return x.unsqueeze(-2)

    def reduce(self, x: Tensor, how: str = "sum") -> Tensor:
        if how == "sum":
            return self.zero_invalid(x).sum(-1)
        if how == "max":
            return self.fill_invalid(x, float("-inf")).amax(-1)
        if how == "mean":
            ones = torch.ones_like(x)
            return self.zero_invalid(x).sum(-1) / self.zero_invalid(ones).sum(-1).clamp_min(1)
        raise ValueError(f"unknown reduction {how!r}; use 'sum', 'max' or 'mean'")

    def softmax(self, logits: Tensor) -> Tensor:
        weights = self.fill_invalid(logits, float("-inf")).softmax(-1)
        # A query with no valid key (a padding row) gets all-zero weights rather than NaN.
        return weights.nan_to_num(0.0) if self.mask is not None else weights

    def aggregate(self, weights: Tensor, v: Tensor) -> Tensor:
        return torch.matmul(weights, v)

    def pad(self, x: Tensor, fill: float) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
        return self.fill_invalid(x, fill), self.zero_invalid


class SegmentGroups(Groups):
    """Graph attention: logits [E, H] for edges src -> dst; each destination node attends over its
    incoming edges (the layout of PyG's `softmax(src, index)`)."""

    def __init__(self, dst: Tensor, src: Tensor, num_nodes: int, num_src_nodes: int | None = None):
        if dst.shape != src.shape or dst.dim() != 1:
            raise ValueError("SegmentGroups needs 1-D dst and src index tensors of equal length")
        self.dst = dst
        self.src = src
        self.num_nodes = int(num_nodes)
        self.num_src_nodes = int(num_src_nodes if num_src_nodes is not None else num_nodes)
        self._padding: tuple[Tensor, Tensor, Tensor] | None = None

    @property
    def valid(self) -> Tensor | None:
        return None

    def scores(self, q: Tensor, k: Tensor, scale: float) -> Tensor:
        return (self.per_query(q) * self.per_key(k)).sum(-1) * scale

    # index_select rather than x[index]: several times faster on CPU for these gathers (measured).
    def per_query(self, x: Tensor) -> Tensor:
        return x.index_select(0, self.dst)

    def per_key(self, x: Tensor) -> Tensor:
        return x.index_select(0, self.src)

    def reduce(self, x: Tensor, how: str = "sum") -> Tensor:
        if how == "sum":
            return self._sum_into_nodes(x)
        if how not in ("max", "mean"):
            raise ValueError(f"unknown reduction {how!r}; use 'sum', 'max' or 'mean'")
        return scatter(x, self.dst, dim=0, dim_size=self.num_nodes, reduce=how)

    def _sum_into_nodes(self, x: Tensor) -> Tensor:
        # index_add_ rather than PyG's scatter-sum, which first expands the index to x's full shape
        # (several times slower for [E, H, d] messages on CPU, measured).
        return x.new_zeros(self.num_nodes, *x.shape[1:]).index_add_(0, self.dst, x)

    def softmax(self, logits: Tensor) -> Tensor:
        return segment_softmax(logits, self.dst, num_nodes=self.num_nodes, dim=0)

    def aggregate(self, weights: Tensor, v: Tensor) -> Tensor:
        return self._sum_into_nodes(self.per_key(v) * weights.unsqueeze(-1))

    def _sorted(self) -> tuple[Tensor, Tensor, Tensor]:
        if self._padding is None:
            order = torch.argsort(self.dst, stable=True)
            _, mask = to_dense_batch(self.dst[order], self.dst[order], batch_size=self.num_nodes)
            self._padding = (order, mask, torch.argsort(order))
        return self._padding

    def pad(self, x: Tensor, fill: float) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
        order, mask, inverse = self._sorted()
        dense, _ = to_dense_batch(x[order], self.dst[order], fill_value=fill, batch_size=self.num_nodes)
        # [N, K, *rest] -> [N, *rest, K]: keys on the last axis, as in DenseGroups.
        dense = dense.movedim(1, -1)

        def unpad(padded: Tensor) -> Tensor:
            return padded.movedim(-1, 1)[mask][inverse]

        return dense, unpad
