"""`make gpu-smoke`: the first ten minutes on a GPU machine.

Prints the driver and CUDA versions, then, each with status, time and peak memory: a dense forward+backward
of every variant at B=32, H=12, L=512, d=64 in fp32 and under bf16 autocast; every variant on Cora for a few
epochs; 20 seeds of Cora as one seed batch (softmax, bam-weibull) against one lone seed; every variant swapped into pretrained MiniLM for one short bf16 epoch (GLUE RTE); one captioning
epoch. Writes the report to leaderboards/gpu-smoke/<hardware>.md. Sections stop starting new items once the
time budget is spent, so the whole stays under ten minutes. Without a GPU it says so and exits 0.

    python -m harness.studies.gpu_smoke [--data-root DIR] [--budget-s 540] [--out leaderboards/gpu-smoke]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

DENSE_SHAPE = (32, 12, 512, 64)  # B, H, L, d


def driver_versions() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi unavailable ({exc})"


class Report:
    def __init__(self, budget_s: float):
        self.lines: list[str] = []
        self.start = time.perf_counter()
        self.budget_s = budget_s

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def out_of_time(self) -> bool:
        return time.perf_counter() - self.start > self.budget_s

    def item(self, name: str, work: Callable[[], str]) -> None:
        """One table row: status, seconds, peak GPU memory (MiB) and what `work` reports."""
        import torch

        if self.out_of_time():
            self.say(f"| {name} | skipped (time budget spent) | | | |")
            return
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        try:
            detail, status = work(), "ok"
        except Exception as exc:  # noqa: BLE001 - a smoke test reports every failure and goes on
            detail, status = f"{type(exc).__name__}: {str(exc)[:160]}", "FAILED"
            traceback.print_exc(limit=3)
        seconds = time.perf_counter() - started
        peak = torch.cuda.max_memory_allocated() / 2**20
        self.say(f"| {name} | {status} | {seconds:.1f} | {peak:.0f} | {detail.replace('|', '/')} |")


def dense_forward_backward(name: str, bf16: bool) -> Callable[[], str]:
    def work() -> str:
        import torch

        from modules.attention import AttentionSite, DenseGroups, build_attention

        b, h, length, d = DENSE_SHAPE
        kernel = build_attention({"name": name}, num_heads=h, head_dim=d, site=AttentionSite("text", "self", sequence=True)).cuda().train()
        q, k, v = (torch.randn(b, h, length, d, device="cuda", requires_grad=True) for _ in range(3))
        groups = DenseGroups.from_key_padding(torch.ones(b, length, dtype=torch.bool, device="cuda"))
        times = []
        for _ in range(3):  # the first call pays for kernel selection and caches
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                out, result = kernel(q, k, v, groups, need_weights=False)
                loss = out.float().square().mean() + sum(a.float() for a in result.aux_losses.values())
            loss.backward()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        if not torch.isfinite(q.grad).all():
            raise FloatingPointError("non-finite gradient")
        return f"{1000 * min(times):.1f} ms per fwd+bwd"
    return work


def training_run(task: str, variant: str, params: dict, data_root: str | None, precision: str = "32") -> Callable[[], str]:
    def work() -> str:
        from harness.plan.spec import make_spec
        from harness.run import runner

        record = runner.execute(make_spec(task, variant, 0, params, precision=precision), data_root=data_root)
        if record["status"] != "ok":
            raise RuntimeError(record.get("error") or record["status"])
        metrics = ", ".join(f"{k} {v['value']:.3f}" for k, v in list(record["metrics"].items())[:2])
        return f"{record['epochs']} epochs, {record['time_per_epoch_s']:.2f} s/epoch, {metrics}"
    return work


def seed_batch_run(variant: str, seeds: int, epochs: int, data_root: str | None) -> Callable[[], str]:
    """`seeds` seeds of Cora as one seed batch, against one lone run of the same epochs measured just before:
    the throughput ratio on this GPU."""
    def work() -> str:
        from harness.plan.spec import make_spec
        from harness.run import runner
        from harness.run.seed_batch import execute_batch

        params = {"max_epochs": epochs, "patience": epochs + 1}
        started = time.perf_counter()
        lone = runner.execute(make_spec("cora", variant, 0, params), data_root=data_root)
        lone_s = time.perf_counter() - started
        started = time.perf_counter()
        records = execute_batch([make_spec("cora", variant, s, params) for s in range(seeds)], data_root=data_root, on_record=lambda r: None)
        batch_s = time.perf_counter() - started
        failed = [r.error for r in [lone, *records] if r.error]
        if failed:
            raise RuntimeError(failed[0])
        accuracy = sum(r.metrics["test/acc"]["value"] for r in records) / seeds
        return (f"{seeds} seeds x {epochs} epochs in {batch_s:.1f} s vs one lone seed {lone_s:.1f} s: "
                f"{seeds * lone_s / batch_s:.1f}x throughput, mean test/acc {accuracy:.3f}")
    return work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default=os.environ.get("ATTNBENCH_DATA"))
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting new items after this many seconds")
    parser.add_argument("--out", default="leaderboards/gpu-smoke")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        from harness.run.devices import node_gpus

        shown = node_gpus()
        print(f"gpu-smoke: no GPU usable by torch {torch.__version__} (CUDA build {torch.version.cuda or 'none'})"
              + (f", although the node shows {len(shown)}: {shown[0]}; see `attnbench bench`'s message" if shown else "")
              + "; nothing to smoke-test here")
        return 0

    from harness.run.runner import quiet_lightning
    from modules.attention import list_attentions

    quiet_lightning()
    report = Report(args.budget_s)
    device = torch.cuda.get_device_name(0)
    report.say(f"# GPU smoke test: {device}")
    report.say()
    report.say(f"- driver: {driver_versions()}")
    report.say(f"- torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
               f"bf16 supported: {torch.cuda.is_bf16_supported()}, GPUs visible: {torch.cuda.device_count()}")
    report.say(f"- commit: {subprocess.run(['git', 'rev-parse', '--short=12', 'HEAD'], capture_output=True, text=True).stdout.strip()}")
    report.say()
    report.say("| item | status | seconds | peak MiB | detail |")
    report.say("|---|---|---|---|---|")
    variants = list_attentions()
    for bf16 in (False, True):
        for name in variants:
            report.item(f"dense B,H,L,d={','.join(map(str, DENSE_SHAPE))} {'bf16' if bf16 else 'fp32'} {name}", dense_forward_backward(name, bf16))
    for name in variants:
        report.item(f"cora 3 epochs {name}", training_run("cora", name, {"max_epochs": 3, "patience": 3}, args.data_root))
    for name in ("softmax", "bam-weibull"):
        report.item(f"cora seed batch of 20, 50 epochs {name}", seed_batch_run(name, 20, 50, args.data_root))
    minilm = {"backbone": "minilm", "max_epochs": 1, "max_train_examples": 512, "max_val_examples": 128}
    for name in variants:
        report.item(f"minilm glue-rte 1 short bf16 epoch {name}", training_run("glue-rte", name, minilm, args.data_root, "bf16-mixed"))
    report.item("coco-captions 1 epoch softmax", training_run("coco-captions", "softmax", {"max_epochs": 1, "patience": 1, "meteor": False}, args.data_root))
    report.say()
    report.say(f"total {time.perf_counter() - report.start:.0f} s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / (re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-").lower() + ".md")
    path.write_text("\n".join(report.lines) + "\n")
    print(f"gpu-smoke: written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
