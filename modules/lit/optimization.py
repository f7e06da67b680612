"""The optimiser recipe every transformer host here trains with, in one place.

AdamW without weight decay on biases and norms, linear warm-up then linear decay to zero over the whole
budget (the BERT fine-tuning recipe; MCAN warms up too), and gradient-norm clipping at 1.0, because
transformers trained from scratch diverge easily without it and the runner's Trainer sets no clipping.
"""

from __future__ import annotations

import torch


class WarmupAdamW:
    """LightningModule mixin; the module sets `lr`, `weight_decay` and `warmup_ratio`."""

    lr: float
    weight_decay: float
    warmup_ratio: float

    def configure_optimizers(self):
        decay, no_decay = [], []
        for param in self.parameters():
            (no_decay if param.dim() < 2 else decay).append(param)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=self.lr
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(self.warmup_ratio * total)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            return max(0.0, (total - step) / max(1, total - warmup))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
