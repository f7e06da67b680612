"""Turning the AttentionResults of every layer into one weighted aux loss and loggable diagnostics.

Shared by every LightningModule so that each task adds sum_k mean_l w_k(step) * aux_k,l the same way: each aux
term averaged over the attention calls that produce it, as both papers' codes do (BAM's GAT code averages its
KL over layers; alignment attention's trainer averages its adversarial loss over the encoder's layers), so a
term's strength does not grow with the host's depth. Every host
hands back a trace: the (kernel, AttentionResult) of each attention call in the order they ran
(modules/hosts/attention_layers.Trace)."""

from __future__ import annotations

import math
from collections import defaultdict
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor

from ..attention import AttentionKernel, AttentionResult
from ..attention.kernel import mechanism_diagnostics, mechanism_diagnostics_on


class DivergedError(FloatingPointError):
    """The training loss became NaN or infinite: the run is recorded as failed, the suite goes on."""


def weighted_aux_loss(
    results: Sequence[AttentionResult], kernels: Sequence[AttentionKernel], step: int, epoch: int = 0
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """Sum over aux terms of the mean, over the attention calls that return the term, of weight(step or epoch)
    * term; also each term's unweighted mean over those calls (for logging). Each kernel's schedule counts
    optimiser steps or completed epochs, as its config says. A call without the term (alignment at a
    cross-attention site) does not count towards its mean. None when every weight is 0."""
    weighted: dict[str, list[tuple[float, Tensor]]] = defaultdict(list)
    per_term: dict[str, list[Tensor]] = defaultdict(list)
    for result, kernel in zip(results, kernels, strict=True):
        weights = kernel.loss_weights(step, epoch)
        for name, value in result.aux_losses.items():
            per_term[name].append(value.detach())
            weighted[name].append((weights.get(name, 0.0), value))
    total: Tensor | None = None
    for name, terms in weighted.items():
        if not any(w for w, _ in terms):
            continue  # no call weighs it: the loss stays the task's alone
        mean = torch.stack([w * value for w, value in terms]).mean()
        total = mean if total is None else total + mean
    return total, {f"aux/{k}": torch.stack(v).mean() for k, v in per_term.items()}


def diagnostics(trace: Sequence[tuple[AttentionKernel, AttentionResult]]) -> dict[str, Tensor]:
    """Each diagnostic per attention call of the trace ("attn/l0/entropy") and averaged over them ("attn/entropy")."""
    logs: dict[str, Tensor] = {}
    per_name: dict[str, list[Tensor]] = defaultdict(list)
    for i, (_, result) in enumerate(trace):
        for name, value in result.diagnostics.items():
            logs[f"attn/l{i}/{name}"] = value
            per_name[name].append(value)
    logs.update({f"attn/{k}": torch.stack(v).mean() for k, v in per_name.items()})
    return logs


def mechanism_logs(trace: Sequence[tuple[AttentionKernel, AttentionResult]], task_loss: Tensor, step: int,
                   epoch: int = 0) -> dict[str, Tensor]:
    """The kernels' declared mechanism diagnostics (AttentionKernel.mechanism) as "diag/<name>": each the mean over
    the calls that report it, and each declared loss share, w·term / (task loss + Σ w·terms), with the terms
    averaged over calls and weighted as `weighted_aux_loss` weighs them. All detached, nothing read on the host:
    a module logs them, History keeps them per epoch. The hosts prefix "val/" for the validation pass."""
    if not trace or not mechanism_diagnostics_on():
        return {}
    per_name: dict[str, list[Tensor]] = defaultdict(list)
    shares: dict[str, str] = {}
    for kernel, result in trace:
        for declared in getattr(kernel, "mechanism", ()):
            if declared.loss_share is not None:
                shares[declared.name] = declared.loss_share
            elif declared.name in result.diagnostics:
                per_name[declared.name].append(result.diagnostics[declared.name].float())
    logs = {f"diag/{name}": torch.stack(values).mean() for name, values in per_name.items()}
    if shares:
        with torch.no_grad():
            weighted: dict[str, list[Tensor]] = defaultdict(list)
            for kernel, result in trace:
                weights = kernel.loss_weights(step, epoch)
                for name, value in result.aux_losses.items():
                    weighted[name].append(weights.get(name, 0.0) * value.detach().float())
            terms = {name: torch.stack(values).mean() for name, values in weighted.items()}
            total = task_loss.detach().float() + sum(terms.values())
            for name, term in shares.items():
                if term in terms:
                    logs[f"diag/{name}"] = terms[term] / total
    return logs


DIAGNOSED_EVERY = 8
"""A long graph fit measures its validation diagnostics in its first epochs and every this many after."""


def diagnosed_validation(epoch: int) -> bool:
    """Whether epoch `epoch` (0-based) measures its validation pass's mechanism diagnostics (the record's curves).
    Measured at every pass they took a third of a lone Cora epoch (the q/k distance's sorts, half the fit
    when training steps measured it too). The rules read the value at the evaluated weights, which the test pass
    measures, so the curves need only enough points to be drawn: the first 8 epochs, then every 8th, which puts
    one in every block of a record's curve once blocks are 8 epochs wide (fits over 240 epochs; callbacks.py
    History)."""
    return epoch < DIAGNOSED_EVERY or (epoch + 1) % DIAGNOSED_EVERY == 0


def schedule_point(module, split: str) -> tuple[int, int]:
    """(step, epoch) whose loss weights a pass's loss shares use: the training's own, or for the test pass those of
    the epoch whose weights it evaluates (`module.evaluated_at`, set by the harness from the stopping rule's kept
    epoch), so that `test/diag/kl_share` is the share at the evaluated weights. A seed batch tests with a fresh
    Trainer, whose epoch 0 would weigh an annealed KL at 0."""
    kept = getattr(module, "evaluated_at", None) if split == "test" else None
    return kept if kept is not None else (module.global_step, module.current_epoch)


def test_logs(module, trace: Sequence[tuple[AttentionKernel, AttentionResult]], loss: Tensor) -> dict[str, Tensor]:
    """A minibatch host's test-pass logs: each attention call's weights (test/attn/...) and the mechanism
    diagnostics at the evaluated weights (test/diag/<name>, which the mechanism rules read)."""
    logs = {f"test/{k}": v for k, v in diagnostics(trace).items()}
    logs.update({f"test/{k}": v for k, v in mechanism_logs(trace, loss, *schedule_point(module, "test")).items()})
    return logs


@contextmanager
def measured_if(measure: bool) -> Iterator[None]:
    """Mechanism diagnostics as they are, or off for this region; never turns them on where a caller turned them
    off (a test that shows they change no training number)."""
    if measure:
        yield
    else:
        with mechanism_diagnostics(False):
            yield


class ValidationMechanism:
    """A minibatch host's mechanism diagnostics over a validation epoch, as "val/diag/<name>": each batch's value
    weighted by its examples, summed over data-parallel ranks, so that 2 ranks give one process's value (as
    ExampleMean does for the loss; `self.log(..., sync_dist=True)` would average the ranks' means, which differs
    when their shards differ in size). The names are gathered from every rank first: a rank without a validation
    batch has none, and a collective over different lists would hang. The graph host needs none of this: every
    rank validates the whole graph."""

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}  # "diag/<name>" -> [Σ value·examples, Σ examples], float32 as ExampleMean

    def update(self, module, trace: Sequence[tuple[AttentionKernel, AttentionResult]], loss: Tensor, examples: int) -> None:
        for name, value in mechanism_logs(trace, loss, module.global_step, module.current_epoch).items():
            value = value.detach().float()
            part = torch.stack([value * examples, torch.full_like(value, float(examples))])
            self.sums[name] = part if name not in self.sums else self.sums[name] + part

    def compute_and_reset(self, prefix: str = "val/") -> dict[str, Tensor]:
        sums, self.sums = self.sums, {}
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            everyone: list = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, sorted(sums))
            names = sorted(set().union(*everyone))
            if not names:
                return {}
            device = (next(iter(sums.values())).device if sums else
                      torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu"))
            stacked = torch.stack([sums[n] if n in sums else torch.zeros(2, device=device) for n in names])
            dist.all_reduce(stacked)
            sums = dict(zip(names, stacked))
        return {f"{prefix}{name}": total / count for name, (total, count) in sums.items() if float(count) > 0}


def check_finite(loss: Tensor, epoch: int) -> None:
    _stop_if_diverged(not bool(torch.isfinite(loss)), loss.item, loss.device, epoch)


def check_finite_read(value: float, epoch: int, device: torch.device) -> None:
    """check_finite of a loss already read on the host (`value`, as `loss.item()` gives it) by a caller's own transfer."""
    _stop_if_diverged(not math.isfinite(value), lambda: value, device, epoch)


def _stop_if_diverged(diverged: bool, value: Callable[[], float], device: torch.device, epoch: int) -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        # Data-parallel ranks stop together: one rank raising alone would leave the others waiting in the
        # gradient all-reduce forever.
        flag = torch.tensor(float(diverged), device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        diverged = bool(flag)
    if diverged:
        raise DivergedError(f"training loss became non-finite ({value()} on this process) at epoch {epoch}; the run diverged")


class DivergenceWatch:
    """check_finite on the training losses of all steps since the last check, run every
    `log_every_n_steps` steps (Lightning's logging interval) and once per training epoch outside its steps
    (`epoch_end`, from the host's on_validation_start, before the epoch's validation, and on_train_epoch_end,
    for an epoch without one).

    Reading a loss on the host makes it wait for every queued GPU kernel; once per step that stalls the
    GPU at each step, and on a one-batch graph (Cora) the epoch's last step is every step. Non-finite losses are
    remembered on the device instead (the first one is kept), so that no step's divergence goes unseen, and a
    diverged run still fails within its epoch. Ranks check at the same steps and epochs: they run the same number
    of batches."""

    def __init__(self, read_with_validation: bool = False) -> None:
        self._unchecked: Tensor | None = None
        self.read_with_validation = read_with_validation
        """Whether the check before an epoch's validation is left to the validation's own read: the harness reads
        the pass's logged values in one transfer (harness/run/callbacks._validation_scalars), which then carries
        the pending loss too (`take`, `check_read`) and raises before any callback uses a value, in the same epoch
        with the same error. Where nothing takes it (a Trainer without those callbacks), the epoch's end checks."""

    def update(self, loss: Tensor, module, batch_idx: int) -> None:
        loss = loss.detach()
        unchecked = self._unchecked
        self._unchecked = loss if unchecked is None else torch.where(torch.isfinite(unchecked), loss, unchecked)
        if _check_due(getattr(module, "_trainer", None), batch_idx):
            self.check(module)

    def epoch_end(self, module) -> None:
        """The training epoch's one read: the losses of its steps since the last check (none left: no read)."""
        self.check(module)

    def before_validation(self, module) -> None:
        """The check before the epoch's validation pass, unless that pass's read takes it (`read_with_validation`)."""
        if not self.read_with_validation:
            self.check(module)

    def check(self, module) -> None:
        unchecked, self._unchecked = self._unchecked, None
        if unchecked is not None:
            check_finite(unchecked, module.current_epoch)

    def take(self) -> Tensor | None:
        """The losses not yet checked (the first non-finite one, else the latest), for a caller to read in its own
        transfer and hand to `check_read`; None when nothing is pending."""
        unchecked, self._unchecked = self._unchecked, None
        return unchecked

    def check_read(self, value: float, taken: Tensor, module) -> None:
        """The check of what `take` returned (`taken`), read on the host as `value`."""
        check_finite_read(value, module.current_epoch, taken.device)


def _check_due(trainer, batch_idx: int) -> bool:
    if trainer is None:  # a step called by hand: check it now
        return True
    return (batch_idx + 1) % trainer.log_every_n_steps == 0


@contextmanager
def sampling_kernels(kernels: Sequence[AttentionKernel]) -> Iterator[None]:
    """Put only the attention kernels in training mode, so stochastic variants sample their weights
    while dropout stays off: one Monte-Carlo draw of the model's predictive distribution."""
    for kernel in kernels:
        kernel.train()
    try:
        yield
    finally:
        for kernel in kernels:
            kernel.eval()


def trace_aux_loss(
    trace: Sequence[tuple[AttentionKernel, AttentionResult]], step: int, epoch: int = 0
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """weighted_aux_loss over a host's trace of (kernel, result) pairs."""
    if not trace:
        return None, {}
    kernels, results = zip(*trace)
    return weighted_aux_loss(results, kernels, step, epoch)
