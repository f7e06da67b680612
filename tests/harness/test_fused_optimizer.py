"""The graph host's Adam is the fused implementation on CUDA (issue 37: one call steps every seed of a batch), the
default elsewhere; a seed batch stepped by it saves and resumes its optimiser state like the default's."""

from __future__ import annotations

import io

import pytest
import torch

from modules.hosts import gat_seed_batch
from modules.hosts.gat_seed_batch import SeedBatchedGAT
from modules.lit import node_classification_seed_batch as loop
from modules.lit import optimization
from modules.lit.optimization import graph_adam

from .test_seed_batch import data_root, lone_built  # noqa: F401 - data_root is a fixture


def test_graph_adam_is_fused_on_cuda_only():
    p = [torch.nn.Parameter(torch.zeros(3))]
    assert graph_adam([{"params": p}], 0.01, torch.device("cuda")).defaults["fused"] is True
    assert not graph_adam([{"params": p}], 0.01, torch.device("cpu")).defaults.get("fused")


def test_the_lone_module_builds_its_adam_for_its_device(data_root, monkeypatch):
    asked = []
    real = optimization.graph_adam

    def spy(groups, lr, device):
        asked.append(torch.device(device))
        return real(groups, lr, device)

    from modules.lit import node_classification

    monkeypatch.setattr(node_classification, "graph_adam", spy)
    _, _, built = lone_built([0], data_root)
    module = built[0][1]
    optimizer = module.configure_optimizers()
    assert asked == [torch.device("cpu")] and not optimizer.defaults.get("fused")
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len([p for p in module.parameters() if p.requires_grad])


def _fit(seeds, data_root, epochs, saving=None):
    task, params, built = lone_built(seeds, data_root, max_epochs=epochs, patience=epochs + 1)
    dm = built[0][0]
    dm.setup()
    modules = [m for _, m in built]
    finished = {}
    token = loop.checkpointing.set(saving)
    try:
        loop.fit_seed_batch(modules, dm.graph, [task.stopping_rule(params) for _ in seeds], max_epochs=epochs,
                            generators=[m.model.noise.on(torch.device("cpu")) for m in modules],
                            on_finished=lambda o: finished.__setitem__(o.index, o))
    finally:
        loop.checkpointing.reset(token)
    return finished


def test_a_seed_batch_stepped_by_fused_adam_resumes_to_the_unkilled_weights(data_root, monkeypatch):
    """The GPU's batch (stacked host, fused Adam), run here on CPU: stopped after epoch 2 with its state saved as the
    harness saves it (torch.save, loaded with weights_only), resumed in fresh modules, it ends where the unkilled
    batch ends."""
    monkeypatch.setattr(gat_seed_batch, "seed_batch_host", lambda models, device: SeedBatchedGAT(models))
    monkeypatch.setattr(loop, "seed_batch_host", lambda models, device: SeedBatchedGAT(models))
    fused = []

    def fused_adam(groups, lr, device):
        fused.append(True)
        return torch.optim.Adam(groups, lr=lr, fused=True)

    monkeypatch.setattr(loop, "graph_adam", fused_adam)
    unkilled = _fit([0, 1], data_root, 4)
    assert fused

    saved = []

    class Killed(Exception):
        pass

    def save(state):
        buffer = io.BytesIO()
        torch.save(state, buffer)
        saved.append(buffer.getvalue())
        raise Killed  # the process dies right after the save

    with pytest.raises(Killed):
        _fit([0, 1], data_root, 4, loop.Checkpointing(due=lambda epochs, seconds: epochs >= 2, save=save))
    state = torch.load(io.BytesIO(saved[0]), weights_only=True)
    assert state["epoch"] == 2  # exact by construction: an integer epoch count that this process saved
    resumed = _fit([0, 1], data_root, 4, loop.Checkpointing(due=lambda epochs, seconds: False, save=save, resume=state))
    for s in (0, 1):
        a, b = resumed[s].module.state_dict(), unkilled[s].module.state_dict()
        assert a.keys() == b.keys()
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=1e-7)
        assert resumed[s].epochs == unkilled[s].epochs == 4
        assert [row["train/loss"] for row in resumed[s].history] == pytest.approx([row["train/loss"] for row in unkilled[s].history], rel=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_batch_and_the_lone_module_step_with_fused_adam(data_root):
    _, _, built = lone_built([0], data_root)
    module = built[0][1].cuda()
    assert module.configure_optimizers().defaults["fused"] is True
    p = [torch.nn.Parameter(torch.zeros(3, device="cuda"))]
    opt = graph_adam([{"params": p}], 0.01, p[0].device)
    p[0].grad = torch.ones(3, device="cuda")
    opt.step()
    assert opt.state[p[0]]["step"].device.type == "cuda"
