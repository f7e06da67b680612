"""Is align-gan's discriminator at chance because the queries and keys are aligned, or because it never learned?
(leaderboards/studies/align-gan-discriminator.md). With `--variant align-ct`, the same question for align-ct's critic and
navigator, which train under the host's L2 (their loss reaches them scaled by λ / layers as the discriminator's did).

Trains Cora's GAT at seed 0 with the task's recipe (one full-graph Adam step per epoch, GAT's L2 on the host's
weights) three ways: softmax, align-gan as it trains now (its discriminator without the host's weight decay,
version 4), and align-gan with the discriminator under the host's L2 as in version 3. Each epoch it reads the
mechanism diagnostics of the evaluation pass (the discriminator's balanced accuracy over every node, the
query/key distance) and the alignment loss of the training step, and prints their means over epoch ranges.

    python -m harness.studies.align_gan_discriminator [--variant align-gan|align-ct] [--epochs 150] [--seed 0]
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
import torch.nn.functional as F

from datamodules.planetoid import load_graph
from modules.hosts.gat import graph_groups
from modules.lit.attention_terms import mechanism_logs, trace_aux_loss
from modules.tasks import get_task


def curves(variant, *, epochs: int, seed: int, data_root: str | None, decay_discriminator: bool = False,
           undecayed: tuple[str, ...] | None = None) -> list[dict[str, float]]:
    """Per-epoch rows; `decay_discriminator`: every kernel sub-network under the host's L2; `undecayed`: these
    sub-networks out of it instead of the kernel's own choice."""
    task = get_task("cora")
    params = task.Params(max_epochs=epochs)
    L.seed_everything(seed, verbose=False)
    _, module = task.build(params, variant, data_root=data_root, cache_dir=None)
    if decay_discriminator:  # version 3: the discriminator among the host's L2-decayed parameters
        for kernel in module.model.kernels():
            kernel.undecayed = ()
    if undecayed is not None:
        for kernel in module.model.kernels():
            kernel.undecayed = undecayed
    graph = load_graph("cora", data_root)
    groups = graph_groups(graph.edge_index, graph.num_nodes)
    optimizer = module.configure_optimizers()
    train, val = graph.train_mask.nonzero().squeeze(1), graph.val_mask.nonzero().squeeze(1)
    rows = []
    for epoch in range(epochs):
        module.train()
        trace: list = []
        logits = module.model(graph.x, groups, trace)
        task_loss = F.cross_entropy(logits[train], graph.y[train])
        aux, aux_logs = trace_aux_loss(trace, epoch, epoch)
        loss = task_loss if aux is None else task_loss + aux
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        row = {"train/loss": float(loss), **{k: float(v) for k, v in aux_logs.items()}}
        module.eval()
        with torch.no_grad():
            trace = []
            logits = module.model(graph.x, groups, trace)
            val_loss = F.cross_entropy(logits[val], graph.y[val])
            row.update({f"val/{k}": float(v) for k, v in mechanism_logs(trace, val_loss, epoch, epoch).items()})
            row["val/loss"] = float(val_loss)
            row["val/acc"] = float((logits[val].argmax(-1) == graph.y[val]).float().mean())
        rows.append(row)
    return rows


def table(runs: dict[str, list[dict[str, float]]], names: list[str], block: int) -> str:
    epochs = max(len(rows) for rows in runs.values())
    head = "| run | " + " | ".join(f"epochs {s + 1}-{min(s + block, epochs)}" for s in range(0, epochs, block)) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for label, rows in runs.items():
        for name in names:
            if name not in rows[0]:
                continue
            means = [sum(r[name] for r in rows[s:s + block]) / len(rows[s:s + block]) for s in range(0, len(rows), block)]
            lines.append(f"| {label}: {name} | " + " | ".join(f"{m:.4f}" for m in means) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("align-gan", "align-ct"), default="align-gan")
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block", type=int, default=25)
    parser.add_argument("--data-root", default=None)
    args = parser.parse_args(argv)
    common = dict(epochs=args.epochs, seed=args.seed, data_root=args.data_root)
    if args.variant == "align-gan":
        runs = {
            "softmax": curves("softmax", **common),
            "align-gan v3 (D under L2)": curves("align-gan", decay_discriminator=True, **common),
            "align-gan v4": curves("align-gan", **common),
        }
    else:  # the claims' row: the paper's λ = 0.01
        paper = {"name": "align-ct", "weight": 0.01}
        runs = {
            "softmax": curves("softmax", **common),
            "align-ct (critic, navigator under L2)": curves(paper, **common),
            "align-ct (critic, navigator without L2)": curves(paper, undecayed=("critic", "navigator"), **common),
        }
    print(table(runs, ["aux/align", "val/diag/disc_acc", "val/diag/qk_distance", "val/acc"], args.block))

if __name__ == "__main__":
    main()
