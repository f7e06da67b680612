"""The variant's aux losses and diagnostics from a model's last forward, weighted as its config says."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from ..attention import AttentionKernel
from ..lit.attention_terms import diagnostics, trace_aux_loss
from .install import trace

SCHEDULE_PROBES = (0, 1, 2, 3, 10, 100, 10_000)
"""Epochs at which a schedule is read to tell whether it moves: a schedule is code (BAM's is a constant on text
hosts and a sigmoid on graphs), so asking it is the way to know without naming variants."""


@dataclass
class AttentionTerms:
    loss: Tensor | None
    """Every aux term the variant returned, each averaged over the attention calls that returned it and weighted
    as its config says at this step: add it to your loss. None when no term is weighted (softmax, entmax)."""
    aux: dict[str, Tensor] = field(default_factory=dict)
    """Each aux term's unweighted mean over the calls ("aux/kl"), detached, for logging."""
    diagnostics: dict[str, Tensor] = field(default_factory=dict)
    """Per call ("attn/l0/entropy") and averaged ("attn/entropy"); kernels report them in evaluation mode."""


def schedule_counts_epochs(kernel: AttentionKernel) -> bool:
    """Whether the kernel's aux-loss weights depend on the epoch: its schedule counts epochs and is not constant."""
    if kernel.config.schedule_unit != "epoch":
        return False
    first = kernel.loss_weights(0, 0)
    return any(kernel.loss_weights(0, epoch) != first for epoch in SCHEDULE_PROBES)


def attention_terms(model: nn.Module, *, step: int | None = None, epoch: int | None = None) -> AttentionTerms:
    """The variant's aux losses, weighted, and its diagnostics, from the model's last forward. `step`: the
    optimiser step the schedules count (default: the number of training forwards before the last one);
    `epoch`: completed epochs, needed only by variants whose schedule moves with epochs (BAM on graphs)."""
    pairs = trace(model)
    if step is None:
        own = model.__dict__.get("_attnbench_recorder")
        step = max((own.forwards if own is not None else 1) - 1, 0)
    if epoch is None:
        moving = next((kernel for kernel, _ in pairs if schedule_counts_epochs(kernel)), None)
        if moving is not None:
            raise ValueError(f"{moving.name}'s aux-loss schedule at this site moves with epochs: call "
                             f"attention_terms(model, epoch=<completed epochs>)")
    loss, aux = trace_aux_loss(pairs, step, 0 if epoch is None else epoch)
    return AttentionTerms(loss, aux, diagnostics(pairs))
