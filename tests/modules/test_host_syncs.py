"""Host syncs in training (issue #18), counted on CPU with tests/modules/host_syncs.py: a training step of each
host reads nothing on the host for logging or divergence checks; entmax's Newton solver and align-ot's
Sinkhorn read their convergence tests every few iterations, with results bit-identical to reading every one."""

import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from modules.lit.attention_terms import DivergedError, DivergenceWatch

from .host_syncs import HostSyncs


def cora_like_graph(nodes=40, edges=200, features=12, classes=3):
    from torch_geometric.data import Data

    g = torch.Generator().manual_seed(0)
    train = torch.zeros(nodes, dtype=torch.bool)
    train[: nodes // 2] = True
    return Data(x=torch.randn(nodes, features, generator=g), edge_index=torch.randint(0, nodes, (2, edges), generator=g),
                y=torch.randint(0, classes, (nodes,), generator=g), train_mask=train, val_mask=~train, test_mask=~train)


def gat_host(variant):
    from modules.hosts.gat import GAT
    from modules.lit.node_classification import NodeClassificationModule

    return NodeClassificationModule(GAT(12, 3, variant, hidden=4, heads=2), 3, lr=1e-2, weight_decay=0.0), cora_like_graph()


def text_host(variant):
    from modules.hosts.text_encoder import small_bert
    from modules.lit.sequence_classification import SequenceClassificationModule, SequenceClassifier

    bert = small_bert(variant, vocab_size=50, depth=1, width=16, heads=2, max_length=16, dropout=0.0)
    ids = torch.randint(5, 50, (4, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(4, 10, dtype=torch.long)
    mask[0, 6:] = 0
    batch = {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids), "labels": torch.tensor([0, 1, 1, 0])}
    module = SequenceClassificationModule(SequenceClassifier(bert, 2, 0.0), num_labels=2, metric_names=["acc"], test_names=["dev"], lr=1e-3,
                                          weight_decay=0.0, warmup_ratio=0.0)
    return module, batch


def vqa_host(variant):
    from modules.hosts.mcan import MCAN
    from modules.lit.vqa import VQAModule

    from .test_vqa import tiny_batch

    mcan = MCAN(variant, vocab_size=20, image_channels=6, grid_size=(2, 2), num_answers=7, width=16, heads=2, depth=1, dropout=0.0)
    return VQAModule(mcan, num_answers=7, lr=1e-3, weight_decay=0.0, warmup_ratio=0.0), tiny_batch()


def captioning_host(variant):
    from datamodules.vocab import Vocabulary
    from modules.hosts.captioner import Captioner
    from modules.lit.captioning import CaptioningModule

    g = torch.Generator().manual_seed(2)
    captions = torch.randint(4, 12, (3, 7), generator=g)
    captions[:, 0], captions[:, -1] = 1, 2
    model = Captioner(12, 16, variant, pad_id=0, bos_id=1, eos_id=2, width=16, heads=2, depth=1, encoder_depth=1, dropout=0.0)
    module = CaptioningModule(model, Vocabulary.build([f"w{chr(97 + i)}" for i in range(8)]), lr=1e-3, weight_decay=0.0, warmup_ratio=0.0,
                              label_smoothing=0.0, beam_size=1, max_decode_words=5, meteor=False)
    return module, {"features": torch.randn(3, 5, 16, generator=g), "captions": captions}


HOSTS = {"gat": gat_host, "text": text_host, "vqa": vqa_host, "captioning": captioning_host}


def training_step_syncs(module, batch, steps=4) -> list[HostSyncs]:
    """Host syncs inside each training step of a short fit (Lightning's own per-step bookkeeping included,
    its logger writes, every log_every_n_steps, outside)."""
    counted = []
    step = module.training_step

    def counting_step(batch, batch_idx):
        with HostSyncs() as syncs:
            loss = step(batch, batch_idx)
        counted.append(syncs)
        return loss

    module.training_step = counting_step
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, log_every_n_steps=50)
    trainer.fit(module, train_dataloaders=DataLoader([batch] * steps, batch_size=1, collate_fn=lambda items: items[0]))
    return counted


@pytest.mark.parametrize("host", HOSTS)
def test_a_training_step_reads_nothing_on_the_host_for_logging(host):
    """softmax, so that every sync left would be the host's or the LightningModule's. After the first step (where
    the graph host indexes its graph once), no step reads anything, the epoch's last included: the divergence
    check reads once at the epoch's end, outside the steps (on a one-batch graph the last step is every step).
    The text host used to read once per step inside transformers' own attention-mask preparation; through
    modules/hf.py's mask entry (the AttentionMaskInterface registered with the kernel) it reads nothing either."""
    torch.manual_seed(0)
    module, batch = HOSTS[host]("softmax")
    epoch_end, epoch_reads = module._divergence.epoch_end, []

    def counted_epoch_end(m):
        with HostSyncs() as syncs:
            epoch_end(m)
        epoch_reads.append(syncs.count)

    module._divergence.epoch_end = counted_epoch_end
    counted = training_step_syncs(module, batch)[1:]
    ours = [dict((k, n) for k, n in syncs.where.items() if "modules/lit/" in k[1] or "modules/hosts/gat" in k[1]) for syncs in counted]
    assert ours == [{}, {}, {}]  # no divergence check, no logging read, no mask indexing
    assert epoch_reads == [1]  # the epoch-end divergence check
    others = {k[1].split(":")[0] for syncs in counted for k in syncs.where} - {"modules/lit/attention_terms.py"}
    assert others == set()


class FakeTrainer:
    """The attributes DivergenceWatch reads: Lightning's logging interval and whether this is the epoch's last batch."""

    def __init__(self, every: int):
        self.log_every_n_steps = every
        self.is_last_batch = False
        self.fit_loop = self.epoch_loop = self.batch_progress = self


def test_divergence_is_still_caught_between_checks_and_names_the_first_bad_loss():
    module = type("Module", (), {})()
    module.current_epoch = 2
    module._trainer = FakeTrainer(every=4)
    watch = DivergenceWatch()
    for batch_idx, loss in enumerate([1.0, float("nan"), 3.0]):  # steps 0-2: no check due
        with HostSyncs() as syncs:
            watch.update(torch.tensor(loss), module, batch_idx)
        assert syncs.count == 0
    with pytest.raises(DivergedError, match=r"\(nan on this process\) at epoch 2"):
        watch.update(torch.tensor(4.0), module, 3)  # the 4th step checks all four
    # the epoch's last batch does not check (on a one-batch graph that is every step): the epoch's end does
    module._trainer.is_last_batch = True
    watch = DivergenceWatch()
    with HostSyncs() as syncs:
        watch.update(torch.tensor(math.inf), module, 0)
    assert syncs.count == 0
    with pytest.raises(DivergedError, match=r"\(inf on this process\)"):
        watch.epoch_end(module)
    with HostSyncs() as syncs:
        watch.epoch_end(module)  # nothing left since the last check: no read
    assert syncs.count == 0
    # finite losses pass, and a step called without a trainer is checked at once
    DivergenceWatch().update(torch.tensor(1.0), module, 0)
    module._trainer = None
    with pytest.raises(DivergedError):
        DivergenceWatch().update(torch.tensor(math.nan), module, 0)
    del module._trainer  # a module never attached to a trainer at all: the same
    with pytest.raises(DivergedError):
        DivergenceWatch().update(torch.tensor(math.nan), module, 0)


def reference_sinkhorn(cost, a, b, eps, iterations, tol):
    """align-ot's Sinkhorn before issue #18: the convergence test read on the host every 10 iterations."""
    kernel = torch.exp(-cost.double() / eps)
    kernel_t = kernel.transpose(-1, -2).contiguous()
    a, b = a.double(), b.double()
    v = (b > 0).to(b.dtype)
    for step in range(iterations):
        u = a / (v.unsqueeze(-2) @ kernel_t).squeeze(-2)
        v = b / (u.unsqueeze(-2) @ kernel).squeeze(-2)
        if step % 10 == 9:
            rows = u * (v.unsqueeze(-2) @ kernel_t).squeeze(-2)
            if float((rows - a).abs().sum(-1).max()) < tol:
                break
    return (u.unsqueeze(-1) * kernel * v.unsqueeze(-2)).to(cost.dtype)


@pytest.mark.parametrize("eps, iterations, reads", [(0.01, 50, 1), (0.5, 50, 1), (0.01, 200, 6)])
def test_sinkhorn_plan_is_bit_identical_with_fewer_host_reads(eps, iterations, reads):
    """ε = 0.5 converges within the first 10 iterations (20 more run, masked), ε = 0.01 does not at 50."""
    from modules.attention.variants.alignment import COST_BOUND, sinkhorn_plan

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(6, 9, 8, generator=g), torch.randn(6, 11, 8, generator=g)
    cost = 1 - torch.nn.functional.normalize(q, dim=-1) @ torch.nn.functional.normalize(k, dim=-1).transpose(-1, -2)
    a = torch.full((6, 9), 1 / 9)
    b = torch.rand(6, 11, generator=g)
    b[:, -2:] = 0.0  # padded keys
    b = b / b.sum(-1, keepdim=True)
    with HostSyncs() as syncs:
        plan = sinkhorn_plan(cost, a, b, eps, iterations, 1e-4, cost_bound=COST_BOUND)
    assert torch.equal(plan, reference_sinkhorn(cost, a, b, eps, iterations, 1e-4))
    assert syncs.count == reads
    with HostSyncs() as unbounded:
        unbounded_plan = sinkhorn_plan(cost, a, b, eps, iterations, 1e-4)
    assert torch.equal(unbounded_plan, plan)
    assert unbounded.count == reads + 1  # without a bound, the largest cost is read to pick the domain


@pytest.mark.parametrize("alpha", [1.5, 2.0, 1.2])
def test_entmax_newton_is_bit_identical_with_fewer_host_reads(alpha, monkeypatch):
    from modules.attention import groups as groups_module
    from modules.attention.variants import entmax

    g = torch.Generator().manual_seed(0)
    nodes, edges, heads = 300, 3000, 4
    src, dst = torch.randint(0, nodes, (edges,), generator=g), torch.randint(0, nodes, (edges,), generator=g)
    keep = src != dst
    loops = torch.arange(nodes)
    groups = groups_module.SegmentGroups(dst=torch.cat([dst[keep], loops]), src=torch.cat([src[keep], loops]), num_nodes=nodes)
    logits = (3 * torch.randn(len(groups.dst), heads, generator=g, dtype=torch.float64)).requires_grad_()
    upstream = torch.randn(len(groups.dst), heads, generator=g, dtype=torch.float64)

    def solve():
        with HostSyncs() as syncs:
            weights = entmax.GroupedEntmax.apply(logits, alpha, groups, entmax.NEWTON_STEP_CAP)
        (grad,) = torch.autograd.grad((weights * upstream).sum(), logits)
        # the solver's own reads (the groups' first call also counts its group sizes once, a bincount)
        return weights, grad, sum(n for (_, where), n in syncs.where.items() if "variants/entmax.py" in where)

    every = entmax.CONVERGENCE_CHECK_EVERY
    weights, grad, reads = solve()
    monkeypatch.setattr(entmax, "CONVERGENCE_CHECK_EVERY", 1)  # a read at every step: the solver before issue #18
    every_step_weights, every_step_grad, newton_steps = solve()
    assert torch.equal(weights, every_step_weights) and torch.equal(grad, every_step_grad)
    assert newton_steps >= 5 and reads == math.ceil(newton_steps / every)


@pytest.mark.parametrize("host", ["gat", "vqa"])
@pytest.mark.parametrize("variant", ["bam-weibull", "align-gan"])
def test_without_cheap_host_reads_the_groups_read_nothing_and_give_the_same_step(host, variant, monkeypatch):
    """On an accelerator (simulated: host reads declared costly) the groups skip their "no mask needed" and
    "no underflow" shortcuts, each a device sync, and compute the same loss and gradients as with them."""
    from modules.attention import groups as groups_module

    def one_step():
        torch.manual_seed(0)
        module, batch = HOSTS[host](variant)
        module.trainer = None
        with HostSyncs() as syncs:
            loss = module.training_step(batch, 0)
        loss.backward()
        grads = [p.grad.clone() for p in module.parameters() if p.grad is not None]
        return loss.detach(), grads, {k: n for k, n in syncs.where.items() if "attention/groups.py" in k[1]}

    loss, grads, reads = one_step()
    assert reads  # the shortcuts read on this CPU
    monkeypatch.setattr(groups_module, "host_reads_are_cheap", lambda t: False)
    costly_loss, costly_grads, costly_reads = one_step()
    assert costly_reads == {}
    torch.testing.assert_close(costly_loss, loss, rtol=1e-5, atol=1e-6)
    assert len(costly_grads) == len(grads)
    for a, b in zip(costly_grads, grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_run_s_callbacks_read_the_epoch_s_values_without_a_read_per_value():
    """KeepBestAndStop and History read the epoch's values through `host_floats`, one transfer (tolist) each; a float()
    per value made a GPU wait ~10 times an epoch. Counted over whole Cora epochs: no value read from the callbacks."""
    from pathlib import Path

    from harness.plan.spec import make_spec
    from harness.run import runner

    data = Path(__file__).resolve().parents[2].parent / "shared" / "data"
    if not (data / "planetoid").exists():
        pytest.skip("needs the Planetoid data under ../shared/data")
    with HostSyncs() as syncs:
        record = runner.execute(make_spec("cora", "softmax", 0, {"max_epochs": 3, "patience": 4}), data_root=str(data))
    assert record.error is None and len(record.history["epoch"]) >= 1
    assert not [where for (what, where) in syncs.where if where.startswith("harness/run/callbacks.py")], syncs.where


def test_host_floats_are_float_s_values_bit_for_bit():
    from harness.run.callbacks import host_floats

    values = {"a": torch.tensor(0.1, dtype=torch.float32), "b": torch.tensor(1 / 3, dtype=torch.bfloat16),
              "c": torch.tensor(math.pi, dtype=torch.float64), "d": torch.tensor([2.5e-8]), "e": torch.tensor(7),
              "f": torch.tensor(True), "g": torch.tensor(float("nan")), "h": torch.tensor(-float("inf"), dtype=torch.float16)}
    read = host_floats(values)
    assert list(read) == list(values)
    for name, value in values.items():
        expected = float(value)
        assert read[name] == expected or (math.isnan(expected) and math.isnan(read[name])), name
        assert type(read[name]) is float
