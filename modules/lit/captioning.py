"""Captioning with teacher forcing; model selection on greedy CIDEr-D, test scores from beam search.

Validation decodes greedily (cheap, and what selects the epoch); test decodes with beam search
(`beam_size`, 1 = greedy). The teacher-forced loss on every reference caption is logged on both, and the
test pass over the references also gives the attention diagnostics (entropy, support) of every layer.
"""

from __future__ import annotations

import lightning as L
import torch.nn.functional as F
from torch import Tensor

from datamodules.vocab import Vocabulary

from ..hosts.captioner import Captioner
from .attention_terms import DivergenceWatch, ValidationMechanism, mechanism_logs, test_logs, trace_aux_loss
from .example_mean import ExampleMean
from .optimization import WarmupAdamW
from .caption_metrics import CaptionScores, java_available

VAL_SCORERS = ("cider", "bleu4")
TEST_SCORERS = ("cider", "bleu4", "rouge_l", "meteor")


class CaptioningModule(WarmupAdamW, L.LightningModule):
    def __init__(self, model: Captioner, vocab: Vocabulary, *, lr: float, weight_decay: float, warmup_ratio: float,
                 label_smoothing: float, beam_size: int, max_decode_words: int, length_penalty: float = 0.0,
                 meteor: bool = True):
        super().__init__()
        self._divergence = DivergenceWatch()
        self.model, self.vocab = model, vocab
        self.lr, self.weight_decay, self.warmup_ratio = lr, weight_decay, warmup_ratio
        self.label_smoothing = label_smoothing
        self.beam_size, self.length_penalty = beam_size, length_penalty
        self.max_decode_len = max_decode_words + 1  # the words and their <eos>
        self.val_scores = CaptionScores(VAL_SCORERS)
        self.val_loss = ExampleMean()
        self.val_mechanism = ValidationMechanism()
        # METEOR starts a JVM that loads 2 GB of paraphrase tables (about 10 s): only when asked for.
        self.test_scores = CaptionScores(TEST_SCORERS if meteor and java_available() else TEST_SCORERS[:-1])

    def _caption_loss(self, logits: Tensor, captions: Tensor, *, smoothing: float) -> Tensor:
        return F.cross_entropy(logits.flatten(0, 1), captions[:, 1:].flatten(), ignore_index=self.vocab.pad_id, label_smoothing=smoothing)

    def training_step(self, batch, batch_idx):
        trace = []
        captions = batch["captions"]
        logits = self.model(batch["features"], captions[:, :-1], trace)
        task_loss = self._caption_loss(logits, captions, smoothing=self.label_smoothing)
        aux, aux_logs = trace_aux_loss(trace, self.global_step, self.current_epoch)
        loss = task_loss if aux is None else task_loss + aux
        self._divergence.update(loss, self, batch_idx)
        self.log("train/loss", loss, batch_size=len(captions))
        self.log_dict({**aux_logs, **mechanism_logs(trace, task_loss, self.global_step, self.current_epoch)}, batch_size=len(captions))
        return loss

    def _reference_loss(self, batch, trace=None, *, need_weights: bool = False) -> Tensor:
        """Teacher-forced cross-entropy (no smoothing) of every reference caption of the batch's images."""
        features = batch["features"][batch["caption_owner"]]
        captions = batch["captions"]
        logits = self.model(features, captions[:, :-1], trace, need_weights=need_weights)
        return self._caption_loss(logits, captions, smoothing=0.0)

    def _decode(self, features: Tensor, beam_size: int) -> list[str]:
        if beam_size == 1:
            tokens = self.model.greedy(features, self.max_decode_len)
        else:
            tokens = self.model.beam_search(features, beam_size, self.max_decode_len, self.length_penalty)[0][:, 0]
        return [self.vocab.decode(row) for row in tokens]

    def on_validation_start(self):
        # the training epoch's divergence check, before its validation (DivergenceWatch: not in a training step;
        # nothing to read outside a fit)
        self._divergence.epoch_end(self)

    def on_train_epoch_end(self):
        self._divergence.epoch_end(self)

    def validation_step(self, batch, batch_idx):
        trace = []
        loss = self._reference_loss(batch, trace)
        self.val_loss.update(loss, len(batch["captions"]))
        self.val_mechanism.update(self, trace, loss, len(batch["captions"]))
        self.val_scores.update(batch["image_ids"], self._decode(batch["features"], 1), batch["references"])

    def on_validation_epoch_end(self):
        self.log_dict({"val/loss": self.val_loss.compute(), **self.val_mechanism.compute_and_reset(), **{f"val/{k}": v.float() for k, v in self.val_scores.compute().items()}})
        self.val_loss.reset()
        self.val_scores.reset()

    def test_step(self, batch, batch_idx):
        trace = []
        loss = self._reference_loss(batch, trace, need_weights=True)
        size = len(batch["captions"])
        self.log("test/loss", loss, batch_size=size, sync_dist=True)
        self.log_dict(test_logs(self, trace, loss), batch_size=size)
        self.test_scores.update(batch["image_ids"], self._decode(batch["features"], self.beam_size), batch["references"])

    def on_test_epoch_end(self):
        self.log_dict({f"test/{k}": v.float() for k, v in self.test_scores.compute().items()})
        self.test_scores.reset()
