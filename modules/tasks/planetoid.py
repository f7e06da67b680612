"""cora, citeseer, pubmed: GAT node classification (Veličković et al. 2018 setup)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from annotated_types import Ge, Gt, Interval

from datamodules.planetoid import PlanetoidDataModule, data_available

from ..hosts.gat import GAT
from ..lit.node_classification import NodeClassificationModule
from .base import Metric, Task, TrainParams, register_task, resolve_kernel_lr_scale


@dataclass(frozen=True)
class GATParams(TrainParams):
    dataset: str = "cora"
    hidden: Annotated[int, Ge(1)] = 8
    heads: Annotated[int, Ge(1)] = 8
    out_heads: Annotated[int, Ge(1)] = 1
    dropout: Annotated[float, Interval(ge=0, lt=1)] = 0.6
    attn_dropout: Annotated[float, Interval(ge=0, lt=1)] = 0.6
    lr: Annotated[float, Gt(0)] = 0.005
    weight_decay: Annotated[float, Ge(0)] = 5e-4
    max_epochs: Annotated[int, Ge(1)] = 1000
    patience: Annotated[int, Ge(0)] = 100
    kernel_lr_scale: Annotated[float | None, Gt(0)] = None
    """Learning-rate multiplier of the attention kernels' own parameter group; None = KERNEL_LR / lr, i.e.
    the kernels train at 1e-2 whatever the host's rate (modules/lit/optimization.py says why)."""

    def __post_init__(self):
        resolve_kernel_lr_scale(self)


@register_task("cora", dataset="cora")
@register_task("citeseer", dataset="citeseer")
@register_task("pubmed", dataset="pubmed", out_heads=8, lr=0.01, weight_decay=0.001)
class PlanetoidTask(Task):
    Params = GATParams
    version = "1"
    metrics = (Metric("test/acc"), Metric("test/macro_f1"))
    monitor = Metric("val/loss", higher_is_better=False)

    def data_problem(self, data_root):
        return data_available(self.preset["dataset"], data_root)

    def build(self, params: GATParams, attention, *, data_root, cache_dir):
        dm = PlanetoidDataModule(params.dataset, data_root, cache_dir)
        model = GAT(
            dm.num_features,
            dm.num_classes,
            attention,
            hidden=params.hidden,
            heads=params.heads,
            out_heads=params.out_heads,
            dropout=params.dropout,
            attn_dropout=params.attn_dropout,
        )
        module = NodeClassificationModule(model, dm.num_classes, lr=params.lr, weight_decay=params.weight_decay)
        module.kernel_lr_scale = params.kernel_lr_scale
        return dm, module
