"""Graph attention network (Veličković et al. 2018) whose edge normalisation is any attention variant.

We write the layer ourselves rather than use PyG's GATConv because GATConv hard-wires the segment
softmax; here GAT's edge logits LeakyReLU(a_dst·Wh_i + a_src·Wh_j) go to the variant's `normalize`
over SegmentGroups, and the variant's weights aggregate the messages. Every kernel sits at
AttentionSite("graph", "self"), and each layer appends (kernel, result) to the host's trace like every host.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.utils import add_self_loops, remove_self_loops

from ..attention import AttentionSite, SegmentGroups, build_attention
from .attention_layers import Trace

SITE = AttentionSite("graph", "self", sequence=False)
"""A node attends over its in-neighbours: self-attention over a graph, no token order."""


def graph_groups(edge_index: Tensor, num_nodes: int) -> SegmentGroups:
    """Each node attends over its in-neighbours and itself, as in GAT."""
    edge_index, _ = remove_self_loops(edge_index)
    edge_index, _ = add_self_loops(edge_index, num_nodes=num_nodes)
    return SegmentGroups(dst=edge_index[1], src=edge_index[0], num_nodes=num_nodes)


def noise_seed(seed: int) -> int:
    """The seed of a run's own noise stream (dropout masks, kernels' draws), derived from the run's seed but
    not equal to it: the global generator seeded with the run's seed initialises the parameters, and the
    same Mersenne-Twister seed would make the first masks reuse the initialisation's random numbers."""
    return int(np.random.SeedSequence([seed, 0x6A7]).generate_state(1, np.uint64)[0] >> 1)


def dropout(x: Tensor, p: float, training: bool, generator: torch.Generator | None) -> Tensor:
    """Dropout whose mask comes from `generator` (F.dropout takes none): a run's masks are then a function of
    its own seed alone, the same whether it trains alone or in a seed batch (harness/run/seed_batch.py)."""
    if not training or p == 0.0:
        return x
    return x * dropout_mask(x, p, generator)


def dropout_mask(like: Tensor, p: float, generator: torch.Generator | None) -> Tensor:
    """Kept entries 1/(1-p), dropped 0, drawn from `generator`."""
    return kept_entries(like, p, generator).div_(1 - p)


def kept_entries(like: Tensor, p: float, generator: torch.Generator | None) -> Tensor:
    """`dropout_mask` before its scaling: 1 where an entry is kept (probability 1 - p), 0 where dropped."""
    return torch.empty_like(like).bernoulli_(1 - p, generator=generator)


def sparse_dropout(x: Tensor, p: float, training: bool, generator: torch.Generator | None = None,
                   parts: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Dropout on a sparse COO tensor's stored values: the same law as dense dropout, since dropping a
    zero leaves it zero, without drawing a mask for every zero entry. `parts`: x's (indices(), values()) where the
    caller keeps them (a graph's features, the same tensor every epoch): two ops a call fewer."""
    if not training or p == 0.0:
        return x
    indices, values = parts if parts is not None else (x.indices(), x.values())
    return torch.sparse_coo_tensor(indices, dropout(values, p, True, generator), x.shape, is_coalesced=True)


class NoiseStream:
    """One run's generator on the device its tensors live on, made at first use (a Lightning run moves the
    model after building it) from the seed fixed when the model was built."""

    def __init__(self, seed: int):
        self.seed = seed
        self._generator: torch.Generator | None = None

    def on(self, device: torch.device) -> torch.Generator:
        if self._generator is None or self._generator.device != device:
            if self._generator is not None:
                raise RuntimeError("a run's noise stream cannot move between devices mid-run")
            self._generator = torch.Generator(device=device).manual_seed(self.seed)
        return self._generator

    def state_dict(self) -> dict:
        """The stream's position, for a mid-run checkpoint (harness/results/checkpoints.py): a resumed run must draw
        the masks its unkilled run would have drawn next. Plain tensors and strings (loadable with weights_only)."""
        if self._generator is None:
            return {"seed": self.seed, "device": None, "state": None}
        return {"seed": self.seed, "device": str(self._generator.device), "state": self._generator.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"a noise stream of seed {state['seed']} cannot be loaded into one of seed {self.seed}")
        if state["state"] is None:
            self._generator = None
            return
        device = torch.device(state["device"])
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device)
        # into the generator already made, when there is one: a seed batch holds it (gat_seed_batch.py checks that
        # each seed draws from its own model's stream object)
        self._generator.set_state(state["state"])


def attention_weights(kernel: nn.Module, h: Tensor, att_src: Tensor, att_dst: Tensor, groups: SegmentGroups,
                      negative_slope: float, trace: Trace | None, generator: torch.Generator | None) -> Tensor:
    """One layer's edge weights [E, H] from its node features h [N, H, D], by `kernel` over GAT's edge logits.
    The seed-batched host calls it once per seed, so each seed's graph from h to the weights is its lone run's
    op for op (gat_seed_batch.py says why that matters)."""
    # GAT's score halves a_dst·h_i and a_src·h_j are coordinate sums of these query and key
    # vectors; handing them (not h twice) to the kernel gives variants that compare or align
    # queries with keys two distinct point clouds.
    queries, keys = h * att_dst, h * att_src
    logits = F.leaky_relu(groups.per_key(keys.sum(-1)) + groups.per_query(queries.sum(-1)), negative_slope)
    return normalized(kernel, logits, groups, queries, keys, trace, generator)


def normalized(kernel: nn.Module, logits: Tensor, groups: SegmentGroups, queries: Tensor, keys: Tensor, trace: Trace | None,
               generator: torch.Generator | None) -> Tensor:
    """`kernel`'s edge weights [E, H] from one run's edge logits, its noise drawn from `generator`; the call's
    (kernel, result) goes to `trace`."""
    kernel.noise_generator = generator
    result = kernel.normalize(logits, groups, q=queries, k=keys)
    if trace is not None:
        trace.append((kernel, result))
    return result.weights


def mean_of_heads(out: Tensor, dim: int) -> Tensor:
    """The heads' mean of a non-concatenating layer. GAT's output layer has one head, whose mean is that head
    itself (a sum of one value divided by 1, exact in floating point): a view of it then, no kernel, and none in
    the backward pass either."""
    if out.shape[dim] == 1:
        return out.squeeze(dim)
    return out.mean(dim=dim)


class GATLayer(nn.Module):
    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        heads: int,
        attention: str | Mapping[str, Any],
        *,
        concat: bool = True,
        attn_dropout: float = 0.6,
        negative_slope: float = 0.2,
    ):
        super().__init__()
        self.heads, self.out_dim, self.concat = heads, out_dim, concat
        self.attn_dropout, self.negative_slope = attn_dropout, negative_slope
        self.weight = nn.Parameter(torch.empty(in_dim, heads * out_dim))
        self.att_src = nn.Parameter(torch.empty(1, heads, out_dim))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_dim))
        self.bias = nn.Parameter(torch.zeros(heads * out_dim if concat else out_dim))
        self.kernel = build_attention(attention, num_heads=heads, head_dim=out_dim, site=SITE)
        for p in (self.weight, self.att_src, self.att_dst):
            nn.init.xavier_uniform_(p)

    def forward(self, x: Tensor, groups: SegmentGroups, trace: Trace | None = None,
                generator: torch.Generator | None = None) -> Tensor:
        if x.is_sparse and torch.is_autocast_enabled(x.device.type):
            # Under mixed precision (--precision bf16-mixed/16-mixed) the sparse product's backward mixes the
            # fp32 sparse features with a half-precision gradient, which torch's sparse kernels refuse (CPU:
            # "expected scalar type Float but found BFloat16"); the dense features cost Cora 15 MB.
            x = x.to_dense()
        h = torch.sparse.mm(x, self.weight) if x.is_sparse else x @ self.weight
        h = h.view(-1, self.heads, self.out_dim)
        weights = attention_weights(self.kernel, h, self.att_src, self.att_dst, groups, self.negative_slope, trace, generator)
        weights = dropout(weights, self.attn_dropout, self.training, generator)
        out = groups.aggregate(weights, h)
        out = out.reshape(-1, self.heads * self.out_dim) if self.concat else mean_of_heads(out, dim=1)
        return out + self.bias


class GAT(nn.Module):
    """Two GAT layers: `heads` x `hidden` with ELU, then `out_heads` averaged into class logits."""

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        attention: str | Mapping[str, Any],
        *,
        hidden: int = 8,
        heads: int = 8,
        out_heads: int = 1,
        dropout: float = 0.6,
        attn_dropout: float = 0.6,
    ):
        super().__init__()
        self.dropout = dropout
        # After the caller seeded the global generator with the run's seed (runner._prepare), which the
        # parameter initialisation below draws from.
        self.noise = NoiseStream(noise_seed(torch.initial_seed()))
        self.layers = nn.ModuleList(
            [
                GATLayer(in_dim, hidden, heads, attention, concat=True, attn_dropout=attn_dropout),
                GATLayer(hidden * heads, num_classes, out_heads, attention, concat=False, attn_dropout=attn_dropout),
            ]
        )

    def forward(self, x: Tensor, groups: SegmentGroups, trace: Trace | None = None) -> Tensor:
        """Class logits [N, C]; each layer's (kernel, result) is appended to `trace`."""
        generator = self.noise.on(x.device) if self.training else None
        for i, layer in enumerate(self.layers):
            if x.is_sparse:
                x = sparse_dropout(x, self.dropout, self.training, generator, self._sparse_parts(x))
            else:
                x = dropout(x, self.dropout, self.training, generator)
            x = layer(x, groups, trace, generator)
            if i < len(self.layers) - 1:
                x = F.elu(x)
        return x

    def _sparse_parts(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x's indices and values, kept while x is the same tensor (a full-batch graph's features come back as the same
        tensor every epoch); views of x's own storage, so keeping them keeps nothing else alive."""
        kept = self.__dict__.get("_kept_sparse")
        if kept is None or kept[0] is not x:
            kept = (x, x.indices(), x.values())
            self.__dict__["_kept_sparse"] = kept
        return kept[1], kept[2]

    def kernels(self) -> list[nn.Module]:
        return [layer.kernel for layer in self.layers]
