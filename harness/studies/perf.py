"""`attnbench perf`: forward+backward time of every variant relative to softmax, measured in the same run.

Dense: B=8, H=8, L=256, d=64 against SDPA (softmax's fused path). Graph: Cora's edges (self loops
added), 8 heads x 8 dims, against segment softmax. Each variant is timed alternately with softmax
(medians after warm-up), so that drift in machine load hits both alike."""

from __future__ import annotations

import fnmatch
import statistics
import time
from typing import Callable

import torch

from datamodules.planetoid import load_graph
from modules.attention import AttentionSite, DenseGroups, SegmentGroups, build_attention, list_attentions
from modules.hosts.gat import graph_groups

# Targets from the issue: slowdown relative to softmax that each family should stay within.
TARGETS = {"fenchel": 1.3, "fenchel-exact": 3.0, "gmm": 1.3, "bam-*": 2.0, "sparsemax": 3.0, "entmax*": 3.0, "align-*": 1.5}


def target_for(name: str) -> float | None:
    for pattern, target in TARGETS.items():
        if fnmatch.fnmatch(name, pattern):
            return target
    return None


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _paired(baseline: Callable[[], None], variant: Callable[[], None], repeats: int, device: torch.device = torch.device("cpu")) -> tuple[float, float]:
    """Median seconds of baseline and variant, timed alternately so that drift in machine load (a shared
    2-core box) hits both alike; the ratio of the medians is the number we report. On a GPU each timing
    waits for the device (kernels run asynchronously), so host syncs inside a variant count as they would
    in training."""
    for fn in (baseline, variant, baseline, variant):
        fn()
    base, var = [], []
    for _ in range(repeats):
        for fn, samples in ((baseline, base), (variant, var)):
            _synchronize(device)
            start = time.perf_counter()
            fn()
            _synchronize(device)
            samples.append(time.perf_counter() - start)
    return statistics.median(base), statistics.median(var)


def _step(kernel, q, k, v, groups) -> Callable[[], None]:
    def run() -> None:
        for t in (q, k, v):
            t.grad = None
        kernel.zero_grad(set_to_none=True)
        out, result = kernel(q, k, v, groups, need_weights=False)
        loss = out.square().mean()
        weights = kernel.loss_weights(10_000, epoch=100)  # late in training, in either schedule unit
        for name, value in result.aux_losses.items():
            loss = loss + weights.get(name, 1.0) * value
        loss.backward()

    return run


def dense_problem(batch=8, heads=8, length=256, dim=64, device: torch.device = torch.device("cpu")):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, length, dim, generator=g).to(device).requires_grad_(True) for _ in range(3))
    # Kernels are built where this problem would sit: token self-attention in a text encoder (per-host
    # defaults such as BAM's and fenchel's position prior depend on it).
    return q, k, v, DenseGroups(None), heads, dim, AttentionSite("text", "self", sequence=True)


def graph_problem(data_root: str | None, cache_dir: str | None, heads=8, dim=8, device: torch.device = torch.device("cpu")):
    graph = load_graph("cora", data_root, cache_dir)
    groups: SegmentGroups = graph_groups(graph.edge_index.to(device), graph.num_nodes)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(graph.num_nodes, heads, dim, generator=g).to(device).requires_grad_(True) for _ in range(3))
    return q, k, v, groups, heads, dim, AttentionSite("graph", "self")


def measure(pattern: str | None = None, repeats: int = 10, data_root: str | None = None, cache_dir: str | None = None, print_fn=print,
            device: str = "cpu") -> list[dict]:
    """`device`: 'cpu' or 'cuda' (the same ratios on a GPU; ValueError without one)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("perf --device cuda: torch sees no GPU here")
    where = torch.device(device)
    names = [n for n in list_attentions() if n != "softmax" and (pattern is None or fnmatch.fnmatch(n, pattern))]
    problems = {"dense": dense_problem(device=where)}
    try:
        problems["graph"] = graph_problem(data_root, cache_dir, device=where)
    except Exception as exc:  # noqa: BLE001 - the dense half is still worth printing
        print_fn(f"(graph benchmark skipped: {exc})")
    # The mechanism diagnostics are instruments, not the methods: off here. On, softmax and the align-* rows paid
    # the q/k distance every call and the others did not (softmax's dense step was 84 ms with it, 50 without), so
    # every ratio against softmax came out flattered.
    from modules.attention.kernel import mechanism_diagnostics

    with mechanism_diagnostics(False):
        return _measure(names, problems, repeats, where, print_fn)


def _measure(names, problems, repeats: int, where, print_fn) -> list[dict]:
    rows = []
    on = torch.cuda.get_device_name(where) if where.type == "cuda" else f"{torch.get_num_threads()} threads"
    print_fn(f"forward+backward, median of {repeats} alternating with softmax; torch {torch.__version__}, {on}")
    print_fn(f"{'variant':<16}" + "".join(f"{p + ' ms':>12}{'softmax ms':>12}{'ratio':>8}" for p in problems) + f"{'target':>9}  verdict")
    for name in names:
        row = {"variant": name, "target": target_for(name)}
        cells = ""
        for label, (q, k, v, groups, heads, dim, site) in problems.items():
            torch.manual_seed(0)
            baseline = _step(build_attention("softmax", num_heads=heads, head_dim=dim, site=site).to(where), q, k, v, groups)
            try:
                variant = _step(build_attention(name, num_heads=heads, head_dim=dim, site=site).to(where), q, k, v, groups)
                base_s, var_s = _paired(baseline, variant, repeats, where)
            except Exception as exc:  # noqa: BLE001 - one broken variant must not hide the others
                row[label] = None
                cells += f"{'error':>12}{'':>12}{'':>8}"
                print_fn(f"  {name} on {label}: {type(exc).__name__}: {exc}")
                continue
            row[label] = {"ms": var_s * 1e3, "softmax_ms": base_s * 1e3, "ratio": var_s / base_s}
            cells += f"{var_s * 1e3:>12.2f}{base_s * 1e3:>12.2f}{var_s / base_s:>8.2f}"
        target = row["target"]
        ratios = [row[p]["ratio"] for p in problems if row.get(p)]
        verdict = "—" if target is None or not ratios else ("meets" if max(ratios) <= target else "misses")
        print_fn(f"{name:<16}{cells}{(f'{target:.1f}x' if target else '—'):>9}  {verdict}")
        rows.append(row)
    return rows
