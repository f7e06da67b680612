"""Where each query's key set lives in a logits tensor.

A variant is written once against these few operations and then runs both as transformer attention
(`DenseGroups`: logits [B, H, Lq, Lk], a query's keys are the last axis, masked keys excluded) and as
graph attention (`SegmentGroups`: logits [E, H], a node's keys are its incoming edges).
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..device_policy import host_reads_are_cheap  # noqa: F401  (re-exported: the variants import it from here)
from ..device_policy import takes_cuda_path


def cached_property(method: Callable) -> property:
    """functools.cached_property without its lock: Python 3.11 takes an RLock at every first read, which
    torch.compile cannot trace (a graph break at each attention call of a compiled model). Groups are built and
    read within one forward, in one thread."""
    name = method.__name__

    def read(self):
        if name not in self.__dict__:
            self.__dict__[name] = method(self)
        return self.__dict__[name]

    read.__doc__ = method.__doc__
    return property(read)


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

    @property
    @abstractmethod
    def valid_queries(self) -> Tensor | None:
        """Boolean per group, broadcastable to per-group layout (dense [B|1, 1|H, Lq|1], segment [N, 1]):
        True for a real query with at least one valid key; None if every group is one. Padded query rows
        (a padded token's row in a batch with key padding, a node without incoming edges) are False, so
        that whatever a variant averages or sums over queries does not depend on how a batch is padded."""

    @abstractmethod
    def sum_over_queries(self, weights: Tensor, x: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """For every key u, over the valid queries i that attend to it: Σ_i w_iu (dense [B,H,Lk], segment
        [Nk,H]) and, given per-query x (the layout of q), Σ_i w_iu x_i (dense [B,H,Lk,d], segment [Nk,H,d]).
        The transpose of `aggregate`."""

    @abstractmethod
    def key_degree(self) -> Tensor | None:
        """Number of valid queries attending each key, per key with a head axis of size 1 (dense
        [B|1, 1, Lk], segment [Nk, 1]), ready for `per_key`; None where it is the same for every key of
        every group (it then cancels in any per-group normalisation)."""

    @abstractmethod
    def mean_over_keys(self, per_key: Tensor) -> Tensor:
        """Mean of a per-key quantity (dense [B,H,Lk], segment [Nk,H]) over the keys some valid query sees."""

    @abstractmethod
    def second_moment(self, weights: Tensor, x: Tensor) -> Tensor:
        """Σ_j w_ij x_j x_jᵀ per query, [..., d, d], for per-key vectors x (the layout of k)."""

    @abstractmethod
    def map_keys(self, fn: Callable[[Tensor], Tensor], k: Tensor) -> Tensor:
        """Apply `fn`, which maps item-major vectors [..., H, d] to [..., H], to the keys k (the layout
        of k: dense [B,H,Lk,d], segment [Nk,H,d]); returns a per-key quantity (dense [B,H,Lk], segment
        [Nk,H]), ready for `per_key`."""

    @abstractmethod
    def query_and_key_sets(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """Queries and keys as sets of points, one pair of sets per independent sample and head: dense
        one per (sample, head), [B*H, Lq, d] and [B*H, Lk, d]; segment one per head over the whole batch
        graph, [H, N, d] and [H, Nk, d]. Also which points are real ([C, n] / [C, m] booleans, None if
        all are)."""

    @abstractmethod
    def sum_over_pairs(self, x: Tensor, like: Tensor) -> Tensor:
        """Sum of x, broadcast to `like` (logits layout), over the valid (query, key) pairs of valid
        query rows. x may be per key (dense [.., 1, Lk]): it is then never expanded to all pairs."""

    def weighted_sum_operator(self, x: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
        """For per-key values x (the layout of k, [..., D]) fixed across calls: (weights, base) -> base +
        Σ_j w_ij x_j per query ([..., D], the layout of q). For iterative solvers that aggregate the same
        values under new weights many times; a layout may build its index structures once here."""
        return lambda weights, base: base + self.aggregate(weights, x)

    can_restrict_queries: bool = False
    """Whether `restrict_queries` exists for this layout (segment groups: yes; dense rows form a grid)."""

    def restrict_queries(self, rows: Tensor) -> tuple["Groups", Tensor]:
        """The groups of the query groups `rows` only (renumbered 0..len(rows)-1, keys unchanged) and the
        indices of the logits they keep: per-query tensors restrict by index_select(0, rows), logits by
        index_select(0, kept). Lets a solver spend its late iterations on the few unconverged queries."""
        raise NotImplementedError(f"{type(self).__name__} cannot restrict its queries; check can_restrict_queries")

    has_fused_attention: bool = False
    """Whether `fused_attention` exists for this layout (dense: torch's SDPA)."""

    def fused_attention(self, q: Tensor, k: Tensor, v: Tensor, *, bias: Tensor | None, scale: float,
                        dropout_p: float) -> Tensor:
        """softmax(scale·<q, k> + bias) @ v within the groups without forming the weights."""
        raise NotImplementedError(f"{type(self).__name__} has no fused attention kernel")

    @property
    def rows_are_dense(self) -> bool:
        """True where `pad` costs nothing (every group already is a row of the logits): sort-based maps and
        packages that take dense input then run on the logits directly."""
        return False

    def max_if_cheap(self, x: Tensor) -> Tensor | None:
        """Per-group max (compact, as `reduce`) where it costs one elementwise pass (dense rows); None
        where it would cost a scatter (segments), for callers that only use it as a bound."""
        return None

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

    def normalize(self, positive: Tensor, eps: float = 0.0, *, zero_on_masked: bool = False) -> Tensor:
        """Divide non-negative values by their group sum (0 where a group has no mass). `zero_on_masked`:
        the values are already 0 on masked keys, which spares a masking pass where the layout can."""
        positive = self.zero_invalid(positive)
        total = self.sum(positive)
        return positive / total.clamp_min(torch.finfo(positive.dtype).tiny if eps == 0 else eps)

    def mean_over_queries(self, per_group: Tensor) -> Tensor:
        """Mean of a per-group quantity (compact, as `reduce` returns it) over the valid queries."""
        rows = self.valid_queries
        if rows is None:
            return per_group.mean()
        rows = rows.expand_as(per_group)
        return torch.where(rows, per_group, 0.0).sum() / rows.sum().clamp_min(1)

    def entropy(self, weights: Tensor) -> Tensor:
        """Mean Shannon entropy (nats) of the per-group distributions (valid queries only)."""
        plogp = torch.where(weights > 0, weights * weights.clamp_min(1e-30).log(), torch.zeros_like(weights))
        return -self.mean_over_queries(self.reduce(plogp, "sum"))

    def support(self, weights: Tensor) -> Tensor:
        """Mean number of keys with non-zero weight per group (valid queries only)."""
        return self.mean_over_queries(self.reduce((weights > 0).to(weights.dtype), "sum"))

    def count_pairs(self, like: Tensor) -> Tensor:
        """Number of valid (query, key) pairs of valid query rows in `like`'s layout, in like's dtype (at least 1)."""
        ones = like.new_ones((1,) * like.dim())
        return self.sum_over_pairs(ones, like).clamp_min(1)

    def softmax_and_log(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """Softmax within each group and its logarithm, both 0 on masked keys (0 rather than -inf keeps
        products with the log and their gradients finite)."""
        # Softmax is shift invariant, so the shift needs no gradient. A scatter max per group costs as much as
        # all the rest on CPU (measured), so shift by the global max and fall back to the group max only if
        # some group's mass underflows (logits spread over more than ~60 nats); log p stays exact either way.
        # On an accelerator the fallback's test would be a device sync per call; a max per group is one more kernel.
        detached = self.fill_invalid(logits.detach(), float("-inf"))
        if not host_reads_are_cheap(logits):
            shifted, e, total = self._shifted_exp(logits, self.max(detached))
        else:
            shifted, e, total = self._shifted_exp(logits, detached.max())
            if self.zero_invalid(self.broadcast(total) < torch.finfo(e.dtype).tiny ** 0.75).any():
                shifted, e, total = self._shifted_exp(logits, self.max(detached))
        total = total.clamp_min(torch.finfo(e.dtype).tiny)
        # log per group, then broadcast: a gather is cheaper than a log over every pair.
        return e / self.broadcast(total), self.zero_invalid(shifted - self.broadcast(total.log()))

    def _shifted_exp(self, logits: Tensor, shift: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        shifted = self.zero_invalid(logits - shift)
        e = self.zero_invalid(shifted.exp())
        return shifted, e, self.reduce(e, "sum")

    def sums(self, *xs: Tensor) -> tuple[Tensor, ...]:
        """Several `reduce(x, 'sum')` at once (segments batch them into one sparse product)."""
        return tuple(self.reduce(x, "sum") for x in xs)

    def group_size(self, like: Tensor) -> Tensor:
        """Number of valid keys per group, compact (as `reduce`), in like's dtype."""
        return self.reduce(torch.ones_like(like), "sum")

    def count(self, like: Tensor) -> Tensor:
        """Number of valid keys per group, broadcast to logits layout."""
        return self.sum(torch.ones_like(like))


class DenseGroups(Groups):
    """Transformer attention: logits [B, H, Lq, Lk]; `mask` (bool, broadcastable, True = attend) as in
    torch's scaled_dot_product_attention; `query_valid` [B, Lq] (True = a real query) marks padded query
    rows, which a key-padding mask alone lets attend like real ones."""

    def __init__(self, mask: Tensor | None = None, query_valid: Tensor | None = None):
        if mask is not None and mask.dtype != torch.bool:
            raise TypeError("DenseGroups mask must be boolean with True where a query may attend to a key")
        if query_valid is not None and (query_valid.dtype != torch.bool or query_valid.dim() != 2):
            raise TypeError("DenseGroups query_valid must be a boolean [B, Lq] tensor, True for real queries")
        self.mask = mask
        self.query_valid = query_valid

    @classmethod
    def from_key_padding(cls, key_valid: Tensor, *, causal: bool = False, num_queries: int | None = None,
                         query_valid: Tensor | None = None) -> "DenseGroups":
        """key_valid [B, Lk] (True = real token), optional causal masking for decoders, and the queries'
        own padding `query_valid` [B, Lq] (self-attention: the same tensor as key_valid)."""
        mask = key_valid[:, None, None, :]
        if causal:
            lk = key_valid.shape[1]
            lq = num_queries or lk
            tri = torch.ones(lq, lk, dtype=torch.bool, device=key_valid.device).tril(diagonal=lk - lq)
            mask = mask & tri
        return cls(mask, query_valid)

    @property
    def valid(self) -> Tensor | None:
        return self.mask

    @cached_property
    def _valid_queries(self) -> Tensor | None:
        rows = None if self.query_valid is None else self.query_valid[:, None, :]  # [B, 1, Lq]
        if self.mask is not None:
            with_keys = self.mask.any(-1)  # [B|1, 1|H, Lq|1]
            if not host_reads_are_cheap(with_keys) or not bool(with_keys.all()):
                rows = with_keys if rows is None else rows & with_keys
        if rows is not None and host_reads_are_cheap(rows) and bool(rows.all()):
            return None
        return rows

    @property
    def valid_queries(self) -> Tensor | None:
        return self._valid_queries

    @cached_property
    def _valid_pairs(self) -> Tensor | None:
        rows = self.valid_queries
        if rows is None:
            return self.mask
        rows = rows.unsqueeze(-1)
        return rows if self.mask is None else self.mask & rows

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

    def softmax_and_log(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        # torch's fused log_softmax instead of the generic max / exp / sum passes.
        if self.mask is None:
            log_p = logits.log_softmax(-1)
            return log_p.exp(), log_p
        invalid = ~self.mask
        # The second masked_fill also clears the NaN rows of queries that have no valid key.
        log_p = logits.masked_fill(invalid, float("-inf")).log_softmax(-1).masked_fill(invalid, 0.0)
        return log_p.exp().masked_fill(invalid, 0.0), log_p

    def aggregate(self, weights: Tensor, v: Tensor) -> Tensor:
        return torch.matmul(weights, v)

    has_fused_attention = True

    def fused_attention(self, q: Tensor, k: Tensor, v: Tensor, *, bias: Tensor | None, scale: float,
                        dropout_p: float) -> Tensor:
        mask = self.mask
        if bias is not None:
            # under autocast SDPA casts its mask to the autocast dtype (same result): cast once, not up then down
            device = q.device.type
            bias = bias.to(torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else q.dtype)
            mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)

    @property
    def rows_are_dense(self) -> bool:
        return True

    def query_rows(self, rows: slice) -> "DenseGroups":
        """The groups of the queries `rows` only (their logits [B, H, len(rows), Lk]): what a kernel call that
        runs in query blocks (kernel.py, `AttentionKernel.row_separable`) hands each block."""
        mask = self.mask
        if mask is not None and mask.shape[-2] > 1:
            mask = mask[..., rows, :]
        return DenseGroups(mask, None if self.query_valid is None else self.query_valid[:, rows])

    def max_if_cheap(self, x: Tensor) -> Tensor | None:
        return self.reduce(x, "max")

    def pad(self, x: Tensor, fill: float) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
        return self.fill_invalid(x, fill), self.zero_invalid

    def _query_rows(self, weights: Tensor) -> Tensor:
        rows = self.valid_queries
        return weights if rows is None else weights.masked_fill(~rows.unsqueeze(-1), 0.0)

    def sum_over_queries(self, weights: Tensor, x: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        weights = self._query_rows(weights)
        weighted = None if x is None else torch.matmul(weights.transpose(-1, -2), x)
        return weights.sum(-2), weighted

    def normalize(self, positive: Tensor, eps: float = 0.0, *, zero_on_masked: bool = False) -> Tensor:
        if not zero_on_masked:
            return super().normalize(positive, eps)
        return positive / positive.sum(-1, keepdim=True).clamp_min(torch.finfo(positive.dtype).tiny if eps == 0 else eps)

    def mean_over_keys(self, per_key: Tensor) -> Tensor:
        if self.mask is None:
            return per_key.mean()
        seen = self._valid_pairs.any(-2).expand_as(per_key)
        return torch.where(seen, per_key, 0.0).sum() / seen.sum().clamp_min(1)

    def key_degree(self) -> Tensor | None:
        if self.mask is None or self.mask.shape[-2] == 1:
            return None  # a key-padding mask: every valid key of a sample is seen by all its valid queries
        return self._valid_pairs.sum(-2).to(torch.get_default_dtype())

    def second_moment(self, weights: Tensor, x: Tensor) -> Tensor:
        d = x.shape[-1]
        outer = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2)
        return self.aggregate(weights, outer).unflatten(-1, (d, d))

    def map_keys(self, fn: Callable[[Tensor], Tensor], k: Tensor) -> Tensor:
        # keys [B, H, L, d] -> item-major [B, L, H, d] and back
        return fn(k.movedim(1, -2)).movedim(-1, 1)

    def query_and_key_sets(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        batch, heads, lq, lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        rows = self.valid_queries
        q_valid = None if rows is None else rows.expand(batch, heads, lq).reshape(batch * heads, lq)
        k_valid = None
        if self.mask is not None:
            # Reduce the broadcastable mask before expanding it: [B, 1, 1, Lk] stays cheap.
            k_valid = self.mask.any(-2).expand(batch, heads, lk).reshape(batch * heads, lk)
        return q.flatten(0, 1), k.flatten(0, 1), q_valid, k_valid

    def sum_over_pairs(self, x: Tensor, like: Tensor) -> Tensor:
        pairs = self._valid_pairs
        if pairs is None:
            return x.sum() * (like.numel() // x.numel())
        num_queries = like.shape[-2]
        if x.shape[-2] == 1 and num_queries > 1:
            # Per key: weight each key by how many valid queries see it instead of expanding x to all pairs.
            seen = pairs.expand(*pairs.shape[:-2], num_queries, pairs.shape[-1]).sum(-2, keepdim=True)
            terms = torch.where(seen > 0, x * seen.to(x.dtype), 0.0)
            return terms.sum() * (like.numel() // (terms.numel() * num_queries))
        terms = torch.where(pairs, x, 0.0)
        return terms.sum() * (like.numel() // terms.numel())


class SegmentGroups(Groups):
    """Graph attention: logits [E, H] for edges src -> dst; each destination node attends over its
    incoming edges (the layout of PyG's `softmax(src, index)`). A node without incoming edges (an
    isolated node, a padding node) is not a valid query."""

    def __init__(self, dst: Tensor, src: Tensor, num_nodes: int, num_src_nodes: int | None = None):
        if dst.shape != src.shape or dst.dim() != 1:
            raise ValueError("SegmentGroups needs 1-D dst and src index tensors of equal length")
        self.dst = dst
        self.src = src
        self.num_nodes = int(num_nodes)
        self.num_src_nodes = int(num_src_nodes if num_src_nodes is not None else num_nodes)
        self._padding: tuple[Tensor, Tensor, Tensor] | None = None
        self._csr: Tensor | None = None

    @property
    def valid(self) -> Tensor | None:
        return None

    # Counted by index_add into a tensor of the known size: bincount's size is the largest index, a device sync.
    @cached_property
    def _in_degree(self) -> Tensor:
        return self.dst.new_zeros(self.num_nodes).index_add_(0, self.dst, torch.ones_like(self.dst))

    @cached_property
    def _out_degree(self) -> Tensor:
        return self.src.new_zeros(self.num_src_nodes).index_add_(0, self.src, torch.ones_like(self.src))

    @cached_property
    def _valid_queries(self) -> Tensor | None:
        rows = self._in_degree > 0
        return None if host_reads_are_cheap(rows) and bool(rows.all()) else rows.unsqueeze(-1)

    @property
    def valid_queries(self) -> Tensor | None:
        return self._valid_queries

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
        from torch_geometric.utils import scatter  # imported here: see `softmax`

        return scatter(x, self.dst, dim=0, dim_size=self.num_nodes, reduce=how)

    def _sum_into_nodes(self, x: Tensor) -> Tensor:
        if self._csr_pays(x):
            flat = x.reshape(x.shape[0], -1)
            return (self._edge_matrix(x) @ flat).view(-1, *x.shape[1:])
        # index_add_ rather than PyG's scatter-sum, which first expands the index to x's full shape
        # (several times slower for [E, H, d] messages on CPU, measured).
        return x.new_zeros(self.num_nodes, *x.shape[1:]).index_add_(0, self.dst, x)

    @staticmethod
    def _csr_pays(x: Tensor) -> bool:
        """A CSR sparse-dense product sums [E, w] into nodes 2-8x faster than index_add_ on CPU for w <= 64
        (Cora, one thread: 0.15 vs 0.41 ms at w = 8, 0.29 vs 0.65 ms at w = 64) but slower for wider rows
        (14 vs 8 ms at w = 512, fenchel-exact's d x d moments), and its backward is slower than index_add_'s:
        used without autograd (solver loops, diagnostics), in the dtypes CSR products support everywhere, and
        not under autocast (--precision bf16-mixed), which would cast the product to a dtype CSR lacks on CPU."""
        width = math.prod(x.shape[1:]) if x.shape[0] else 0  # from the shape: x[0] would be an op (a select)
        return (
            not (torch.is_grad_enabled() and x.requires_grad)
            and x.dtype in (torch.float32, torch.float64)
            and not torch.is_autocast_enabled(x.device.type)
            and 0 < width <= 64
        )

    def _edge_matrix(self, like: Tensor) -> Tensor:
        """The [N, E] 0/1 incidence matrix of destinations, CSR, cached in like's dtype and device."""
        if self._csr is None or self._csr.dtype != like.dtype or self._csr.device != like.device:
            edges = torch.arange(self.dst.numel(), device=self.dst.device)
            ones = torch.ones(edges.numel(), dtype=like.dtype, device=like.device)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
                self._csr = torch.sparse_coo_tensor(
                    torch.stack([self.dst, edges]).to(like.device), ones, (self.num_nodes, edges.numel())
                ).to_sparse_csr()
        return self._csr

    def sums(self, *xs: Tensor) -> tuple[Tensor, ...]:
        both = torch.cat(xs, dim=1) if len(xs) > 1 else None
        if both is None or not self._csr_pays(both):
            return super().sums(*xs)
        # One sparse product for all of them (the Newton solvers need two sums per step).
        widths = [x.shape[1] for x in xs]
        return tuple(self._sum_into_nodes(both).split(widths, dim=1))

    def group_size(self, like: Tensor) -> Tensor:
        return self._in_degree.to(like.dtype).view(-1, *([1] * (like.dim() - 1)))

    def softmax(self, logits: Tensor) -> Tensor:
        # Imported here, not at the top: PyG's import takes ~1.3 s and pulls in torch._dynamo and transformers
        # (with a FutureWarning), which dense hosts (modules.hf) never need.
        if takes_cuda_path(logits):
            return _SegmentSoftmax.apply(logits, self.dst, self.num_nodes)
        from torch_geometric.utils import softmax as segment_softmax

        return segment_softmax(logits, self.dst, num_nodes=self.num_nodes, dim=0)

    def weighted_sum_operator(self, x: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
        # One sparse CSR product of the weights (block-diagonal over heads) with x, whose index structure is
        # built once here, accumulated onto base by addmm. Measured for fenchel-exact's d² = 64 per-key outer
        # products on Cora (8 heads, one thread): a third of the time of gathering x per edge and summing
        # into the nodes, which is what `aggregate` does.
        heads, width, queries, keys = x.shape[1], x.shape[-1], self.num_nodes, self.num_src_nodes
        order = torch.argsort(self.dst, stable=True)
        per_row = self._in_degree.repeat(heads)
        rows = torch.cat([per_row.new_zeros(1), per_row.cumsum(0)])
        columns = (self.src[order].unsqueeze(0) + keys * torch.arange(heads, device=order.device).unsqueeze(1)).flatten()
        x_by_head = x.transpose(0, 1).reshape(heads * keys, width)

        def weighted_sum(weights: Tensor, base: Tensor) -> Tensor:
            block = torch.sparse_csr_tensor(rows, columns, weights.index_select(0, order).t().flatten(), (heads * queries, heads * keys))
            base_by_head = base.expand(queries, heads, width).transpose(0, 1).reshape(heads * queries, width)
            return torch.addmm(base_by_head, block, x_by_head).view(heads, queries, width).transpose(0, 1)

        return weighted_sum

    can_restrict_queries = True

    def restrict_queries(self, rows: Tensor) -> tuple["SegmentGroups", Tensor]:
        renumber = torch.full((self.num_nodes,), -1, dtype=torch.long, device=rows.device)
        renumber[rows] = torch.arange(rows.numel(), device=rows.device)
        new_dst = renumber.index_select(0, self.dst)
        kept = (new_dst >= 0).nonzero().squeeze(1)
        sub = SegmentGroups(dst=new_dst.index_select(0, kept), src=self.src.index_select(0, kept), num_nodes=rows.numel(),
                            num_src_nodes=self.num_src_nodes)
        return sub, kept

    def aggregate(self, weights: Tensor, v: Tensor) -> Tensor:
        return self._sum_into_nodes(self.per_key(v) * weights.unsqueeze(-1))

    def _sum_into_keys(self, x: Tensor) -> Tensor:
        return x.new_zeros(self.num_src_nodes, *x.shape[1:]).index_add_(0, self.src, x)

    def sum_over_queries(self, weights: Tensor, x: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        weighted = None if x is None else self._sum_into_keys(weights.unsqueeze(-1) * self.per_query(x))
        return self._sum_into_keys(weights), weighted

    def key_degree(self) -> Tensor | None:
        return self._out_degree.to(torch.get_default_dtype()).unsqueeze(-1)

    def mean_over_keys(self, per_key: Tensor) -> Tensor:
        seen = (self._out_degree > 0).unsqueeze(-1).expand_as(per_key)
        return torch.where(seen, per_key, 0.0).sum() / seen.sum().clamp_min(1)

    def second_moment(self, weights: Tensor, x: Tensor) -> Tensor:
        # Outer products per edge from the gathered d-vectors (gathering precomputed d² outer products per
        # key costs a third more, measured).
        per_edge = self.per_key(x)
        outer = (per_edge * weights.unsqueeze(-1)).unsqueeze(-1) * per_edge.unsqueeze(-2)
        return self.reduce(outer, "sum")

    def map_keys(self, fn: Callable[[Tensor], Tensor], k: Tensor) -> Tensor:
        return fn(k)  # node layout [Nk, H, d] is item-major already

    def query_and_key_sets(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        heads = q.shape[1]
        q_valid = None if self.valid_queries is None else self.valid_queries.squeeze(-1).expand(heads, -1)
        keys_seen = self._out_degree > 0
        k_valid = None if host_reads_are_cheap(keys_seen) and bool(keys_seen.all()) else keys_seen.expand(heads, -1)
        return q.transpose(0, 1), k.transpose(0, 1), q_valid, k_valid

    def sum_over_pairs(self, x: Tensor, like: Tensor) -> Tensor:
        return x.sum() * (like.numel() // x.numel())  # every edge is a valid pair

    def _sorted(self) -> tuple[Tensor, Tensor, Tensor]:
        from torch_geometric.utils import to_dense_batch

        if self._padding is None:
            order = torch.argsort(self.dst, stable=True)
            _, mask = to_dense_batch(self.dst[order], self.dst[order], batch_size=self.num_nodes)
            self._padding = (order, mask, torch.argsort(order))
        return self._padding

    def pad(self, x: Tensor, fill: float) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
        from torch_geometric.utils import to_dense_batch

        order, mask, inverse = self._sorted()
        dense, _ = to_dense_batch(x[order], self.dst[order], fill_value=fill, batch_size=self.num_nodes)
        # [N, K, *rest] -> [N, *rest, K]: keys on the last axis, as in DenseGroups.
        dense = dense.movedim(1, -1)

        def unpad(padded: Tensor) -> Tensor:
            return padded.movedim(-1, 1)[mask][inverse]

        return dense, unpad


class _SegmentSoftmax(torch.autograd.Function):
    """Softmax over each destination's incoming edges, logits [E, ...] -> weights [E, ...], in as few kernels as
    are exact: PyG's form spends about 16 ops a call (index views and expansions for its scatters, a detach, an
    epsilon added to the sums) and its autograd backward about 10 (the division's two gradients, the gathers'
    scatters back); on a GPU each is a launch for a few thousand numbers, so launches are the cost. Here the
    forward is a per-node max (index_reduce: the index stays 1-D), its gather, sub, exp, a per-node sum and its
    gather, and a division (9 ops); the backward p * (g - Σ_group p g) is a product, its per-node sum, a gather
    and one addcmul (5). The CUDA path's form (`SegmentGroups.softmax`); the CPU keeps PyG's, whose results the
    committed records hold. Equal to it to float rounding (the max is the same shift; PyG's 1e-16 on sums of at
    least 1 is below a float's resolution)."""

    @staticmethod
    def forward(ctx, logits: Tensor, dst: Tensor, num_nodes: int) -> Tensor:
        # forward runs without autograd, so the max needs no detach; nodes without edges are never gathered, so
        # their uninitialised rows (include_self=False on an empty tensor) are never read
        shape = (num_nodes, *logits.shape[1:])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "index_reduce() is in beta"
            top = logits.new_empty(shape).index_reduce_(0, dst, logits, "amax", include_self=False)
        e = (logits - top.index_select(0, dst)).exp_()
        total = e.new_zeros(shape).index_add_(0, dst, e)
        weights = e.div_(total.index_select(0, dst))
        ctx.save_for_backward(weights, dst)
        ctx.num_nodes = num_nodes
        return weights

    @staticmethod
    def backward(ctx, grad: Tensor):
        weights, dst = ctx.saved_tensors
        weighted = grad * weights
        total = weighted.new_zeros((ctx.num_nodes, *weighted.shape[1:])).index_add_(0, dst, weighted)
        return torch.addcmul(weighted, weights, total.index_select(0, dst), value=-1), None, None
