"""`LightningModule.log` for a value a module logs again and again under the same name with the same arguments (a graph
host's per-epoch values), without Lightning's per-call set-up after the first call.

Each `self.log` call costs Lightning about 0.3 ms of host time before it stores the value (measured on Cora under
the CUDA path, 4 calls an epoch: ~1.4 ms of the lone epoch's ~5.7 ms outside kernels): checks of the value and the
hook, a fresh metadata record compared with the stored one, and `_ResultMetric.to(device)`, which rebuilds the
stored metric's whole attribute dict (its metadata dataclass deep-copied) even when nothing moves. None of that
changes what is stored once the first call of a name has registered it. `RepeatLog` makes that first call through
`LightningModule.log` and every later one as its last steps do: the tensor reset at a new hook, the value detached
and squeezed as Lightning hands it on (not copied first: the update copies or adds it into a state of its own, so
Lightning's copy was an op for nothing), and the stored metric's update. It goes back to `LightningModule.log` whenever anything it relies on differs from that
first call: another result collection (a new loop or Trainer), the entry gone or replaced, other arguments, a
value on another device than the stored one (Lightning moves the collection to the CPU when a loop ends), another
metric object, or a Lightning without the internals it calls. tests/modules/test_repeat_log.py compares what
Trainers see through it with what they see through `self.log`."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Mapping

from torch import Tensor
from torchmetrics import Metric


@dataclass
class _Site:
    results: weakref.ref
    """The result collection the first call stored into (weakly: a module outlives its Trainers)."""
    key: str
    metric: weakref.ref
    """The collection's `_ResultMetric` of the name."""
    kwargs: dict
    dataloader_idx: Any
    batch_size: int


class RepeatLog:
    """Per module: where each (hook, name) it logs is stored, once the first call has stored it."""

    def __init__(self) -> None:
        self._sites: dict[tuple[str, str], _Site] = {}

    def log(self, module, name: str, value, **kwargs) -> None:
        """`module.log(name, value, **kwargs)`."""
        trainer = module._trainer
        fx = module._current_fx_name
        site = self._sites.get((fx, name)) if trainer is not None else None
        if site is not None:
            results = trainer._results
            metric = results.get(site.key) if results is not None and site.results() is results else None
            if (metric is not None and metric is site.metric() and kwargs == site.kwargs
                    and results.dataloader_idx == site.dataloader_idx and _same_place(metric, value)):
                connector = trainer._logger_connector
                if connector.should_reset_tensors(fx):
                    results.reset(metrics=False, fx=fx)
                if isinstance(value, Tensor):
                    # LightningModule.log hands on value.clone().detach().squeeze(); the update never keeps the tensor
                    # it is given (it clones an on-step value and adds, or maxes, any other into a state of its own),
                    # so the copy is left out: a value in an autograd graph is detached, a 1-element one squeezed
                    if value.requires_grad:
                        value = value.detach()
                    if value.dim():
                        value = value.squeeze()
                results.update_metrics(site.key, value, site.batch_size)
                connector._current_fx = fx
                return
        module.log(name, value, **kwargs)
        self._remember(module, trainer, fx, name, value, kwargs)

    def log_dict(self, module, values: Mapping[str, Any], **kwargs) -> None:
        """`module.log_dict(values, **kwargs)`: each value as `log` logs it, in order."""
        for name, value in values.items():
            self.log(module, name, value, **kwargs)

    def _remember(self, module, trainer, fx, name: str, value, kwargs: dict) -> None:
        results = getattr(trainer, "_results", None) if trainer is not None else None
        connector = getattr(trainer, "_logger_connector", None)
        if (results is None or fx is None or getattr(module, "_fabric", None) is not None
                or not all(hasattr(results, a) for a in ("update_metrics", "reset", "dataloader_idx"))
                or not hasattr(connector, "should_reset_tensors") or not isinstance(value, (Tensor, Metric))):
            return
        key = f"{fx}.{name}"
        if kwargs.get("add_dataloader_idx", True) and results.dataloader_idx is not None:
            key += f".{results.dataloader_idx}"
        metric = results.get(key)
        if metric is None or not hasattr(metric, "meta"):
            return
        batch_size = kwargs.get("batch_size")
        if batch_size is None:
            if isinstance(value, Tensor) and metric.meta.on_epoch and metric.meta.is_mean_reduction:
                return  # Lightning finds such a batch size in each batch: no shortcut for it
            batch_size = 1  # what _ResultCollection._extract_batch_size gives a value it does not average
        self._sites[(fx, name)] = _Site(weakref.ref(results), key, weakref.ref(metric), dict(kwargs), results.dataloader_idx,
                                        batch_size)


def _same_place(metric, value) -> bool:
    """Whether `value` goes where the stored metric already is, so that Lightning's move of it would change nothing:
    a tensor on the device of the stored tensor states, or the very metric object stored."""
    if isinstance(value, Tensor):
        state = metric.__dict__.get("value")
        return metric.is_tensor and isinstance(state, Tensor) and state.device == value.device
    return isinstance(value, Metric) and not metric.is_tensor and metric.__dict__.get("value") is value
