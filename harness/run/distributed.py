"""Lightning DDP for one large run: `attnbench run|tune ... --strategy ddp --devices N [--num-nodes M]`.

Suites fan out whole runs over workers (`bench --workers N`); DDP is for a single run too big for one
device. Lightning starts ranks 1..N-1 by re-running the same command line with LOCAL_RANK set (under
`srun`, SLURM starts every rank), so every process walks through the same CLI code. `start` joins the
process group before any work, which lets rank 0 send the others what to train (tuning samples a trial on
rank 0 only) before a Trainer exists; the Trainer then reuses the group. Side effects (records, studies,
progress lines) stay on rank 0."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

STRATEGIES = ("auto", "ddp")


@dataclass(frozen=True)
class Distribution:
    """How one run is spread over processes; `auto` is one process on one device."""

    strategy: str = "auto"
    devices: int = 1
    num_nodes: int = 1

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"--strategy {self.strategy!r}: choose one of {', '.join(STRATEGIES)}")
        if self.devices < 1 or self.num_nodes < 1:
            raise ValueError("--devices and --num-nodes must be at least 1")
        if self.strategy == "auto" and (self.devices > 1 or self.num_nodes > 1):
            raise ValueError(f"--devices {self.devices} --num-nodes {self.num_nodes} needs --strategy ddp: one run uses one device "
                             "unless it is data-parallel (to run many runs at once, use `attnbench bench --workers N`)")

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes

    @property
    def is_distributed(self) -> bool:
        return self.strategy == "ddp"

    def trainer_kwargs(self) -> dict[str, Any]:
        if not self.is_distributed:
            return {"devices": 1}
        from lightning.pytorch.strategies import DDPStrategy

        # Variants may own parameters that some configurations leave out of the loss (a learned prior
        # when it is fixed, ...); plain DDP would stop with an error on those.
        strategy = DDPStrategy(find_unused_parameters=True, timeout=process_group_timeout())
        return {"devices": self.devices, "num_nodes": self.num_nodes, "strategy": strategy}

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "world_size": self.world_size}


SINGLE = Distribution()

TIMEOUT_ENV = "ATTNBENCH_DDP_TIMEOUT_MIN"
DEFAULT_TIMEOUT_MIN = 10.0
"""A collective that waits longer than this ends the run with an error instead of hanging: a rank that died
(an OOM on one GPU) otherwise leaves the others in all-reduce for torch's default 30 minutes (NCCL), or for
ever where no timeout applies. Ten minutes is far above any step or validation pass of the suites here."""


def process_group_timeout() -> timedelta:
    value = os.environ.get(TIMEOUT_ENV)
    return timedelta(minutes=float(value) if value else DEFAULT_TIMEOUT_MIN)


def start(distribution: Distribution) -> int:
    """Start (on rank 0) or join (on the others) the run's processes; returns this process's global rank.
    The process group uses gloo on CPU and NCCL on GPUs, as Lightning chooses."""
    if not distribution.is_distributed:
        return 0
    from lightning.fabric import Fabric

    from lightning.fabric.strategies import DDPStrategy

    fabric = Fabric(accelerator="auto", strategy=DDPStrategy(timeout=process_group_timeout()), devices=distribution.devices,
                    num_nodes=distribution.num_nodes)
    fabric.launch()
    return fabric.global_rank


def global_rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


def broadcast(value: Any) -> Any:
    """Rank 0's `value` on every rank (a no-op without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def leave() -> None:
    """Close the process group once the distributed part is over (rank 0 then tests on one device, so that
    every test example is counted exactly once, as Lightning recommends)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
