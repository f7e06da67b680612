"""Evaluation samplers that count every example once under DDP.

Lightning shards a loader whose sampler is not a DistributedSampler with one that pads the data set to a
multiple of the world size by repeating examples, so that every rank runs the same number of batches. That
is needed for training (gradient all-reduce every step) but not for evaluation, where the repeated examples
are counted twice by the metrics synced over ranks (accuracy, F1, MCC, ECE, ...). Lightning's own
UnrepeatedDistributedSamplerWrapper (what it uses for `predict`) shards without padding; ranks may then run
one batch fewer than others, which is safe in evaluation: DDP syncs buffers only on the first evaluation
forward, and each rank runs at least one batch while the set has at least world-size examples (the sampler
asserts so). Lightning leaves a loader alone whose sampler is already a DistributedSampler, so handing it
this one is enough."""

from __future__ import annotations

from typing import Any

from torch.utils.data import Sampler


def distributed_kwargs(trainer: Any) -> dict[str, int] | None:
    """{num_replicas, rank} of a trainer running on several processes, None on one process or without one."""
    kwargs = getattr(trainer, "distributed_sampler_kwargs", None) if trainer is not None else None
    if not kwargs or kwargs.get("num_replicas", 1) <= 1:
        return None
    return {"num_replicas": kwargs["num_replicas"], "rank": kwargs["rank"]}


def unrepeated(sampler: Sampler, trainer: Any) -> Sampler:
    """`sampler`'s order cut into disjoint per-rank shards (rank r takes every world-size-th example from r) when
    `trainer` runs DDP; `sampler` itself otherwise."""
    kwargs = distributed_kwargs(trainer)
    if kwargs is None:
        return sampler
    from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSamplerWrapper

    return UnrepeatedDistributedSamplerWrapper(sampler, shuffle=False, **kwargs)
