"""Gradient accumulation keeps the aux-to-task weight in AttnbenchTrainer, whatever transformers does with the
model's loss: accumulation 2 over two micro-batches against accumulation 1 over their union (the same examples),
one plain SGD step, compared in the parameters' update and in the logged values. BERT's classification loss
ignores num_items_in_batch (transformers then sums the micro-batches' means: twice the step, and the aux losses
must count twice too; dividing them halved their weight); a causal LM's loss honours it (the step is the same,
and the aux losses are shared out)."""

from __future__ import annotations

import pytest
import torch

from modules.hf import FAMILIES, register
from tests.modules.test_hf_trainer import quiet_arguments

SPEC = {"name": "align-gan", "weight": 5.0}


def step(family: str, accumulation: int, folder):
    """(parameters' update, first log entry) of one optimiser step over four copies of one example."""
    import transformers

    from modules.hf.trainer import AttnbenchTrainer

    register(SPEC["name"])
    config = FAMILIES[family].config()
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "attention_dropout"):
        if hasattr(config, name):
            setattr(config, name, 0.0)
    config.attnbench = dict(SPEC)
    torch.manual_seed(0)
    if family == "bert":
        model = transformers.AutoModelForSequenceClassification.from_config(config, attn_implementation=f"attnbench-{SPEC['name']}")
        example = {"input_ids": torch.randint(3, 60, (7,), generator=torch.Generator().manual_seed(1)), "labels": torch.tensor(1)}
    else:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=f"attnbench-{SPEC['name']}")
        ids = torch.randint(3, 60, (7,), generator=torch.Generator().manual_seed(1))
        example = {"input_ids": ids, "labels": ids.clone()}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    arguments = quiet_arguments(folder, max_steps=1, per_device_train_batch_size=4 // accumulation, gradient_accumulation_steps=accumulation,
                                lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0, eval_strategy="no")
    trainer = AttnbenchTrainer(model=model, args=arguments, train_dataset=[example] * 4, optimizers=(optimizer, None))
    trainer.train()
    update = {n: p.detach() - before[n] for n, p in model.named_parameters()}
    return update, trainer.state.log_history[0]


@pytest.mark.parametrize("family, task_scale", [("bert", 2.0), ("llama", 1.0)], ids=["loss-ignores-items", "loss-honours-items"])
def test_accumulation_keeps_the_aux_to_task_weight(family, task_scale, tmp_path):
    one, logged_one = step(family, 1, tmp_path / "one")
    two, logged_two = step(family, 2, tmp_path / "two")
    # the whole update scales as transformers scales the task loss, the aux share with it (atol: a float32
    # update is read as the difference of parameters near 1, whose spacing is 1.2e-7)
    assert max(float(u.abs().max()) for n, u in one.items() if "attnbench_kernel" in n) > 0  # the aux loss moved something
    for name in one:
        torch.testing.assert_close(two[name], task_scale * one[name], rtol=2e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
    assert logged_two["attn_loss"] == pytest.approx(logged_one["attn_loss"], rel=1e-5)
    assert logged_two["aux/align"] == pytest.approx(logged_one["aux/align"], rel=1e-5)
    assert logged_two["loss"] == pytest.approx(task_scale * logged_one["loss"], rel=1e-5)
