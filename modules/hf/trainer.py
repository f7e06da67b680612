"""transformers' `Trainer` for a model that holds an attnbench variant: the variant's losses join the model's loss.

    from modules.hf import register
    from modules.hf.trainer import AttnbenchTrainer
    register()
    model = AutoModelForSequenceClassification.from_pretrained(path, attn_implementation="attnbench-align-ct")
    AttnbenchTrainer(model=model, args=TrainingArguments(...), train_dataset=...).train()

What a fine-tuning script (the alignment paper's run_glue, for one) would otherwise write by hand: in training, the
variant's weighted aux losses (`attention_terms` at the Trainer's optimiser step and completed epochs, so BAM's
epoch schedule and align-*'s step schedules run in their units) are added to the loss `compute_loss` returns, and
the variant's terms and mechanism diagnostics are logged where and when `Trainer` logs its loss.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor
from transformers import Trainer

from ..lit.attention_terms import ValidationMechanism, mechanism_logs
from .install import kernels, trace
from .terms import attention_terms


class AttnbenchTrainer(Trainer):
    """`Trainer` plus the variant of the model (put in by either door). In training `compute_loss` returns the
    model's loss plus the weighted aux losses of the forward; each logging step adds, averaged over the steps
    since the last one, `attn_loss` (the weighted aux losses), `aux/<term>` (each term unweighted) and the
    mechanism diagnostics `diag/<name>` (AttentionKernel.mechanism: the quantities that show the variant's idea at
    work, e.g. align's qk_distance, fenchel's prior_tv). Evaluation adds `eval_diag/<name>`, weighted by
    examples and summed over processes. A model without attnbench kernels trains exactly as under `Trainer`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._attention_sums: dict[str, Tensor] = {}
        self._attention_steps = 0
        self._validation = ValidationMechanism()

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        unwrapped = self.accelerator.unwrap_model(model)
        if unwrapped.training and kernels(unwrapped):
            step, epoch = self.state.global_step, int(self.state.epoch or 0)
            terms = attention_terms(unwrapped, step=step, epoch=epoch)
            logs = dict(terms.aux)
            logs.update(mechanism_logs(trace(unwrapped), loss, step, epoch))
            if terms.loss is not None:
                logs["attn_loss"] = terms.loss.detach()
                loss = loss + terms.loss / self._aux_divisor(num_items_in_batch)
            self._keep(logs)
        return (loss, outputs) if return_outputs else loss

    def _aux_divisor(self, num_items_in_batch) -> int:
        """What turns a micro-batch's aux loss into its share of the optimiser step's: training_step divides a loss
        by the gradient-accumulation steps unless the model's loss is normalised over the accumulated batch
        already (transformers' `loss_is_scaled_for_ga`, decided there as here); the aux losses are per-batch means."""
        scaled = getattr(self, "loss_is_scaled_for_ga", None)
        if scaled is None:
            scaled = (getattr(self, "model_accepts_loss_kwargs", False) and num_items_in_batch is not None) or self.compute_loss_func is not None
        return getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps) if scaled else 1

    def _keep(self, logs: dict[str, Tensor]) -> None:
        # summed on the device and read at the logging step only: no host read per step
        for name, value in logs.items():
            value = value.detach().float()
            self._attention_sums[name] = value if name not in self._attention_sums else self._attention_sums[name] + value
        self._attention_steps += 1

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs and self._attention_steps:
            steps, sums = self._attention_steps, self._attention_sums
            names = sorted(sums)
            values = torch.stack([sums[n] for n in names]).div(steps).tolist()
            logs = {**logs, **{name: round(value, 6) for name, value in zip(names, values)}}
            self._attention_sums, self._attention_steps = {}, 0
        super().log(logs, *args, **kwargs)

    def prediction_step(self, model, inputs, prediction_loss_only: bool, ignore_keys=None):
        loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        unwrapped = self.accelerator.unwrap_model(model)
        pairs = trace(unwrapped)
        if pairs:
            examples = next((v.shape[0] for v in inputs.values() if isinstance(v, Tensor) and v.dim() > 0), 1)
            task_loss = loss if loss is not None else torch.zeros(())
            where = SimpleNamespace(global_step=self.state.global_step, current_epoch=int(self.state.epoch or 0))
            self._validation.update(where, pairs, task_loss, examples)
        return loss, logits, labels

    def evaluation_loop(self, *args: Any, **kwargs: Any):
        self._validation = ValidationMechanism()  # nothing left over from an interrupted evaluation
        output = super().evaluation_loop(*args, **kwargs)
        prefix = kwargs.get("metric_key_prefix", args[4] if len(args) > 4 else "eval")
        for name, value in self._validation.compute_and_reset().items():
            output.metrics[f"{prefix}_{name.removeprefix('val/')}"] = float(value)
        return output
