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
        unwrapped = self.accelerator.unwrap_model(model)
        training = unwrapped.training and bool(kernels(unwrapped))
        # before the training forward: asking the model (_honours_items) runs forwards of its own
        divisor = self._aux_divisor(unwrapped, inputs, num_items_in_batch) if training else 1
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if training:
            step, epoch = self.state.global_step, int(self.state.epoch or 0)
            terms = attention_terms(unwrapped, step=step, epoch=epoch)
            logs = dict(terms.aux)
            logs.update(mechanism_logs(trace(unwrapped), loss, step, epoch))
            if terms.loss is not None:
                logs["attn_loss"] = terms.loss.detach()
                loss = loss + terms.loss / divisor
            self._keep(logs)
        return (loss, outputs) if return_outputs else loss

    def _aux_divisor(self, model, inputs, num_items_in_batch) -> int:
        """What turns a micro-batch's aux loss (a per-batch mean) into its share of the optimiser step's, so that the
        aux-to-task weight is the one at accumulation 1 whatever transformers does with the model's loss:
        - training_step divides the loss by the accumulation steps (transformers' `loss_is_scaled_for_ga`, decided
          there as here, is False): the aux loss is divided with it, so 1 here;
        - it does not, and the model's loss is normalised over the accumulated batch (it honours
          `num_items_in_batch`: causal LMs' loss_function, or a `compute_loss_func`): the task loss of a micro-batch
          is its share already, so the aux loss is divided by the steps;
        - it does not, and the model's loss ignores `num_items_in_batch` (BERT's sequence classification computes a
          per-batch mean anyway): each micro-batch's task loss counts in full, so the aux loss does too (1). Dividing
          it here halved the aux-to-task weight at accumulation 2.
        Whether the model honours it is asked of the model once (`_honours_items`)."""
        steps = getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        if steps == 1:
            return 1
        scaled = getattr(self, "loss_is_scaled_for_ga", None)
        if scaled is None:
            scaled = (getattr(self, "model_accepts_loss_kwargs", False) and num_items_in_batch is not None) or self.compute_loss_func is not None
        if not scaled:
            return 1
        if self.compute_loss_func is not None or getattr(self, "loss_is_scaled_for_ga", None) is not None:
            return steps  # the loss is the user's, declared normalised over the accumulated batch
        return steps if self._honours_items(model, inputs, num_items_in_batch) else 1

    def _honours_items(self, model, inputs, num_items_in_batch) -> bool:
        """Whether the model's loss is normalised by the `num_items_in_batch` it is given: two evaluation forwards
        of this batch without gradients, at num_items_in_batch N and 2N (dropout off, the random streams restored,
        before the training forward, whose trace is the one read), once per model. transformers cannot tell: it
        assumes every model that takes loss kwargs honours it, and BERT's classification heads do not."""
        known = getattr(self, "_honours_items_known", None)
        if known is None:
            self._honours_items_known = known = {}
        if id(model) not in known:
            count = num_items_in_batch if isinstance(num_items_in_batch, Tensor) else torch.tensor(float(num_items_in_batch))
            was_training = model.training
            devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
            try:
                model.eval()
                with torch.no_grad(), torch.random.fork_rng(devices=devices):
                    losses = [getattr(model(**inputs, num_items_in_batch=count * factor), "loss", None) for factor in (1, 2)]
            finally:
                model.train(was_training)
            if any(loss is None for loss in losses):  # the loss is not the model's (no labels given it): as transformers assumes
                known[id(model)] = True
            else:
                first, second = (float(loss.detach().float()) for loss in losses)
                known[id(model)] = abs(first) > 0 and abs(second) < 0.75 * abs(first)
        return known[id(model)]

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
