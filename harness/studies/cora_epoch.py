"""A lone Cora epoch of the harness against a plain PyG GAT loop, and the mechanism diagnostics' share of it, in one
command:

    python -m harness.studies.cora_epoch [--epochs 120] [--rounds 2] [--variant softmax]

Three sides, each at one thread, alternating round by round so that drift in the machine's load hits all of them:
- `harness`: `attnbench run cora <variant>` as a lone run (`runner.execute`: Lightning Trainer, callbacks, the test
  pass and the record), a training step plus a validation pass per epoch;
- `harness, no diagnostics`: the same run with mechanism diagnostics off (`kernel.mechanism_diagnostics(False)`),
  so the difference is what the evidence costs;
- `plain PyG`: the GAT paper's network from `torch_geometric.nn.GATConv` (8 heads x 8 hidden, dropout 0.6, ELU, Adam
  5e-3 with weight decay 5e-4 on every parameter), one training step and one validation pass per epoch, timed the
  same way. It is what a researcher would write without the harness: the baseline the harness is held to.

The goals it reads: diagnostics at most 10% of a lone epoch, and a lone epoch at most 0.5x the plain
loop's. Each figure is CPU time per epoch from the difference of two runs (`measure` says why)."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

WARM_UP_EPOCHS = 10


def plain_pyg_seconds(data, epochs: int, seed: int = 0) -> float:
    """CPU seconds of `epochs` epochs (training step + validation pass) of a plain PyG GAT on the Planetoid `data`."""
    import torch.nn.functional as F
    from torch_geometric.nn import GATConv

    torch.manual_seed(seed)

    class PlainGAT(torch.nn.Module):
        def __init__(self, features: int, classes: int):
            super().__init__()
            self.first = GATConv(features, 8, heads=8, dropout=0.6)
            self.second = GATConv(64, classes, heads=1, concat=False, dropout=0.6)

        def forward(self, x, edge_index):
            x = F.dropout(x, 0.6, self.training)
            x = F.elu(self.first(x, edge_index))
            x = F.dropout(x, 0.6, self.training)
            return self.second(x, edge_index)

    model = PlainGAT(data.num_features, int(data.y.max()) + 1)
    optimiser = torch.optim.Adam(model.parameters(), lr=5e-3, weight_decay=5e-4)
    start = time.process_time()
    for _ in range(epochs):
        model.train()
        optimiser.zero_grad()
        loss = F.cross_entropy(model(data.x, data.edge_index)[data.train_mask], data.y[data.train_mask])
        loss.backward()
        optimiser.step()
        model.eval()
        with torch.no_grad():
            logits = model(data.x, data.edge_index)
            float(F.cross_entropy(logits[data.val_mask], data.y[data.val_mask]))
            float((logits[data.val_mask].argmax(-1) == data.y[data.val_mask]).float().mean())
    return time.process_time() - start


def harness_seconds(variant: str, epochs: int, data_root: str | None, diagnostics: bool) -> float:
    """CPU seconds of a lone harness run of `epochs` epochs, start to record (setup and the test pass included:
    `measure` subtracts a shorter run's to leave the epochs alone)."""
    from harness.plan.spec import make_spec
    from harness.run.runner import execute
    from modules.attention.kernel import mechanism_diagnostics

    spec = make_spec("cora", variant, 0, {"max_epochs": epochs, "patience": epochs + 1})
    start = time.process_time()
    with mechanism_diagnostics(diagnostics):
        record = execute(spec, data_root=data_root)
    if record.error:
        raise RuntimeError(f"the harness run failed: {record.error}")
    return time.process_time() - start


def measure(variant: str, epochs: int, rounds: int, data_root: str | None, print_fn=print) -> dict[str, list[float]]:
    """Per-epoch CPU milliseconds of each side, per round: the difference of a run of `epochs` epochs and one of
    WARM_UP_EPOCHS, over the epochs between. CPU time rather than wall time, and the difference of two runs, so
    that neither other processes on a shared machine nor a run's setup and test pass count (the process is held to
    one thread, so its CPU time is its one core's)."""
    from datamodules.planetoid import load_graph

    torch.set_num_threads(1)
    data = load_graph("cora", data_root)
    sides = {"harness": lambda n: harness_seconds(variant, n, data_root, True),
             "harness, no diagnostics": lambda n: harness_seconds(variant, n, data_root, False),
             "plain PyG": lambda n: plain_pyg_seconds(data, n)}
    found: dict[str, list[float]] = {name: [] for name in sides}
    for side in sides.values():  # warm-up: imports, data caches, first allocations
        side(WARM_UP_EPOCHS)
    for _ in range(rounds):
        for name, side in sides.items():
            found[name].append(1000 * (side(epochs) - side(WARM_UP_EPOCHS)) / (epochs - WARM_UP_EPOCHS))
    harness, bare, plain = (statistics.median(found[name]) for name in sides)
    print_fn(f"A lone Cora epoch (training step + validation pass), `{variant}`, 1 thread: CPU ms per epoch over "
             f"{epochs - WARM_UP_EPOCHS} epochs (a {epochs}-epoch run less a {WARM_UP_EPOCHS}-epoch one), "
             f"{rounds} alternating rounds (torch {torch.__version__}):")
    print_fn("| side | CPU ms per epoch, each round | median |")
    print_fn("|---|---|---:|")
    for name in sides:
        print_fn(f"| {name} | {', '.join(f'{v:.1f}' for v in found[name])} | {statistics.median(found[name]):.1f} |")
    print_fn(f"- mechanism diagnostics' share of a lone epoch: {(harness - bare) / harness:.1%} (goal <= 10%)")
    print_fn(f"- a lone harness epoch against the plain PyG loop's: {harness / plain:.2f}x (goal <= 0.5x)")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.studies.cora_epoch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="softmax")
    parser.add_argument("--epochs", type=int, default=120, help="epochs per run (the first 10 are not timed)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the three sides")
    parser.add_argument("--data-root", default=None, help="the data root (default: ATTNBENCH_DATA or ../shared/data)")
    args = parser.parse_args(argv)
    from harness.run.runner import quiet_lightning

    quiet_lightning()
    measure(args.variant, args.epochs, args.rounds, args.data_root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
