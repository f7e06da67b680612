"""The loss every LightningModule's training_step returns is the task loss plus w_k(step) * aux_k averaged over
every attention call, with the kernel's own schedule. A stub kernel (registered for these tests only) reports
a different known aux value per layer and a weight that depends on the step or epoch, so that dropping the aux
term, ignoring its weight, keeping one layer only, counting an unweighted term or passing the wrong step all
change the number."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch_geometric.data import Data

from datamodules.vocab import Vocabulary
from modules.attention import AttentionConfig, AttentionKernel, AttentionResult
from modules.attention.registry import ATTENTIONS, register_attention
from modules.hosts.captioner import Captioner
from modules.hosts.gat import GAT
from modules.hosts.mcan import MCAN
from modules.hosts.text_encoder import small_bert
from modules.lit.attention_terms import trace_aux_loss, weighted_aux_loss
from modules.lit.captioning import CaptioningModule
from modules.lit.node_classification import NodeClassificationModule
from modules.lit.sequence_classification import SequenceClassificationModule, SequenceClassifier
from modules.lit.vqa import VQAModule

STUB = "test-known-aux"
STUB_BY_EPOCH = "test-known-aux-by-epoch"
STEP, EPOCH = 3, 2
UNWEIGHTED = 7.0
"""An aux term the schedule gives no weight: it is logged, never added."""


@dataclass(frozen=True)
class KnownAuxConfig(AttentionConfig):
    weight: float = 0.25

    def loss_weights(self, step: int) -> dict[str, float]:
        # Depends on the step so that a host passing another counter gets another loss.
        return {"known": self.weight * (1 + step)}


@dataclass(frozen=True)
class KnownAuxByEpochConfig(KnownAuxConfig):
    schedule_unit: ClassVar[str] = "epoch"


_serial = itertools.count(1)


class KnownAuxAttention(AttentionKernel):
    """Softmax weights; aux {"known": this kernel's own value, "unweighted": 7}, each call remembered."""

    Config = KnownAuxConfig

    def __init__(self, config, shape):
        super().__init__(config, shape)
        self.aux_value = 0.125 * next(_serial)  # distinct per kernel: which layers were counted shows
        self.calls = 0

    def normalize(self, logits, groups, *, q, k):
        self.calls += 1
        return AttentionResult(groups.softmax(logits), {"known": torch.tensor(self.aux_value), "unweighted": torch.tensor(UNWEIGHTED)})


class KnownAuxByEpochAttention(KnownAuxAttention):
    Config = KnownAuxByEpochConfig


@pytest.fixture(scope="module", autouse=True)
def stub_kernels():
    register_attention(STUB)(KnownAuxAttention)
    register_attention(STUB_BY_EPOCH)(KnownAuxByEpochAttention)
    yield
    ATTENTIONS.unregister(STUB)
    ATTENTIONS.unregister(STUB_BY_EPOCH)


def stub_kernels_of(module) -> list[KnownAuxAttention]:
    return [m for m in module.modules() if isinstance(m, KnownAuxAttention)]


def node_classification(variant):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 20, (2, 60), generator=g)
    graph = Data(x=torch.randn(20, 8, generator=g), edge_index=edge_index, y=torch.randint(0, 3, (20,), generator=g),
                 train_mask=torch.arange(20) < 12, num_nodes=20)
    return NodeClassificationModule(GAT(8, 3, variant), 3, lr=0.005, weight_decay=0.0), graph


def sequence_classification(variant):
    torch.manual_seed(0)
    encoder = small_bert(variant, vocab_size=50, depth=2, width=16, heads=2, max_length=16, dropout=0.0)
    module = SequenceClassificationModule(SequenceClassifier(encoder, 2, dropout=0.0), num_labels=2, metric_names=["acc"],
                                          test_names=["dev"], lr=1e-3, weight_decay=0.0, warmup_ratio=0.0)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    batch = {"input_ids": torch.tensor([[2, 7, 9, 11, 3], [2, 5, 3, 0, 0]]), "attention_mask": mask,
             "token_type_ids": torch.zeros_like(mask), "labels": torch.tensor([0, 1])}
    return module, batch


def vqa(variant):
    torch.manual_seed(0)
    model = MCAN(variant, vocab_size=20, image_channels=6, grid_size=(2, 2), num_answers=7, width=16, heads=2, depth=1, dropout=0.0)
    g = torch.Generator().manual_seed(0)
    valid = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    target = torch.zeros(2, 7)
    target[:, 1], target[0, 2] = 1.0, 2 / 3
    batch = {"question": torch.randint(4, 20, (2, 5), generator=g) * valid, "question_valid": valid,
             "image": torch.randn(2, 4, 6, generator=g), "target": target}
    return VQAModule(model, num_answers=7, lr=1e-3, weight_decay=0.0, warmup_ratio=0.0), batch


def captioning(variant):
    torch.manual_seed(0)
    vocab = Vocabulary.build(["a cat sits on the mat", "two dogs run"])
    model = Captioner(len(vocab), 16, variant, pad_id=vocab.pad_id, bos_id=vocab.bos_id, eos_id=vocab.eos_id, width=16, heads=2,
                      depth=2, encoder_depth=1, dropout=0.0)
    module = CaptioningModule(model, vocab, lr=1e-3, weight_decay=0.0, warmup_ratio=0.0, label_smoothing=0.1, beam_size=1,
                              max_decode_words=5, meteor=False)
    captions = torch.tensor([[vocab.bos_id, 5, 6, 7, vocab.eos_id], [vocab.bos_id, 8, vocab.eos_id, vocab.pad_id, vocab.pad_id]])
    batch = {"features": torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(0)), "captions": captions}
    return module, batch


HOSTS = {"node classification": node_classification, "sequence classification": sequence_classification,
         "vqa": vqa, "captioning": captioning}


def training_loss(module, batch, monkeypatch) -> torch.Tensor:
    """training_step outside a Trainer, at optimiser step STEP of epoch EPOCH."""
    monkeypatch.setattr(type(module), "global_step", property(lambda self: STEP))
    monkeypatch.setattr(type(module), "current_epoch", property(lambda self: EPOCH))
    monkeypatch.setattr(module, "log", lambda *a, **k: None)
    monkeypatch.setattr(module, "log_dict", lambda *a, **k: None)
    with torch.no_grad():
        return module.training_step(batch, 0)


@pytest.mark.parametrize("variant, counter", [(STUB, STEP), (STUB_BY_EPOCH, EPOCH)])
@pytest.mark.parametrize("host", HOSTS)
def test_training_loss_is_task_loss_plus_weighted_aux_averaged_over_every_layer(host, variant, counter, monkeypatch):
    module, batch = HOSTS[host](variant)
    module.eval()  # no dropout: the two passes below see the same task loss
    kernels = stub_kernels_of(module)
    assert len(kernels) >= 2 and len({k.aux_value for k in kernels}) == len(kernels)
    for kernel in kernels:
        kernel.config = dataclasses.replace(kernel.config, weight=0.0)
    task_loss = training_loss(module, batch, monkeypatch)
    for kernel in kernels:
        kernel.config = dataclasses.replace(kernel.config, weight=0.25)
        kernel.calls = 0
    loss = training_loss(module, batch, monkeypatch)
    calls = sum(k.calls for k in kernels)
    expected_aux = sum(0.25 * (1 + counter) * k.aux_value * k.calls for k in kernels) / calls
    assert calls >= 2
    assert loss.item() == pytest.approx(task_loss.item() + expected_aux, rel=1e-6, abs=1e-6)
    assert expected_aux > 0.05  # large enough that dropping it, or any one layer's share, shows


def _shape():
    from modules.attention.kernel import HeadShape

    return HeadShape(num_heads=1, head_dim=4)
