"""S seeds of one GAT configuration trained as one model: two hosts, one per kind of device.

On CPU, `LockstepGATs`: the seeds' own lone GATs, each called with its lone run's code on its own parameters,
optimised by one optimiser over all of them. Every operation a seed's numbers go through, its gradient sums and
Adam's elementwise update included, is then the same kernel on the same shapes as its lone run's, so a batched
seed trains bit for bit as its lone run on any CPU, by construction rather than by the luck of a kernel choice.
Stacked parameters were tried first (one `bmm` for the second layer, one block-diagonal sparse product for the
first, one ELU over [S, N, H·D]): on an AMD EPYC the sums happened to round as the lone run's, on an Intel Xeon
the second layer's weight gradient from `bmm`'s backward was 2e-10 off `mm`'s, and elementwise
kernels with a scalar tail (ELU's expm1, Adam's fused multiply-adds) round the tail differently from the vector
body, which a stacked tensor moves. What the batch still saves on CPU is the per-run cost around the step: one
process, one data load, one loop and one validation pass for S seeds (measured: leaderboards/studies/seed-batch-cora/README.md).

On a GPU, `SeedBatchedGAT`: the host parameters stacked along a new first axis, so the host maths runs once for
all seeds (the first layer's sparse product as one block-diagonal product, the second as `bmm`, GAT's queries,
keys and edge logits, the attention dropout's product, the aggregation with the seeds folded into the head axis),
which is where a GPU's gain comes from: per-seed launches are what a Cora step is made of there. Its seeds equal
their lone runs to float tolerance, not bit for bit (tested on CPU).

In both, each seed's edge weights come from its own kernel module called on that seed's logits, queries and keys
alone (the lone layer's own call, gat.normalized), so a variant's file never sees the seed axis, and each seed
draws its dropout masks and its kernel's noise from its own generator in the lone run's order (input dropout,
kernel noise, attention dropout, per layer): seed s's masks are its lone run's whatever other seeds share the
batch. On CPU everything from each seed's h to its weights is the lone run's code (gat.attention_weights).
One exception, on the CUDA path only: where `kernel.folds_heads` says a layer's kernels qualify (heads independent,
no parameters, buffers or noise, nothing measured in the call: softmax in training and in unmeasured validation
passes), one call of the kernel takes every seed's logits with the seeds folded into the heads axis ([E, S·H]):
it sees S·H heads, still no seed axis, and gives each seed the weights its own call would, to float tolerance.
The per-seed kernel calls, forward and backward, were most of a 20-seed Cora epoch's launches. The attention dropout
stays outside the kernel, each seed's mask drawn from its own generator as before.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import AttentionResult, SegmentGroups
from ..attention.kernel import folds_heads
from ..device_policy import takes_cuda_path
from .gat import GAT, mean_of_heads, normalized

HOST_PARAMETERS = ("weight", "att_src", "att_dst", "bias")
"""A GATLayer's own parameters; its kernel's stay in the kernel module."""


def seed_dropout(x: Tensor, p: float, training: bool, generators: Sequence[torch.Generator | None], dim: int = 0) -> Tensor:
    """Dropout of x with the seeds on axis `dim`: seed s's mask drawn from generators[s], the mask `gat.dropout` draws
    for x's slice s alone (the same draws, scaled by the same division, for every seed at once). The masks are drawn
    into one buffer with the seeds first, each seed's a contiguous slice as a lone run's `empty_like` is (so the same
    draws in the same order), and applied in one product: one launch per seed, not two and a stack."""
    if not training or p == 0.0:
        return x
    keep = x.new_empty((x.shape[dim], *x.shape[:dim], *x.shape[dim + 1:]))
    for seed_keep, generator in zip(keep.unbind(0), generators, strict=True):
        kept_entries_into(seed_keep, p, generator)
    keep = keep.div_(1 - p)
    return x * (keep if dim == 0 else keep.movedim(0, dim))


def kept_entries_into(out: Tensor, p: float, generator: torch.Generator | None) -> Tensor:
    """`gat.kept_entries` drawn into `out` (contiguous, the shape and dtype of the lone run's tensor): the same draws."""
    return out.bernoulli_(1 - p, generator=generator)


class SeedBatchedGAT(nn.Module):
    """The host parameters of `models` stacked along a new first axis; the kernels are the models' own modules."""

    def __init__(self, models: Sequence[GAT]):
        super().__init__()
        first = models[0]
        self.seeds = len(models)
        self.dropout = first.dropout
        self.shapes = [(layer.heads, layer.out_dim, layer.concat, layer.attn_dropout, layer.negative_slope) for layer in first.layers]
        self.host = nn.ParameterList()
        for i in range(len(first.layers)):
            for name in HOST_PARAMETERS:
                self.host.append(nn.Parameter(torch.stack([getattr(m.layers[i], name).detach() for m in models]).clone()))
        self.kernels = nn.ModuleList(nn.ModuleList(m.layers[i].kernel for m in models) for i in range(len(first.layers)))

    def layer_parameters(self, i: int) -> dict[str, Tensor]:
        return dict(zip(HOST_PARAMETERS, list(self.host)[i * len(HOST_PARAMETERS):(i + 1) * len(HOST_PARAMETERS)]))

    def forward(self, x: Tensor, groups: SegmentGroups, traces: list[list] | None = None,
                generators: Sequence[torch.Generator | None] | None = None) -> Tensor:
        """Class logits [S, N, C]; seed s's (kernel, result) pairs go to traces[s]. In training `generators`
        holds one generator per seed."""
        gens = list(generators) if generators is not None and self.training else [None] * self.seeds
        h = None
        for i, (heads, out_dim, concat, attn_dropout, slope) in enumerate(self.shapes):
            p = self.layer_parameters(i)
            if i == 0:
                h = self._first_product(x, p["weight"], gens)
            else:
                h = torch.bmm(seed_dropout(x, self.dropout, self.training, gens), p["weight"])
            h = h.view(self.seeds, -1, heads, out_dim)  # [S, N, H, D]
            num_nodes = h.shape[1]
            # GAT's queries, keys and edge logits of every seed at once ([S, N, H, D] by the seeds' [S, 1, H, D]
            # vectors; the logits [S, E, H], the edges on the second axis); then each seed's own kernel module on its
            # own slices. unbind, not indexing per seed: an indexed slice's backward writes a zero tensor of the
            # whole batch per seed (S^2 work), unbind's stacks once.
            queries, keys = h * p["att_dst"], h * p["att_src"]
            # one seed has nothing to fold (the fold's folded queries and keys would be copies for nothing)
            if self.seeds > 1 and takes_cuda_path(h) and folds_heads(self.kernels[i]):
                weights = self._folded_weights(self.kernels[i], queries, keys, groups, slope, traces)  # [E, S, H]
                weights = seed_dropout(weights, attn_dropout, self.training, gens, dim=1).flatten(1, 2)
                out = groups.aggregate(weights, h.transpose(0, 1).flatten(1, 2))
            else:
                logits = F.leaky_relu(keys.sum(-1).index_select(1, groups.src) + queries.sum(-1).index_select(1, groups.dst), slope)
                per_seed = zip(self.kernels[i], logits.unbind(0), queries.unbind(0), keys.unbind(0))
                weights = torch.stack([normalized(kernel, seed_logits, groups, q, k, traces[s] if traces is not None else None, gens[s])
                                       for s, (kernel, seed_logits, q, k) in enumerate(per_seed)])
                out = self._aggregate(groups, seed_dropout(weights, attn_dropout, self.training, gens), h)
            out = out.view(num_nodes, self.seeds, heads, out_dim).transpose(0, 1)
            out = out.reshape(self.seeds, num_nodes, heads * out_dim) if concat else mean_of_heads(out, dim=2)
            x = out + p["bias"].unsqueeze(1)
            if i < len(self.shapes) - 1:
                x = F.elu(x)
        return x

    def _folded_weights(self, kernels: Sequence[nn.Module], queries: Tensor, keys: Tensor, groups: SegmentGroups,
                        slope: float, traces: list[list] | None) -> Tensor:
        """Every seed's edge weights [E, S, H] from one call of the layer's kernel on the seeds folded into the heads
        axis (logits [E, S·H], queries and keys [N, S·H, D]), where `folds_heads` says that call gives each seed the
        weights its own call would (heads independent, no parameters, no noise, nothing measured). The kernel sees
        S·H heads, never a seed axis; a seed's trace gets its own kernel with its slice of the weights."""
        seeds, num_nodes, heads, dim = queries.shape
        # the logits with the edges first ([E, S, H]: index_select writes a fresh tensor), so that S·H is one axis
        logits = F.leaky_relu(keys.sum(-1).transpose(0, 1).index_select(0, groups.src)
                              + queries.sum(-1).transpose(0, 1).index_select(0, groups.dst), slope)
        folded_q = queries.transpose(0, 1).reshape(num_nodes, seeds * heads, dim)
        folded_k = keys.transpose(0, 1).reshape(num_nodes, seeds * heads, dim)
        kernel = kernels[0]
        kernel.noise_generator = None  # folds_heads: the kernel draws nothing
        result = kernel.normalize(logits.flatten(1, 2), groups, q=folded_q, k=folded_k)
        if result.aux_losses or result.diagnostics:
            raise RuntimeError(f"{type(kernel).__name__} declares independent_heads but returned aux losses or diagnostics "
                               "in a call that measures nothing: they would mix the seeds (kernel.folds_heads)")
        weights = result.weights.view(-1, seeds, heads)
        if traces is not None:
            for trace, own, seed_weights in zip(traces, kernels, weights.unbind(1), strict=True):
                trace.append((own, AttentionResult(seed_weights)))
        return weights

    @staticmethod
    def _aggregate(groups: SegmentGroups, weights: Tensor, h: Tensor) -> Tensor:
        """Seeds' weighted sums [N, S·H, D] of the weights [S, E, H] and features h [S, N, H, D], the seeds folded
        into the head axis: one aggregation for every seed."""
        return groups.aggregate(weights.transpose(0, 1).flatten(1, 2), h.transpose(0, 1).flatten(1, 2))

    def _first_product(self, x: Tensor, weight: Tensor, gens: Sequence[torch.Generator | None]) -> Tensor:
        """Every seed's (dropped-out) sparse features times its own weight, as one block-diagonal sparse
        product: [S·N, S·F] x [S·F, H·D]; rows of block s are seed s's nodes. One product instead of S
        keeps the per-step overhead of a lone run's one product (the reason a Cora epoch is cheap)."""
        seeds, num_features = self.seeds, weight.shape[1]
        if not x.is_sparse:
            return torch.bmm(seed_dropout(x.expand(seeds, *x.shape), self.dropout, self.training, gens), weight)
        x = x.coalesce()
        index, values = x.indices(), x.values()
        num_nodes = x.shape[0]
        offsets = torch.arange(seeds, device=x.device)
        rows = (index[0].unsqueeze(0) + offsets.unsqueeze(1) * num_nodes).reshape(-1)
        cols = (index[1].unsqueeze(0) + offsets.unsqueeze(1) * num_features).reshape(-1)
        vals = seed_dropout(values.expand(seeds, -1), self.dropout, self.training, gens).reshape(-1)
        block = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (seeds * num_nodes, seeds * num_features), is_coalesced=True)
        return torch.sparse.mm(block, weight.reshape(seeds * num_features, -1))

    def write_into(self, s: int, model: GAT, host: Sequence[Tensor] | None = None) -> None:
        """Copy seed s's host parameters (or a saved `host` snapshot of them) into its lone model."""
        source = list(host) if host is not None else [p[s] for p in self.host]
        with torch.no_grad():
            for i, layer in enumerate(model.layers):
                for j, name in enumerate(HOST_PARAMETERS):
                    getattr(layer, name).copy_(source[i * len(HOST_PARAMETERS) + j])

    def host_snapshot(self, s: int) -> list[Tensor]:
        return [p[s].detach().clone() for p in self.host]

    def host_snapshots(self, positions: Sequence[int]) -> list[list[Tensor]]:
        """`host_snapshot` of each seed in `positions`: one gather per stacked parameter for them all, each seed's
        tensors views of it (a copy per seed and parameter was most of a seed batch's epoch-end ops)."""
        if not positions:
            return []
        index = torch.tensor(list(positions), device=self.host[0].device)
        rows = [p.detach().index_select(0, index).unbind(0) for p in self.host]
        return [[row[j] for row in rows] for j in range(len(positions))]

    def keep(self, seeds: Sequence[int]) -> dict[int, tuple[nn.Parameter, Tensor | None]]:
        """Drop every seed not in `seeds` (stopped or failed: compute is not spent on them, and nothing can
        change their parameters). Returns {id(old parameter): (new parameter, the rows of the old one it keeps)}
        for the optimiser's state."""
        index = torch.as_tensor(list(seeds), device=self.host[0].device)
        moved = {}
        new = nn.ParameterList()
        for p in self.host:
            q = nn.Parameter(p.detach().index_select(0, index).clone())
            moved[id(p)] = (q, index)
            new.append(q)
        self.host = new
        self.kernels = nn.ModuleList(nn.ModuleList(layer[s] for s in seeds) for layer in self.kernels)
        self.seeds = len(seeds)
        return moved


class LockstepGATs(nn.Module):
    """The CPU seed batch: the seeds' lone GATs side by side, each run by its own `GAT.forward` (module
    docstring: why this, and not stacked parameters, is what keeps a seed bit for bit its lone run on any CPU).
    It offers `SeedBatchedGAT`'s interface, so the seed-batch loop does not know which host it trains."""

    def __init__(self, models: Sequence[GAT]):
        super().__init__()
        self.models = nn.ModuleList(models)
        self.seeds = len(models)

    @property
    def kernels(self) -> list[list[nn.Module]]:
        return [[m.layers[i].kernel for m in self.models] for i in range(len(self.models[0].layers))]

    def layer_parameters(self, i: int) -> dict[str, list[Tensor]]:
        return {name: [getattr(m.layers[i], name) for m in self.models] for name in HOST_PARAMETERS}

    def forward(self, x: Tensor, groups: SegmentGroups, traces: list[list] | None = None,
                generators: Sequence[torch.Generator | None] | None = None) -> Tensor:
        """Class logits [S, N, C]. In training each lone model draws from its own noise stream, the generator the
        caller passes as generators[s] (checked: a batch drawing another seed's masks is a defect)."""
        if generators is not None and self.training:
            for model, generator in zip(self.models, generators):
                if generator is not None and model.noise.on(generator.device) is not generator:
                    raise ValueError("a seed's noise must come from its own model's stream")
        return torch.stack([model(x, groups, traces[s] if traces is not None else None) for s, model in enumerate(self.models)])

    def write_into(self, s: int, model: GAT, host: Sequence[Tensor] | None = None) -> None:
        source = list(host) if host is not None else self.host_snapshot(s)
        with torch.no_grad():
            for i, layer in enumerate(model.layers):
                for j, name in enumerate(HOST_PARAMETERS):
                    getattr(layer, name).copy_(source[i * len(HOST_PARAMETERS) + j])

    def host_snapshot(self, s: int) -> list[Tensor]:
        return [getattr(layer, name).detach().clone() for layer in self.models[s].layers for name in HOST_PARAMETERS]

    def host_snapshots(self, positions: Sequence[int]) -> list[list[Tensor]]:
        return [self.host_snapshot(s) for s in positions]

    def keep(self, seeds: Sequence[int]) -> dict[int, tuple[nn.Parameter, Tensor | None]]:
        """Drop the models not in `seeds`; the kept ones carry their parameters (and so their optimiser state) whole."""
        self.models = nn.ModuleList(self.models[s] for s in seeds)
        self.seeds = len(seeds)
        return {id(p): (p, None) for m in self.models for layer in m.layers for p in (getattr(layer, n) for n in HOST_PARAMETERS)}


def seed_batch_host(models: Sequence[GAT], device: torch.device) -> nn.Module:
    """The seed batch's host for `device`: stacked parameters where the batching pays (a GPU), the lone models
    in lockstep where bit-identity with lone runs is the point and stacking would break it (a CPU). The device
    policy decides, so that a CPU run "as on CUDA" (the GPU cost page) builds the GPU's host."""
    return SeedBatchedGAT(models) if takes_cuda_path(device) else LockstepGATs(models)
