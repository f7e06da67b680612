"""`attnbench perf --seed-batch S`: seeds per second of S seeds trained as one seed batch against one lone run,
for each variant on Cora, and the peak-memory ratio, measured in the same run.

Both sides are the real paths: `runner.execute` for the lone run (Lightning Trainer, test and record) and
`seed_batch.execute_batch` for the batch, each for the same fixed number of epochs (patience above it, so no
seed stops early and both sides train the same number of epochs per seed). Lone and batch alternate per
variant so that drift in machine load hits both. Memory: on a GPU, max allocated bytes; on CPU, the process's
peak RSS (mostly torch itself: the rise above the RSS before each measurement is printed beside it).
"""

from __future__ import annotations

import fnmatch
import time
import torch

from modules.attention import list_attentions

from harness.plan.spec import make_spec
from harness.run.runner import PeakMemory, execute, process_memory_mb, quiet_lightning
from harness.run.seed_batch import execute_batch


def _measured(work) -> tuple[float, float, float, list]:
    """Seconds, peak memory (GPU: max allocated; CPU: peak RSS), its rise above the memory before, and what
    `work` returned."""
    memory = PeakMemory()
    memory.reset()
    before = torch.cuda.memory_allocated() / 2**20 if memory.cuda else (process_memory_mb() or 0.0)
    start = time.perf_counter()
    out = work()
    if memory.cuda:
        torch.cuda.synchronize()
    peak = memory.peak_mb()
    return time.perf_counter() - start, peak, peak - before, out


def measure_seed_batch(pattern: str | None, seeds: int, epochs: int, data_root: str | None, cache_dir: str | None = None,
                       task: str = "cora", print_fn=print) -> list[dict]:
    quiet_lightning()
    names = [n for n in list_attentions() if pattern is None or any(fnmatch.fnmatch(n, p.strip()) for p in pattern.split(","))]
    params = {"max_epochs": epochs, "patience": epochs + 1}
    device = "GPU " + torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} thread(s)"
    print_fn(f"seed batching on {task}: {seeds} seeds as one batch vs one lone run, {epochs} epochs each, on {device}")
    print_fn("| variant | lone s/seed | batch s | seeds/s lone | seeds/s batch | throughput x | batch time / lone time | peak MB lone / batch (rise) | peak mem ratio | status |")
    print_fn("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name in names:
        lone_spec = make_spec(task, name, 0, params)
        batch_specs = [make_spec(task, name, seed, params) for seed in range(seeds)]
        execute(lone_spec, data_root=data_root, cache_dir=cache_dir)  # warm-up: data cache, imports, first allocations
        lone_s, lone_mb, lone_rise, lone = _measured(lambda: execute(lone_spec, data_root=data_root, cache_dir=cache_dir))
        batch_s, batch_mb, batch_rise, batch = _measured(lambda: execute_batch(batch_specs, data_root=data_root, cache_dir=cache_dir, on_record=lambda r: None))
        failed = [r.error for r in [lone, *batch] if r.error]
        row = {"variant": name, "lone_s": lone_s, "batch_s": batch_s, "seeds": seeds,
               "throughput": (seeds / batch_s) / (1 / lone_s), "memory_ratio": batch_mb / lone_mb,
               "peak_mb": (lone_mb, batch_mb), "rise_mb": (lone_rise, batch_rise), "failed": failed}
        rows.append(row)
        print_fn(f"| {name} | {lone_s:.2f} | {batch_s:.2f} | {1 / lone_s:.2f} | {seeds / batch_s:.2f} | {row['throughput']:.2f} | "
                 f"{batch_s / lone_s:.2f} | {lone_mb:.0f} ({lone_rise:+.0f}) / {batch_mb:.0f} ({batch_rise:+.0f}) | {row['memory_ratio']:.2f} | {'ok' if not failed else 'FAILED: ' + failed[0][:80]} |")
    return rows
