"""The training loop of S seeds of one node-classification configuration, trained as one seed-batched GAT.

A plain loop, not a Lightning Trainer: each seed stops on its own rule and leaves the batch when it stops
(its record is written then), which changes the set of parameters being optimised mid-fit; Lightning's
fit loop has one stop flag and one fixed optimiser. Each seed's lone LightningModule is kept and its best
weights are loaded into it, so its test runs through the lone run's own `test_step` (harness/run/seed_batch.py).

Equal to the lone loop step for step: one full-graph step per epoch, then validation, then the seed's
stopping rule (modules/tasks/stopping.py) decides whether this epoch's weights are its best and whether
it stops. The loss is the sum of the seeds' own losses, so each seed's gradient is its lone gradient, and
Adam (elementwise, L2 included) over the seeds' parameters is S Adams: on CPU over each seed's own tensors, as
its lone run's (bit for bit), on a GPU over the stacked ones (modules/hosts/gat_seed_batch.py says why).
"""

from __future__ import annotations

import contextvars
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..device_policy import takes_cuda_path
from ..hosts.gat import graph_groups
from ..hosts.gat_seed_batch import seed_batch_host
from .attention_terms import diagnosed_validation, measured_if, mechanism_logs, trace_aux_loss
from .node_classification import NodeClassificationModule
from .optimization import graph_adam, parameter_groups


@dataclass
class SeedOutcome:
    """How one seed's training ended; `module` holds its best weights when `error` is None."""

    index: int
    module: NodeClassificationModule
    epochs: int
    best_epoch: int | None
    best_metrics: dict[str, float]
    history: list[dict[str, float]]
    error: str | None = None
    fit_time_s: float = 0.0
    """The seed's share of the batch's fitting time: each epoch's time divided by the seeds it trained."""
    batch_epoch_s: list[float] = field(default_factory=list)


@dataclass
class Checkpointing:
    """How a seed batch saves and resumes its state (the harness sets it: harness/run/seed_batch.py, which names the
    seeds by their run keys and writes the files). Passed by a context variable because the task's
    `train_seed_batch` (modules/tasks/planetoid.py) calls `fit_seed_batch` without it.

    `resume`: {"epoch": epochs done, "rng": the global generators, "seeds": {index in `modules`: that seed's state}}
    with a state for every seed being trained; `due(epochs_since, seconds_since)`: whether to save after an epoch;
    `save(state)`: write a state of the same form (indexes of the seeds still training)."""

    due: Callable[[int, float], bool]
    save: Callable[[dict], None]
    resume: Mapping[str, Any] | None = None


checkpointing: contextvars.ContextVar[Checkpointing | None] = contextvars.ContextVar("seed_batch_checkpointing", default=None)


def _seed_parameters(host: nn.Module, position: int) -> list[tuple[nn.Parameter, int | None]]:
    """Seed `position`'s parameters in the batch host, each with its row in a stacked parameter (None: the whole
    parameter is the seed's), in a fixed order: the host's own, then its kernels'."""
    kernels = [q for layer in host.kernels for q in layer[position].parameters()]
    if hasattr(host, "host"):  # SeedBatchedGAT: stacked host parameters
        return [(p, position) for p in host.host] + [(q, None) for q in kernels]
    model = host.models[position]  # LockstepGATs: the seed's own GAT
    own = [getattr(layer, name) for layer in model.layers for name in ("weight", "att_src", "att_dst", "bias")]
    return [(p, None) for p in own] + [(q, None) for q in kernels]


def _seed_state(host: nn.Module, optimizer: torch.optim.Optimizer, position: int, rule, outcome: "SeedOutcome",
                best, generator: torch.Generator) -> dict:
    """One seed's whole training state, in plain tensors, numbers, lists and dicts (loadable with weights_only)."""
    optim = []
    for p, row in _seed_parameters(host, position):
        state = optimizer.state.get(p, {})
        optim.append({k: (v[row].clone() if row is not None and torch.is_tensor(v) and v.dim() > 0 else
                          v.clone() if torch.is_tensor(v) else v) for k, v in state.items()})
    return {
        "host": host.host_snapshot(position),
        "kernels": [{k: v.detach().clone() for k, v in layer[position].state_dict().items()} for layer in host.kernels],
        "optimizer": optim,
        "rule": rule.state_dict(),
        # copies: a kept snapshot may be a view into the gather of every seed saved with it (`host_snapshots`)
        "best": None if best is None else {"host": [t.clone() for t in best[0]], "kernels": list(best[1])},
        "epochs": outcome.epochs, "best_epoch": outcome.best_epoch, "best_metrics": dict(outcome.best_metrics),
        "history": [dict(row) for row in outcome.history], "fit_time_s": outcome.fit_time_s,
        "batch_epoch_s": list(outcome.batch_epoch_s),
        "generator": generator.get_state(),
    }


def _load_seed_state(host: nn.Module, optimizer: torch.optim.Optimizer, position: int, state: Mapping[str, Any], rule,
                     outcome: "SeedOutcome", generator: torch.Generator) -> tuple | None:
    """Put a `_seed_state` back into the batch at `position`; returns the seed's kept best (host, kernels) or None."""
    pairs = _seed_parameters(host, position)
    with torch.no_grad():
        if hasattr(host, "host"):
            for p, value in zip(host.host, state["host"]):
                p[position].copy_(value)
        else:
            host.write_into(position, host.models[position], state["host"])
    for layer, kernel_state in zip(host.kernels, state["kernels"]):
        layer[position].load_state_dict(kernel_state)
    # Adam's step count (0-d) stays where the optimiser keeps it: on the CPU for the default implementation, on the
    # parameter's device for the fused one (as torch's own load_state_dict places it)
    step_on_device = bool(optimizer.defaults.get("fused") or optimizer.defaults.get("capturable"))

    def placed(v, p: Tensor):
        return v.to(p.device) if torch.is_tensor(v) and (v.dim() > 0 or step_on_device) else v

    for (p, row), saved in zip(pairs, state["optimizer"]):
        if not saved:
            continue
        if row is None:
            optimizer.state[p] = {k: placed(v, p) for k, v in saved.items()}
            continue
        full = optimizer.state.setdefault(p, {})
        for k, v in saved.items():
            if torch.is_tensor(v) and v.dim() > 0:
                if k not in full:
                    full[k] = torch.zeros((p.shape[0], *v.shape), dtype=v.dtype, device=p.device)
                full[k][row].copy_(v)
            else:
                full[k] = placed(v, p)  # Adam's step: one count for the stacked rows, the same for every seed
    rule.load_state_dict(state["rule"])
    outcome.epochs, outcome.best_epoch = int(state["epochs"]), state["best_epoch"]
    outcome.best_metrics, outcome.history = dict(state["best_metrics"]), [dict(row) for row in state["history"]]
    outcome.fit_time_s, outcome.batch_epoch_s = float(state["fit_time_s"]), list(state["batch_epoch_s"])
    generator.set_state(state["generator"])
    best = state["best"]
    return None if best is None else (list(best["host"]), list(best["kernels"]))


def _as_logged(losses: Tensor, count: int) -> Tensor:
    """Each seed's validation loss [S] as its lone run logs it: the lone module's metric (ExampleMean, as torchmetrics'
    MeanMetric would) keeps loss·n and n in float32 and divides them, which can differ from the loss in its last bit,
    and GAT's rule compares those values. The same two float32 operations for every seed at once, on the device: a
    MeanMetric per seed read its NaN check on the host twice, 2S syncs an epoch."""
    total = losses.detach().float() * count
    return total / torch.full_like(total, float(count))


def seeds_cross_entropy(logits: Tensor, nodes: Tensor, target: Tensor, scored: Tensor | None = None) -> Sequence[Tensor]:
    """Each seed's cross-entropy over `nodes` (logits [S, N, C], `scored` = logits[:, nodes] where the caller has
    it). On CPU each seed's own `F.cross_entropy`, its lone run's call on its lone run's shapes: a mean over [S, n]
    at once rounds differently, and GAT's rule, which counts ties as reaching the best, would then keep other
    epochs than the lone run. On the CUDA path, whose stacked host already equals the lone runs to float tolerance
    only (gat_seed_batch.py), one for all seeds: per-seed launches are what a GPU's Cora epoch is made of."""
    if not takes_cuda_path(logits):
        if scored is not None:
            return [F.cross_entropy(seed_scored, target) for seed_scored in scored]
        return [F.cross_entropy(logits[position][nodes], target) for position in range(logits.shape[0])]
    scored = logits[:, nodes] if scored is None else scored
    return F.cross_entropy(scored.transpose(1, 2), target.expand(scored.shape[0], -1), reduction="none").mean(1).unbind(0)


class _Batch(nn.Module):
    """The optimised module: the stacked host and the kernels, so that `parameter_groups` finds the kernels'
    parameters by their class exactly as it does in a lone module."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model


def fit_seed_batch(modules: Sequence[NodeClassificationModule], graph, rules: Sequence, *, max_epochs: int,
                   generators: Sequence[torch.Generator], on_finished: Callable[[SeedOutcome], None]) -> None:
    """Train `modules` (seed s: modules[s], its stopping rule rules[s], its noise generators[s]) together;
    `on_finished` gets each seed's outcome as soon as it stops, fails or reaches max_epochs."""
    first = modules[0]
    device = graph.x.device
    batch = _Batch(seed_batch_host([m.model for m in modules], device))
    batch.to(device)
    groups = graph_groups(graph.edge_index, graph.num_nodes)
    train_nodes = graph.train_mask.nonzero().squeeze(1)
    val_nodes = graph.val_mask.nonzero().squeeze(1)
    y_train, y_val = graph.y[train_nodes], graph.y[val_nodes]

    def optimizer_for(module: nn.Module, state: dict | None = None) -> torch.optim.Optimizer:
        groups_ = parameter_groups(module, lr=first.lr, weight_decay=first.weight_decay,
                                   kernel_lr_scale=first.kernel_lr_scale, decay_vectors=True)
        optimizer = graph_adam(groups_, first.lr, device)
        if state:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if id(p) in state:
                        optimizer.state[p] = state[id(p)]
        return optimizer

    optimizer = optimizer_for(batch)
    active = list(range(len(modules)))  # original index of each batch position
    best: dict[int, tuple[list[Tensor], list[dict]]] = {}
    outcomes = {s: SeedOutcome(s, modules[s], 0, None, {}, []) for s in active}
    saving = checkpointing.get()
    first_epoch = 0
    if saving is not None and saving.resume is not None:
        # Every seed given here is still training in the checkpoint (the harness checked): its parameters, Adam
        # state, rule, kept best, history and noise stream go back where the killed batch had them. (The global
        # generators, which this loop does not draw from, the harness restores before calling the task.)
        first_epoch = int(saving.resume["epoch"])
        for position, s in enumerate(active):
            kept = _load_seed_state(batch.model, optimizer, position, saving.resume["seeds"][s], rules[s], outcomes[s], generators[s])
            if kept is not None:
                best[s] = kept
    since_epochs, since_t = 0, time.perf_counter()

    def finish(s: int, position: int, error: str | None = None) -> None:
        outcome = outcomes[s]
        outcome.error = error
        if error is None:
            if s not in best:
                outcome.error = "FloatingPointError: the monitored validation metric was never finite, so no epoch's weights were kept"
            else:
                host, kernels = best.pop(s)
                batch.model.write_into(position, modules[s].model, host)
                for kernel, state in zip((layer.kernel for layer in modules[s].model.layers), kernels):
                    kernel.load_state_dict(state)
        on_finished(outcome)

    for epoch in range(first_epoch, max_epochs):
        start = time.perf_counter()
        batch.train()
        traces: list[list] = [[] for _ in active]
        logits = batch.model(graph.x, groups, traces, [generators[s] for s in active])
        losses, rows = [], []
        task_losses = seeds_cross_entropy(logits, train_nodes, y_train)
        for position, s in enumerate(active):
            task_loss = task_losses[position]
            aux, aux_logs = trace_aux_loss(traces[position], epoch, epoch)
            loss = task_loss if aux is None else task_loss + aux
            losses.append(loss)
            logs = {**aux_logs, **mechanism_logs(traces[position], task_loss, epoch, epoch)}
            rows.append({name: value.detach() for name, value in logs.items()})
        stacked = torch.stack(losses)
        optimizer.zero_grad(set_to_none=True)
        # Every seed's loss in one backward pass, a diverged (non-finite) one weighted 0: no parameter is shared
        # between seeds, so only its own gradients turn NaN, and it leaves the batch with its error after this
        # epoch's read. Each finite seed's loss gets the gradient 1 it got alone. Which seeds diverged is read with
        # the epoch's other values, not before this pass: a read here made a GPU wait for the forward pass.
        torch.where(torch.isfinite(stacked.detach()), stacked, torch.zeros_like(stacked)).sum().backward()
        optimizer.step()

        batch.eval()
        with torch.no_grad(), measured_if(diagnosed_validation(epoch)):  # the lone run's cadence (attention_terms.py)
            val_traces: list[list] = [[] for _ in active]  # the validation pass's diagnostics, as the lone run logs them
            logits = batch.model(graph.x, groups, val_traces)
            val_logits = logits[:, val_nodes]
            # each seed's cross-entropy, weighted by the node count as the lone run's val/loss is made (`_as_logged`)
            val_loss = _as_logged(torch.stack(list(seeds_cross_entropy(logits, val_nodes, y_val, val_logits))), len(val_nodes))
            val_acc = (val_logits.argmax(-1) == y_val).float().mean(1)
            for position, seed_val_loss in enumerate(val_loss.unbind(0)):  # one op for every seed's view
                logs = mechanism_logs(val_traces[position], seed_val_loss, epoch, epoch)
                rows[position].update({f"val/{name}": value for name, value in logs.items()})
            names = [sorted(row) for row in rows]
            curves = [rows[p][n].float() for p in range(len(active)) for n in names[p]]
            # the losses, accuracies and every seed's curves in the epoch's one host read
            read = torch.cat([torch.stack([stacked.detach(), val_loss, val_acc]).flatten().float(),
                              torch.stack(curves) if curves else stacked.new_zeros(0)]).tolist()
            values = [read[i * len(active):(i + 1) * len(active)] for i in range(3)]
        finite = [math.isfinite(loss) for loss in values[0]]
        read = iter(read[3 * len(active):])
        rows = [{n: next(read) for n in names[p]} for p in range(len(active))]
        epoch_s = time.perf_counter() - start

        decisions: dict[int, tuple[Any, dict[str, float]]] = {}  # position -> (its rule's decision, the metrics it saw)
        for position, s in enumerate(active):
            outcome = outcomes[s]
            outcome.epochs = epoch + 1
            outcome.fit_time_s += epoch_s / len(active)
            outcome.batch_epoch_s.append(epoch_s)
            if not finite[position]:
                continue
            metrics = {"val/loss": values[1][position], "val/acc": values[2][position]}
            outcome.history.append({"train/loss": values[0][position], **rows[position],
                                    **metrics, "epoch_s": epoch_s})
            decisions[position] = (rules[s].update(metrics), metrics)
        # the host weights of every seed that keeps this epoch's, taken together (one gather per parameter)
        keeping = [position for position, (decision, _) in decisions.items() if decision.save]
        snapshots = dict(zip(keeping, batch.model.host_snapshots(keeping)))
        survivors = []
        for position, s in enumerate(active):
            if position not in decisions:
                finish(s, position, f"DivergedError: training loss became non-finite ({values[0][position]}) at epoch {epoch}; the run diverged")
                continue
            decision, metrics = decisions[position]
            if decision.save:
                kernels = [{k: v.detach().clone() for k, v in kernel_layer[position].state_dict().items()}
                           for kernel_layer in batch.model.kernels]
                best[s] = (snapshots[position], kernels)
                outcomes[s].best_epoch, outcomes[s].best_metrics = epoch, metrics
            if decision.stop or epoch == max_epochs - 1:
                finish(s, position)
            else:
                survivors.append(position)
        if not survivors:
            return
        if len(survivors) < len(active):
            state = {id(p): optimizer.state[p] for group in optimizer.param_groups for p in group["params"] if p in optimizer.state}
            moved = batch.model.keep(survivors)
            for old_id, (new, rows) in moved.items():
                if old_id in state:
                    old = state.pop(old_id)
                    state[id(new)] = old if rows is None else {k: (v.index_select(0, rows).clone() if v.dim() > 0 else v) for k, v in old.items()}
            optimizer = optimizer_for(batch, state)
            active = [active[p] for p in survivors]
        since_epochs += 1
        if saving is not None and saving.due(since_epochs, time.perf_counter() - since_t):
            saving.save({"epoch": epoch + 1, "seeds": {s: _seed_state(batch.model, optimizer, position, rules[s], outcomes[s],
                                                                      best.get(s), generators[s])
                                                       for position, s in enumerate(active)}})
            since_epochs, since_t = 0, time.perf_counter()
