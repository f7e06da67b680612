"""Learned attention-kernel scalars move in a short real training run (#14 deliverable 4): the kernels'
parameters train in their own optimiser group at `kernel_lr_scale` times the host's rate. Before that
group existed they trained at the host's rate and barely moved (the `kernel_lr_scale=1` runs below)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from modules.lit.optimization import KERNEL_LR, kernel_parameters, parameter_groups
from modules.tasks import get_task

STEPS = 20


def trainer() -> L.Trainer:
    return L.Trainer(
        max_steps=STEPS, max_epochs=STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, accelerator="cpu", devices=1,
    )


def scalars(module) -> dict[str, torch.Tensor]:
    """The learned per-head scalars of every kernel (entmax's α logit, gmm's log precision and coupling)."""
    wanted = ("alpha_logit", "log_alpha", "coupling")
    return {n: p.detach().clone() for n, p in module.named_parameters() if n.rsplit(".", 1)[-1] in wanted}


def movement(before: dict, after: dict) -> float:
    """Largest change of any learned scalar."""
    return max(float((after[n] - before[n]).abs().max()) for n in before)


def cora_movement(shared_data, cache, variant: str, kernel_lr_scale: float | None) -> float:
    task = get_task("cora")
    overrides = {} if kernel_lr_scale is None else {"kernel_lr_scale": kernel_lr_scale}
    params = task.params(overrides)
    torch.manual_seed(0)
    datamodule, module = task.build(params, variant, data_root=str(shared_data), cache_dir=str(cache))
    before = scalars(module)
    assert before, f"{variant} has no learned scalars"
    trainer().fit(module, datamodule=datamodule)
    return movement(before, scalars(module))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.mark.parametrize("variant", ["entmax", "gmm"])
def test_kernel_scalars_move_on_cora_in_20_steps(shared_data, cache, variant):
    old = cora_movement(shared_data, cache, variant, kernel_lr_scale=1.0)
    new = cora_movement(shared_data, cache, variant, kernel_lr_scale=None)  # the task's default
    print(f"cora {variant}: largest scalar change over {STEPS} steps {old:.4f} at the host lr, {new:.4f} by default")
    # measured: entmax 0.050 -> 0.100, gmm 0.082 -> 0.164 (Cora's lr 0.005 is half the kernels' 1e-2, and
    # Adam's step is proportional to the rate)
    assert new > 0.08
    assert new > 1.8 * old


def text_movement(variant: str, kernel_lr_scale: float) -> float:
    from modules.hosts.text_encoder import minilm_tokenizer, small_bert
    from modules.lit.sequence_classification import SequenceClassificationModule, SequenceClassifier

    tokenizer = minilm_tokenizer()
    batch = tokenizer(
        ["The cat sat on the mat.", "A considerably longer premise that pads the other row.", "Dogs bark.", "It rains."],
        ["A cat is sitting.", "Short hypothesis.", "Cats purr loudly at night.", "The street is wet."],
        padding=True, return_tensors="pt",
    )
    batch = {**batch, "labels": torch.tensor([0, 1, 1, 0])}
    torch.manual_seed(0)
    encoder = small_bert(variant, vocab_size=tokenizer.vocab_size, depth=2, width=64, heads=4, max_length=64, dropout=0.1)
    text_lr = get_task("glue-rte").params({"backbone": "scratch"}).lr
    module = SequenceClassificationModule(
        SequenceClassifier(encoder, 2, 0.1), num_labels=2, metric_names=["acc"], test_names=["dev"], lr=text_lr,
        weight_decay=0.01, warmup_ratio=0.1, mc_samples=1,
    )
    module.kernel_lr_scale = kernel_lr_scale
    before = scalars(module)
    loader = DataLoader([batch] * STEPS, batch_size=None)
    trainer().fit(module, train_dataloaders=loader)
    return movement(before, scalars(module))


@pytest.mark.parametrize("variant", ["entmax", "gmm"])
def test_kernel_scalars_move_in_a_text_encoder_in_20_steps(variant):
    text_lr = get_task("glue-rte").params({"backbone": "scratch"}).lr
    old = text_movement(variant, kernel_lr_scale=1.0)
    new = text_movement(variant, kernel_lr_scale=get_task("glue-rte").params({"backbone": "scratch"}).kernel_lr_scale)
    print(f"text {variant}: largest scalar change over {STEPS} steps {old:.4f} at the host lr {text_lr}, {new:.4f} by default")
    # measured: 0.005 at the host's 5e-4 (20x below), 0.10 at the kernels' 1e-2, for both variants
    assert new > 0.05
    assert new > 10 * old


def test_kernel_parameters_get_their_own_group_without_weight_decay():
    from modules.hosts.gat import GAT

    model = GAT(12, 3, "entmax", hidden=4, heads=2)
    kernel_params = kernel_parameters(model)
    assert kernel_params and all(".kernel." in n for n, p in model.named_parameters() if any(p is q for q in kernel_params))
    groups = parameter_groups(model, lr=0.005, weight_decay=5e-4, kernel_lr_scale=4.0, decay_vectors=True)
    by_name = {g["name"]: g for g in groups}
    assert set(by_name) == {"host", "attention_kernels"}
    assert by_name["attention_kernels"]["lr"] == pytest.approx(0.02) and by_name["attention_kernels"]["weight_decay"] == 0.0
    assert by_name["host"]["lr"] == 0.005 and by_name["host"]["weight_decay"] == 5e-4
    # every parameter exactly once
    grouped = [p for g in groups for p in g["params"]]
    assert len(grouped) == len(list(model.parameters())) == len({id(p) for p in grouped})
    with pytest.raises(ValueError):
        parameter_groups(model, lr=0.005, weight_decay=0.0, kernel_lr_scale=0.0, decay_vectors=True)


@pytest.mark.parametrize("task, overrides", [("cora", {}), ("glue-rte", {"backbone": "scratch"}), ("glue-rte", {"backbone": "minilm"}),
                                             ("easy-vqa", {}), ("coco-captions", {})])
def test_task_default_gives_the_kernels_the_documented_learning_rate(task, overrides):
    params = get_task(task).params(overrides)
    assert params.lr * params.kernel_lr_scale == pytest.approx(KERNEL_LR)
    explicit = get_task(task).params({**overrides, "kernel_lr_scale": 3.0})
    assert explicit.kernel_lr_scale == 3.0
