"""Seed batching (issue 27): S seeds of one configuration trained as one model, each seed still its own experiment.

On Cora with a few epochs: initial parameters are the lone runs', masks depend on the seed alone, a stopped
seed is frozen, a diverged seed fails alone, first-epoch losses match lone runs, records and keys are a lone
run's with `execution.seed_batch` set."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from harness.plan.planner import seed_batches
from harness.plan.spec import make_spec
from harness.results.record import Status
from harness.run.runner import _prepare, execute
from harness.run.seed_batch import execute_batch
from modules.attention import list_attentions
from modules.hosts import gat, gat_seed_batch
from modules.hosts.gat_seed_batch import LockstepGATs, SeedBatchedGAT, seed_batch_host
from modules.lit.node_classification_seed_batch import fit_seed_batch
from modules.tasks import get_task
from modules.tasks.stopping import Decision

pytestmark = pytest.mark.usefixtures("data_root")


@pytest.fixture
def data_root():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2].parent / "shared" / "data"
    if not (root / "planetoid").exists():
        pytest.skip("needs the Planetoid data under ../shared/data")
    return str(root)


def lone_built(seeds, data_root, variant="softmax", **params):
    """Each seed's (datamodule, module) exactly as its lone run builds them."""
    task = get_task("cora")
    p = task.params(params)
    built = []
    for seed in seeds:
        L.seed_everything(seed, verbose=False)
        built.append(task.build(p, variant, data_root=data_root, cache_dir=None))
    return task, p, built


def test_initial_parameters_are_the_lone_runs_bit_for_bit(data_root):
    _, _, built = lone_built([0, 1, 2], data_root)
    batched = SeedBatchedGAT([m.model for _, m in built])
    _, _, again = lone_built([1], data_root)
    lone = again[0][1].model
    for i, layer in enumerate(lone.layers):
        for name, stacked in batched.layer_parameters(i).items():
            assert torch.equal(stacked[1], getattr(layer, name))
    assert not torch.equal(batched.host[0][0], batched.host[0][1])


REAL_DROPOUT_MASK = gat.dropout_mask
"""Before any test patches it."""
REAL_KEPT_ENTRIES_INTO = gat_seed_batch.kept_entries_into


def drawn_masks(seeds, data_root, monkeypatch, variant="softmax", host=SeedBatchedGAT):
    """Every mask and kernel draw of one training forward, per seed (by its generator)."""
    _, _, built = lone_built(seeds, data_root, variant)
    dm = built[0][0]
    dm.setup()
    generators = [m.model.noise.on(torch.device("cpu")) for _, m in built]
    drawn = {id(g): [] for g in generators}
    real_mask = REAL_DROPOUT_MASK

    def recording(like, p, generator):
        mask = real_mask(like, p, generator)
        drawn[id(generator)].append(mask.clone())
        return mask

    def recording_kept(out, p, generator):
        kept = REAL_KEPT_ENTRIES_INTO(out, p, generator)
        drawn[id(generator)].append(kept.clone().div_(1 - p))  # as its mask: the batch scales all seeds' at once
        return kept

    monkeypatch.setattr(gat_seed_batch, "kept_entries_into", recording_kept)  # the stacked host's masks, every seed's at once
    monkeypatch.setattr(gat, "dropout_mask", recording)  # the lone models' own `dropout` (LockstepGATs)
    batched = host([m.model for _, m in built]).train()
    from modules.hosts.gat import graph_groups

    traces = [[] for _ in seeds]
    batched(dm.graph.x, graph_groups(dm.graph.edge_index, dm.graph.num_nodes), traces, generators)
    weights = [[result.weights for _, result in trace] for trace in traces]
    return {seed: (drawn[id(g)], w) for seed, g, w in zip(seeds, generators, weights)}


@pytest.mark.parametrize("host", [LockstepGATs, SeedBatchedGAT])
def test_a_seeds_masks_and_noise_do_not_depend_on_the_other_seeds_of_its_batch(data_root, monkeypatch, host):
    alone = drawn_masks([3], data_root, monkeypatch, "bam-weibull", host)[3]
    among = drawn_masks(list(range(8)), data_root, monkeypatch, "bam-weibull", host)
    masks, weights = among[3]
    assert len(masks) == len(alone[0]) == 4  # input, attention (layer 1), hidden, attention (layer 2)
    for a, b in zip(alone[0], masks):
        assert torch.equal(a, b)
    for a, b in zip(alone[1], weights):  # BAM's sampled weights: the kernel's draws come from the seed's generator too
        assert torch.equal(a, b)
    assert not torch.equal(among[2][0][0], masks[0])


class StopAt:
    """A rule that keeps every epoch's weights and stops after `epochs` epochs."""

    patience = 0

    def __init__(self, epochs):
        self.epochs, self.seen = epochs, 0

    def update(self, metrics):
        self.seen += 1
        return Decision(save=True, stop=self.seen >= self.epochs)


def fit(seeds, data_root, stops, max_epochs=4, poison=()):
    task, params, built = lone_built(seeds, data_root)
    for i in poison:
        with torch.no_grad():
            built[i][1].model.layers[0].bias.fill_(float("nan"))
    dm = built[0][0]
    dm.setup()
    modules = [m for _, m in built]
    finished, frozen_at_finish = {}, {}

    def on_finished(outcome):
        seed = seeds[outcome.index]
        finished[seed] = outcome
        frozen_at_finish[seed] = {k: v.clone() for k, v in outcome.module.state_dict().items()}

    fit_seed_batch(modules, dm.graph, [StopAt(s) for s in stops], max_epochs=max_epochs,
                   generators=[m.model.noise.on(torch.device("cpu")) for m in modules], on_finished=on_finished)
    return finished, frozen_at_finish


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_a_stopped_seed_is_frozen_and_the_others_train_on_as_without_it(data_root):
    finished, at_finish = fit([0, 1], data_root, stops=[2, 4])
    assert finished[0].epochs == 2 and finished[1].epochs == 4
    # nothing changed seed 0's weights after it stopped, while seed 1 trained two more epochs
    assert_same_weights(at_finish[0], finished[0].module.state_dict())
    alone0, _ = fit([0], data_root, stops=[2])
    alone1, _ = fit([1], data_root, stops=[4])
    assert_same_weights(finished[0].module.state_dict(), alone0[0].module.state_dict())
    # seed 1's Adam moments after seed 0 left the batch are its own: same weights as training alone
    assert_same_weights(finished[1].module.state_dict(), alone1[1].module.state_dict())


def test_a_seed_whose_loss_turns_nan_fails_alone(data_root):
    finished, _ = fit([0, 1, 2], data_root, stops=[3, 3, 3], poison=[1])
    assert finished[1].error.startswith("DivergedError") and finished[1].epochs == 1
    assert finished[0].error is None and finished[2].error is None and finished[0].epochs == 3
    alone, _ = fit([0, 2], data_root, stops=[3, 3])
    for seed in (0, 2):
        assert_same_weights(finished[seed].module.state_dict(), alone[seed].module.state_dict())


@pytest.mark.parametrize("variant", ["softmax", "bam-weibull"])
def test_first_epoch_losses_equal_the_lone_runs(data_root, variant):
    seeds = [0, 1, 2]
    task, params, built = lone_built(seeds, data_root, variant, max_epochs=1)
    dm = built[0][0]
    dm.setup()
    modules = [m for _, m in built]
    losses = {}
    fit_seed_batch(modules, dm.graph, [task.stopping_rule(params) for _ in seeds], max_epochs=1,
                   generators=[m.model.noise.on(torch.device("cpu")) for m in modules],
                   on_finished=lambda o: losses.__setitem__(seeds[o.index], o.history[0]["train/loss"]))
    for seed in seeds:
        spec = make_spec("cora", variant, seed, {"max_epochs": 1})
        trainer, datamodule, module, _ = _prepare(spec, data_root, None, [])
        trainer.fit(module, datamodule=datamodule)
        lone = float(trainer.callback_metrics["train/loss"])
        assert losses[seed] == pytest.approx(lone, rel=1e-5)


def training_step_gradients(model, graph, groups, traces, generators=None):
    """One training forward and backward of a lone GAT (traces: one list) or a seed batch (one list per seed)."""
    from modules.lit.attention_terms import trace_aux_loss

    train = graph.train_mask.nonzero().squeeze(1)
    model.train()
    logits = model(graph.x, groups, traces, generators) if generators is not None else model(graph.x, groups, traces[0]).unsqueeze(0)
    losses = []
    for seed_logits, trace in zip(logits, traces):
        aux, _ = trace_aux_loss(trace, 0, 0)
        loss = torch.nn.functional.cross_entropy(seed_logits[train], graph.y[train])
        losses.append(loss if aux is None else loss + aux)
    torch.stack(losses).sum().backward()
    return losses


@pytest.mark.parametrize("variant", list_attentions())
def test_every_seeds_gradients_are_its_lone_runs_bit_for_bit(data_root, variant):
    """The CPU host (LockstepGATs) runs each seed's lone code on the seed's own tensors: equal by construction on any
    CPU, so any difference is a defect (another seed's masks, a shared noise stream, a sum over seeds)."""
    assert_gradients_are_the_lone_runs(data_root, variant, seed_batch_host, exact=True)


@pytest.mark.parametrize("variant", ["softmax", "bam-weibull", "align-ct"])
def test_the_gpus_stacked_host_gives_each_seed_its_lone_gradients_to_float_tolerance(data_root, variant):
    """The GPU host (SeedBatchedGAT), run here on CPU: its `bmm` and block-diagonal products sum in another order
    than a lone run's `mm` on some CPUs (an Intel Xeon: the second layer's weight gradient 2e-10 off), so it is held
    to float32 tolerance, far below what a wrong mask or another seed's generator moves (tested below)."""
    assert_gradients_are_the_lone_runs(data_root, variant, lambda models, device: SeedBatchedGAT(models), exact=False)


@pytest.mark.parametrize("host", [seed_batch_host, lambda models, device: SeedBatchedGAT(models)], ids=["cpu-host", "gpu-host"])
def test_a_seed_drawing_another_seeds_masks_fails_the_gradient_check(data_root, host):
    """The planted defect the two gradient tests exist to catch: seed 1 draws its dropout masks from seed 0's stream."""

    def share_seed_0s_noise(modules):
        modules[1].model.noise = modules[0].model.noise

    with pytest.raises(AssertionError):
        assert_gradients_are_the_lone_runs(data_root, "softmax", host, exact=False, plant=share_seed_0s_noise)


def seed_gradient(parameter, position):
    """Seed `position`'s gradient of a host parameter: a row of a stacked one, or the seed's own tensor's."""
    return parameter[position].grad if isinstance(parameter, list) else parameter.grad[position]


def assert_gradients_are_the_lone_runs(data_root, variant, host, *, exact, plant=lambda modules: None):
    """Each seed's loss and gradients after one training step of a 2-seed batch equal its lone run's: exactly
    (`exact`) or to float32 tolerance. The cause of batched and lone runs parting ways: a gradient one rounding off
    grows over epochs (bam-weibull's batched seeds once left their lone runs at epochs 23-92 from 1e-12 in the
    output layer's att_src/att_dst gradients), so the CPU host is held to equality."""
    from modules.hosts.gat import graph_groups

    seeds = [0, 1]
    _, _, built = lone_built(seeds, data_root, variant)
    graph = built[0][0]
    graph.setup()
    graph = graph.graph
    groups = graph_groups(graph.edge_index, graph.num_nodes)
    modules = [m for _, m in built]
    plant(modules)
    batched = host([m.model for m in modules], torch.device("cpu"))
    traces = [[] for _ in seeds]
    generators = [m.model.noise.on(torch.device("cpu")) for m in modules]
    batch_losses = training_step_gradients(batched, graph, groups, traces, generators)

    def same(a, b, what):
        if exact:
            assert torch.equal(a, b), what
        else:
            scale = b.abs().max().item()
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * scale, msg=lambda m: f"{what}: {m}")

    for position, seed in enumerate(seeds):
        _, _, again = lone_built([seed], data_root, variant)
        lone = again[0][1].model
        (lone_loss,) = training_step_gradients(lone, graph, groups, [[]])
        same(batch_losses[position], lone_loss, (seed, "loss"))
        for i, layer in enumerate(lone.layers):
            for name, parameter in batched.layer_parameters(i).items():
                same(seed_gradient(parameter, position), getattr(layer, name).grad, (seed, i, name))
            for (name, batch_param), lone_param in zip(batched.kernels[i][position].named_parameters(), layer.kernel.parameters()):
                assert (batch_param.grad is None) == (lone_param.grad is None), (seed, i, name)
                if batch_param.grad is not None:
                    same(batch_param.grad, lone_param.grad, (seed, i, name))


def test_the_validation_values_gats_rule_compares_are_the_lone_runs_exactly(data_root, monkeypatch):
    """GAT's rule counts ties as reaching the best, so a val/loss one rounding away from the lone run's keeps another
    epoch: the batch reports it as the lone run does (per seed, through MeanMetric), equal bit for bit while the
    parameters are (a mean over [S, n] at once differed from epoch 1 on)."""
    from harness.run import callbacks, seed_batch

    monkeypatch.setattr(callbacks.History, "compact", lambda self: list(self.epochs))
    monkeypatch.setattr(seed_batch, "_compact", lambda rows: list(rows))
    specs = [make_spec("cora", "softmax", seed, {"max_epochs": 5}) for seed in (0, 1)]
    batched = execute_batch(specs, data_root=data_root, on_record=lambda r: None)
    for spec, record in zip(specs, batched):
        lone = execute(spec, data_root=data_root)
        for name in ("val/loss", "val/acc", "train/loss"):
            assert [row[name] for row in record.history] == [row[name] for row in lone.history], name


def test_records_and_keys_are_the_lone_runs_with_the_batch_in_execution(data_root):
    specs = [make_spec("cora", "softmax", seed, {"max_epochs": 3}) for seed in (0, 1)]
    written = []
    records = execute_batch(specs, data_root=data_root, on_record=written.append)
    assert [r.key for r in records] == [s.key for s in specs] and sorted(r.key for r in written) == sorted(s.key for s in specs)
    for spec, record in zip(specs, records):
        lone = execute(spec, data_root=data_root)
        assert record.status is Status.OK and record.spec == spec.to_dict() == lone.spec
        assert record.execution["seed_batch"] == 2 and lone.execution is None
        assert record.metrics.keys() == lone.metrics.keys() and record.epochs == lone.epochs == 3
        assert record.best_epoch == lone.best_epoch
        # each seed's training is its lone run's bit for bit (its gradients are: the test above)
        assert record.metrics == lone.metrics


@pytest.mark.parametrize("variant", list_attentions())
def test_every_variant_trains_seed_batched(data_root, variant):
    specs = [make_spec("cora", variant, seed, {"max_epochs": 1}) for seed in (0, 1)]
    records = execute_batch(specs, data_root=data_root, on_record=lambda r: None)
    assert [r.status for r in records] == [Status.OK, Status.OK], [r.error for r in records]


def test_seed_batches_group_seeds_of_one_configuration_and_split_them_over_workers():
    specs = [make_spec("cora", v, seed, {"max_epochs": 1}) for v in ("softmax", "sparsemax") for seed in range(6)]
    items = seed_batches(specs, workers=1)
    assert [[s.seed for s in item] for item in items] == [list(range(6))] * 2
    assert {s.variant for s in items[0]} == {"softmax"}
    items = seed_batches(specs, workers=4)
    assert sorted(len(item) for item in items) == [3, 3, 3, 3] and sum(len(i) for i in items) == 12
    assert [len(item) for item in seed_batches(specs, workers=4, enabled=False)] == [1] * 12
    text = [make_spec("glue-sst2", "softmax", seed) for seed in (0, 1)]  # its host has no seed axis: one run per seed
    assert seed_batches(text, workers=1) == [[text[0]], [text[1]]]


def test_the_boards_provenance_line_says_which_records_trained_in_seed_batches():
    from harness.report.board import seed_batched
    from harness.results.record import Record

    specs = [make_spec("cora", "softmax", seed, {"max_epochs": 1}) for seed in range(4)]
    metrics = {"test/acc": {"value": 0.5, "higher_is_better": True}}
    lone = [Record.ok(s, metrics) for s in specs[:2]]
    batched = [Record.ok(s, metrics, execution={"seed_batch": 2, "seeds": [2, 3]}) for s in specs[2:]]
    assert seed_batched(lone) == ""  # boards of lone runs read as before
    assert seed_batched(lone + batched) == "2 trained in seed batches of 2 seeds"


def test_the_study_takes_its_lone_side_from_another_store_without_training_it_again(data_root, tmp_path, capsys, monkeypatch):
    """The committed study reads the lone side from leaderboards/ (paper-gat's records); here from a first run's store."""
    import harness.run.runner
    from harness.studies import seed_batch_study

    argv = ["--seeds", "2", "--max-epochs", "2", "--variants", "softmax", "--data-root", str(data_root)]
    assert seed_batch_study.main([*argv, "--out", str(tmp_path / "first")]) == 0
    table = capsys.readouterr().out

    def no_lone_training(*args, **kwargs):
        raise AssertionError("the lone side should have come from --lone-from")

    monkeypatch.setattr(harness.run.runner, "execute", no_lone_training)
    assert seed_batch_study.main([*argv, "--lone-from", str(tmp_path / "first" / "lone"), "--out", str(tmp_path / "second")]) == 0
    assert capsys.readouterr().out == table  # the batched side trained again, to the same records
    assert not (tmp_path / "second" / "lone" / "records").exists() or not any((tmp_path / "second" / "lone" / "records").iterdir())



def test_a_seed_batchs_host_syncs_do_not_grow_with_its_seeds(data_root):
    """An epoch of the batch reads the host a fixed number of times whatever its seed count: the seeds' validation
    losses are reduced together on the device (a torchmetrics MeanMetric per seed read its NaN check on the host
    twice: 2 + 2S reads an epoch). Counted as on CUDA (the stacked host and fused Adam a GPU runs; the CPU's own Adam
    reads each parameter's step count). A `tolist` is one transfer, however many values it carries."""
    from modules.device_policy import behave_as_cuda
    from tests.modules.host_syncs import HostSyncs

    class Transfers(HostSyncs):
        """HostSyncs with the element reads of one `tolist` (consecutive, from one line) counted once."""

        def __init__(self):
            super().__init__()
            self.previous = None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default and self.previous is func:
                return func(*args, **(kwargs or {}))
            self.previous = func
            return super().__torch_dispatch__(func, types, args, kwargs)

    def transfers(seeds):
        task, params, built = lone_built(seeds, data_root)
        dm = built[0][0]
        dm.setup()
        modules = [m for _, m in built]
        with behave_as_cuda(), Transfers() as counted:
            fit_seed_batch(modules, dm.graph, [StopAt(2) for _ in seeds], max_epochs=2,
                           generators=[m.model.noise.on(torch.device("cpu")) for m in modules], on_finished=lambda o: None)
        return counted.where

    one, three = transfers([0]), transfers([0, 1, 2])
    assert one == three, (one, three)


def test_the_cuda_paths_batch_loop_follows_the_cpu_paths_to_float_tolerance(data_root):
    """The loop as on CUDA (the stacked host, its seeds' logits, losses and kept weights taken for all seeds at once,
    fused Adam) against the CPU's (each seed its lone run's code): the same epochs, stops and kept epochs, every
    logged value to float32 tolerance, and each seed's kept weights (gathered with the other seeds saved at the
    same epoch) loaded into its own module."""
    from modules.device_policy import behave_as_cuda

    def run(as_cuda):
        task, params, built = lone_built([0, 1, 2], data_root)
        dm = built[0][0]
        dm.setup()
        modules = [m for _, m in built]
        finished = {}
        rules = [task.stopping_rule(params) for _ in modules]
        rules[1] = StopAt(2)
        call = lambda: fit_seed_batch(modules, dm.graph, rules, max_epochs=4,  # noqa: E731
                                      generators=[m.model.noise.on(torch.device("cpu")) for m in modules],
                                      on_finished=lambda o: finished.__setitem__(o.index, o))
        if as_cuda:
            with behave_as_cuda():
                call()
        else:
            call()
        return finished

    cpu, cuda = run(False), run(True)
    assert sorted(cpu) == sorted(cuda) == [0, 1, 2]
    for s in cpu:
        a, b = cpu[s], cuda[s]
        assert (a.error, a.epochs, a.best_epoch) == (b.error, b.epochs, b.best_epoch)
        assert [sorted(row) for row in a.history] == [sorted(row) for row in b.history]
        for ra, rb in zip(a.history, b.history):
            for name in ra:
                if name != "epoch_s":
                    assert ra[name] == pytest.approx(rb[name], rel=1e-4, abs=1e-5), (s, name)
        assert_same_weights(a.module.state_dict(), b.module.state_dict())


def test_a_diverged_seed_fails_alone_on_the_cuda_path_too(data_root):
    """As on CUDA, where the batch reads which seeds diverged with the epoch's values, after the backward pass that
    weighs a diverged seed's loss 0 (no read before it): the seed fails at its epoch, the others train as without it."""
    from modules.device_policy import behave_as_cuda

    with behave_as_cuda():
        finished, _ = fit([0, 1, 2], data_root, stops=[3, 3, 3], poison=[1])
        alone, _ = fit([0, 2], data_root, stops=[3, 3])
    assert finished[1].error == "DivergedError: training loss became non-finite (nan) at epoch 0; the run diverged"
    assert finished[1].epochs == 1 and finished[0].epochs == finished[2].epochs == 3
    for seed in (0, 2):
        assert finished[seed].error is None
        assert_same_weights(finished[seed].module.state_dict(), alone[seed].module.state_dict())
