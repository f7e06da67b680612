"""One validation pass during `fit`, on WORLD CPU processes (gloo DDP when WORLD > 1), of a tiny text host on
an odd-sized validation set and of the Cora host; writes rank 0's validation metrics and the number of
examples the ranks scored together to OUT as JSON (tests/harness/test_ddp_evaluation.py).

The learning rate is 0, so the weights stay at their seeded initial values and a single-process run and a
DDP run score the same model: their metrics differ only if some examples are counted twice.

usage: python -m tests.harness.ddp_evaluation_probe WORLD OUT CACHE_DIR"""

import json
import random
import sys

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy

from datamodules.glue import Example
from datamodules.text import TextDataModule, TextSplits
from modules.hosts.text_encoder import minilm_tokenizer, small_bert
from modules.lit.sequence_classification import SequenceClassificationModule, SequenceClassifier
from modules.tasks.base import get_task

VAL_SIZE = 45
"""Odd, and not a multiple of the eval batch: Lightning's padding DistributedSampler would repeat one example."""
TEXT_METRICS = ["acc", "f1", "mcc", "ece", "nll"]
WORDS = "the a cat dog sat ran on under mat table quickly slowly red blue big small".split()


class ScoredExamples(L.Callback):
    """How many validation examples (text rows, Cora nodes) all ranks scored together in the last epoch."""

    def on_validation_epoch_start(self, trainer, module):
        self.count = 0

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        self.count += len(batch["labels"]) if isinstance(batch, dict) else len(module._own_share(module._nodes("val", batch.val_mask)))

    def on_validation_epoch_end(self, trainer, module):
        total = torch.tensor(self.count)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(total)
        self.total = int(total)


def sentences(count: int, seed: int) -> list[Example]:
    rng = random.Random(seed)
    return [Example(" ".join(rng.choices(WORDS, k=rng.randint(3, 20))), None, rng.randint(0, 1)) for _ in range(count)]


def text_host(cache_dir: str):
    tokenizer = minilm_tokenizer()
    splits = TextSplits(sentences(32, 1), sentences(VAL_SIZE, 2), {"dev": sentences(VAL_SIZE, 2)})
    datamodule = TextDataModule(splits, tokenizer, max_length=32, batch_size=8, eval_batch_size=8, cache_dir=cache_dir)
    encoder = small_bert("softmax", vocab_size=tokenizer.vocab_size, depth=1, width=16, heads=2, max_length=32, dropout=0.0)
    module = SequenceClassificationModule(SequenceClassifier(encoder, 2, dropout=0.0), num_labels=2, metric_names=TEXT_METRICS,
                                          test_names=["dev"], lr=0.0, weight_decay=0.0, warmup_ratio=0.0)
    return datamodule, module


def cora_host(cache_dir: str):
    task = get_task("cora")
    datamodule, module = task.build(task.Params(), "softmax", data_root=None, cache_dir=cache_dir)
    module.lr = 0.0
    return datamodule, module


def validate(world: int, build, cache_dir: str) -> dict:
    L.seed_everything(0, verbose=False)
    datamodule, module = build(cache_dir)
    counter = ScoredExamples()
    trainer = L.Trainer(accelerator="cpu", devices=world, strategy=DDPStrategy(process_group_backend="gloo") if world > 1 else "auto",
                        max_epochs=1, limit_train_batches=1, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[counter])
    trainer.fit(module, datamodule=datamodule)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    return {"metrics": metrics, "scored": counter.total, "rank": trainer.global_rank}


def main(world: int, out: str, cache_dir: str) -> None:
    torch.set_num_threads(1)
    results = {"text": validate(world, text_host, cache_dir), "cora": validate(world, cora_host, cache_dir)}
    if results["text"]["rank"] == 0:
        with open(out, "w") as handle:
            json.dump(results, handle)
    # the process group torn down before the interpreter exits: left to exit, gloo's threads can be destroyed while
    # still joinable, and the process aborts ("terminate called without an active exception", seen once in CI)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
