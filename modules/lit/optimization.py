"""The optimiser recipes of the hosts, in one place.

AdamW without weight decay on biases and norms, linear warm-up then linear decay to zero over the whole
budget (the BERT fine-tuning recipe; MCAN warms up too), and gradient-norm clipping at 1.0, because
transformers trained from scratch diverge easily without it and the runner's Trainer sets no clipping.

Attention kernels hold two kinds of parameters, and they train differently:
- Sub-networks (align-gan's discriminator, align-ct's critic and navigator, BAM's contextual prior MLP,
  fenchel's position-bias table) train with the host's parameters: the host's learning rate, and the host's
  weight decay by the host's rule (GAT's L2 on every weight; the BERT recipe sparing biases and norms).
  Both authors' codes do so: BAM's GAT code adds its prior MLP to the one Adam and the one L2 term over all
  trainable variables, and alignment attention's run_glue trains its discriminator and critic in the one
  AdamW of the model's named parameters (decay on all but biases and LayerNorm weights).
- Scalar knobs, which each kernel declares (`AttentionKernel.scalar_knobs`: fenchel's log α and degree
  coupling, gmm's precisions, prior coupling and key offset, entmax's learned α), form their own group at
  `kernel_lr_scale` times the host's learning rate and without weight decay. None of the authors' codes has
  such knobs to copy. A kernel scalar is an O(1) quantity in its parameterisation and Adam moves a
  parameter by about its learning rate per step, so at the text hosts' 2e-5..5e-4 it moves 20x less than at
  1e-2 (tests/modules/test_learned_scalars.py: 0.005 against 0.10 in 20 steps): on the boards, before this
  group existed, gmm matched softmax and entmax matched entmax15 to every printed digit. On Cora (host rate
  5e-3) leaderboards/studies/recipe-measurements.md shows how far they move in 300 epochs at either rate. Weight decay would
  pull each scalar towards the arbitrary origin of its parameterisation (log α = 0 is α = 1, softmax's
  temperature), a prior towards one of the compared variants.
The hosts' tasks set `kernel_lr_scale` (a task parameter, KERNEL_LR / the task's default lr unless given).
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention import AttentionKernel
from ..device_policy import takes_cuda_path

KERNEL_LR = 1e-2
"""Learning rate of the kernels' scalar knobs that the task defaults aim at: about 100 Adam steps to move a kernel scalar by O(1),
i.e. within the first epoch of the text tasks (~100 steps) and the first third of a Cora run (300 steps),
while one step changes α by about 1% (measured movements in tests/modules/test_learned_scalars.py)."""


def kernel_lr_scale_for(lr: float) -> float:
    """The multiplier that gives the scalar knobs KERNEL_LR at host learning rate `lr` (the tasks' default)."""
    return KERNEL_LR / lr


def kernel_scalar_knobs(module: nn.Module) -> list[nn.Parameter]:
    """The trainable scalar knobs that the AttentionKernels inside `module` declare, each once."""
    seen: dict[int, nn.Parameter] = {}
    for sub in module.modules():
        if isinstance(sub, AttentionKernel):
            for param in sub.scalar_knob_parameters():
                seen.setdefault(id(param), param)
    return list(seen.values())


def parameter_groups(
    module: nn.Module, *, lr: float, weight_decay: float, kernel_lr_scale: float, decay_vectors: bool
) -> list[dict]:
    """Host parameters, kernel sub-networks among them, at `lr` with `weight_decay` (on vectors and scalars
    too only if `decay_vectors`, as GAT's L2 regulariser does; the BERT recipe spares biases and norms), then
    the kernels' scalar knobs at lr * kernel_lr_scale without weight decay. Empty groups are left out."""
    if kernel_lr_scale <= 0:
        raise ValueError(f"kernel_lr_scale must be > 0, got {kernel_lr_scale}")
    knob_ids = {id(p) for p in kernel_scalar_knobs(module)}
    undecayed_ids = {id(p) for sub in module.modules() if isinstance(sub, AttentionKernel) for p in sub.undecayed_parameters()}
    decay, no_decay, knobs = [], [], []
    seen: set[int] = set()
    for param in module.parameters():
        if not param.requires_grad or id(param) in seen:
            continue
        seen.add(id(param))
        if id(param) in knob_ids:
            knobs.append(param)
        elif (decay_vectors or param.dim() >= 2) and id(param) not in undecayed_ids:
            decay.append(param)
        else:
            no_decay.append(param)
    groups = [
        {"params": decay, "lr": lr, "weight_decay": weight_decay, "name": "host"},
        {"params": no_decay, "lr": lr, "weight_decay": 0.0, "name": "host_no_decay"},
        {"params": knobs, "lr": lr * kernel_lr_scale, "weight_decay": 0.0, "name": "kernel_scalar_knobs"},
    ]
    return [group for group in groups if group["params"]]


def graph_adam(groups: list[dict], lr: float, device: torch.device) -> torch.optim.Adam:
    """GAT's Adam. On CUDA the fused implementation: one kernel steps every parameter of a group, the seed batch's
    stacked host tensors and its S kernels' parameters alike, where the default (foreach) launches about ten
    kernels per group and a Cora step on a GPU is made of launches. Elsewhere the default, whose CPU
    updates the seed batch's bit-identity with lone runs rests on (both sides build their Adam here). Which one is
    the device policy's call (`takes_cuda_path`): a CPU run "as on CUDA" (the GPU cost page) gets the fused one too,
    a plain CPU run the default."""
    return torch.optim.Adam(groups, lr=lr, **({"fused": True} if takes_cuda_path(device) else {}))


class WarmupAdamW:
    """LightningModule mixin; the module sets `lr`, `weight_decay` and `warmup_ratio`, and its task sets
    `kernel_lr_scale` (1.0 here: the scalar knobs train at the host's rate unless a task says otherwise)."""

    lr: float
    weight_decay: float
    warmup_ratio: float
    kernel_lr_scale: float = 1.0

    def configure_optimizers(self):
        groups = parameter_groups(
            self, lr=self.lr, weight_decay=self.weight_decay, kernel_lr_scale=self.kernel_lr_scale, decay_vectors=False
        )
        optimizer = torch.optim.AdamW(groups, lr=self.lr)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(self.warmup_ratio * total)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            return max(0.0, (total - step) / max(1, total - warmup))

        # One LambdaLR multiplies every group's own initial rate, so the scalar knobs keep their ratio throughout.
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
