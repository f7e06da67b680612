"""Markdown and CSV leaderboards from synthetic records: counts in the cells, hardware sections, marks,
tuned rows, and byte-identical regeneration."""

import csv
import io
import json
import random

import yaml

from harness.report.leaderboard import write_leaderboard
from harness.results.store import RecordStore
from harness.plan.planner import plan
from harness.plan.suite import load_suite

from .test_board import BASE, CPU, GPU, record, shifted

SUITE = """\
name: synthetic
description: >
  made-up records
  for the leaderboard tests
tasks: [cora, citeseer]
variants: [softmax, gmm, fenchel, sparsemax]
seeds: 5
"""


def synthetic(tmp_path, tuned_dir=None):
    """Every status at once: gmm clearly better on cora with one failed and one pruned seed, fenchel with a
    missing seed, sparsemax clearly worse, and citeseer's seeds 3-4 on a GPU."""
    path = tmp_path / "synthetic.yaml"
    path.write_text(SUITE)
    the_plan = plan(load_suite(str(path)), tuned_dir=tuned_dir)
    accuracy = {"softmax": BASE, "gmm": shifted([0.05, 0.052, 0.049, 0.051, 0.048]), "fenchel": shifted([0.001, -0.002, 0.003, -0.001, 0.0]),
                "sparsemax": shifted([-0.03, -0.031, -0.029, -0.032, -0.03])}
    found = []
    for spec in the_plan.specs:
        variant = spec.display.removesuffix(" (tuned)")
        if spec.task == "cora" and variant == "fenchel" and spec.seed == 4:
            continue
        status = {3: "failed", 4: "pruned"}.get(spec.seed, "ok") if spec.task == "cora" and variant == "gmm" else "ok"
        hardware = GPU if spec.task == "citeseer" and spec.seed >= 3 else CPU
        finished = f"2026-01-0{1 + spec.seed}T10:00:00+00:00"
        found.append(record(spec, {"test/acc": accuracy[variant][spec.seed]}, status=status, hardware=hardware, finished=finished,
                            commit="c0ffee" if spec.task == "cora" else "beef42"))
    return str(path), found


def table_lines(markdown, heading):
    """The Markdown table rows under the first `### heading` after the given position."""
    section = markdown.split(heading, 1)[1].split("\n### ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ")]


def cells(lines, variant):
    line = next(line for line in lines if f"| `{variant}` |" in line)
    return [c.strip() for c in line.strip("|").split("|")]


def test_markdown_shows_counts_marks_hardware_sections_and_failures(tmp_path):
    suite_path, found = synthetic(tmp_path)
    store = RecordStore(tmp_path / "runs")
    for r in found:
        store.write(r)
    paths = write_leaderboard(suite_path, runs=str(tmp_path / "runs"), out_dir=tmp_path / "lb")
    assert [p.name for p in paths[:2]] == ["synthetic.md", "synthetic.csv"]
    md = (tmp_path / "lb" / "synthetic.md").read_text()

    assert "made-up records for the leaderboard tests" in md
    assert "- Records: 39 of 40 planned runs (ok 37, failed 1, pruned 1, missing 1); seeds 0, 1, 2, 3, 4" in md
    assert "- Commit(s): beef42, c0ffee; runs finished 2026-01-01 to 2026-01-05" in md
    assert "do not edit" in md and "Holm" in md
    # citeseer's seeds 3-4 ran on a GPU: one ranking over both machines, cost per hardware class below each table
    assert md.count("## Hardware: ") == 1
    assert "- Hardware: 1x NVIDIA H100: 8 records; CPU AMD EPYC (1 thread/run): 31 records" in md

    cora = table_lines(md, "### cora")
    header = [c.strip() for c in cora[0].strip("|").split("|")]
    assert header == ["#", "variant", "`test/acc`", "`test/macro_f1`", "Δ `test/acc` (Holm p)", "vs trivial (Holm p)", "n", "failed", "pruned", "missing"]
    gmm, fenchel, softmax, sparsemax = (cells(cora, v) for v in ("gmm", "fenchel", "softmax", "sparsemax"))
    assert gmm[0] == "1" and gmm[2].endswith("▲") and gmm[2].startswith("85.") and "[" in gmm[2]
    assert gmm[6:10] == ["3/5", "1", "1", "0"]
    assert fenchel[6:10] == ["4/5", "0", "0", "1"]
    assert softmax[4] == "baseline" and not softmax[2].endswith(("▲", "▼"))
    assert sparsemax[0] == "4" and sparsemax[2].endswith("▼") and sparsemax[4].startswith("-3.")
    assert "- `gmm`: RuntimeError: boom" in md.split("### citeseer")[0]
    assert "records from commit(s) c0ffee, finished 2026-01-01 to 2026-01-05" in md

    # citeseer: seeds 0-2 on the CPU, 3-4 on the GPU, all five in one row; their cost apart, per class
    citeseer = md.split("### citeseer")[1]
    assert cells(table_lines(md, "### citeseer"), "gmm")[6:10] == ["5/5", "0", "0", "0"]
    cost = [line for line in citeseer.splitlines() if line.startswith("| `gmm` | ")]
    assert [cells([line], "gmm")[1:3] for line in cost] == [["1x NVIDIA H100", "2"], ["CPU AMD EPYC (1 thread/run)", "3"]]
    overall = table_lines(md, "### Overall")
    assert cells(overall, "gmm") == ["`gmm`", "1.00", "2/2", "2", "0"]
    assert cells(overall, "sparsemax") == ["`sparsemax`", "4.00", "2/2", "0", "2"]


def test_csv_has_every_planned_run_with_hardware_and_versions(tmp_path, shared_data):
    suite_path, found = synthetic(tmp_path)
    store = RecordStore(tmp_path / "runs")
    for r in found:
        store.write(r)
    # The trivial rows are computed from the data: given the data root, not whatever an earlier test (or none,
    # on a cold cache without ATTNBENCH_DATA, where PyG's download fails offline) left in the processed cache.
    write_leaderboard(suite_path, runs=str(tmp_path / "runs"), out_dir=tmp_path / "lb", data_root=str(shared_data))
    rows = list(csv.DictReader(io.StringIO((tmp_path / "lb" / "synthetic.csv").read_text())))
    assert [(r["task"], r["status"]) for r in rows if r["status"] == "trivial"] == [("citeseer", "trivial"), ("cora", "trivial")]
    rows = [r for r in rows if r["status"] != "trivial"]
    assert len(rows) == 40
    assert [(r["task"], r["label"], r["seed"]) for r in rows] == sorted((r["task"], r["label"], r["seed"]) for r in rows)
    missing = [r for r in rows if r["status"] == "missing"]
    assert [(r["task"], r["label"], r["seed"]) for r in missing] == [("cora", "fenchel", "4")]
    gpu_run = next(r for r in rows if r["task"] == "citeseer" and r["label"] == "softmax" and r["seed"] == "4")
    assert (gpu_run["accelerator"], gpu_run["device"], gpu_run["device_count"], gpu_run["threads"]) == ("gpu", "NVIDIA H100", "1", "")
    cpu_run = next(r for r in rows if r["task"] == "cora" and r["label"] == "softmax" and r["seed"] == "0")
    assert (cpu_run["threads"], cpu_run["python"], cpu_run["lightning"], cpu_run["torch"]) == ("1", "3.11.7", "2.6.6", "2.14.1")
    assert float(cpu_run["test/acc"]) == BASE[0]


def test_tuned_rows_and_their_cost_are_listed_and_never_the_baseline(tmp_path):
    params = tmp_path / "params"
    for variant in ("softmax", "gmm"):
        (params / "cora").mkdir(parents=True, exist_ok=True)
        (params / "cora" / f"{variant}.yaml").write_text(yaml.safe_dump({
            # tuned parameters other than the defaults: a tuned row equal to the default one is not planned
            "task": "cora", "variant": variant, "attention": {"name": variant}, "params": {"lr": 0.004},
            "tuning": {"study": f"cora/{variant}/x", "trials": {"complete": 7, "pruned": 13, "fail": 0}, "seconds": 1364.8, "seed": 9973}}))
    suite_path, found = synthetic(tmp_path, tuned_dir=params)
    store = RecordStore(tmp_path / "runs")
    for r in found:
        store.write(r)
    write_leaderboard(suite_path, runs=str(tmp_path / "runs"), out_dir=tmp_path / "lb", tuned_params_dir=params)
    md = (tmp_path / "lb" / "synthetic.md").read_text()
    cpu_part = md  # one ranking across hardware classes
    cora = table_lines(cpu_part, "### cora")
    assert cells(cora, "softmax")[4] == "baseline"
    assert cells(cora, "softmax (tuned)")[4] != "baseline"
    # what it ran: the tuned learning rate, and the kernel scale the task derives from it (1e-2 / lr)
    assert "- `gmm (tuned)`: kernel_lr_scale=2.5, lr=0.004; 20 trials (7 complete, 0 fail, 13 pruned), 22.7 min of training" in cpu_part


def test_same_records_in_any_order_give_byte_identical_files(tmp_path):
    suite_path, found = synthetic(tmp_path)
    store = RecordStore(tmp_path / "runs-a")
    for r in found:
        store.write(r)
    # The second store is written by hand in the reverse order with every dict's keys reversed and
    # unsorted, as another writer (or a hand-merged folder) might leave them.
    other = tmp_path / "runs-b" / "records"
    other.mkdir(parents=True)
    shuffled = list(found)
    random.Random(1).shuffle(shuffled)
    for r in shuffled:
        (other / f"{r['key']}.json").write_text(json.dumps(_reversed(r)))
    a = write_leaderboard(suite_path, runs=str(tmp_path / "runs-a"), out_dir=tmp_path / "lb-a")
    b = write_leaderboard(suite_path, runs=str(tmp_path / "runs-b"), out_dir=tmp_path / "lb-b")
    assert [p.name for p in a] == [p.name for p in b]
    for left, right in zip(a, b):
        assert left.read_bytes() == right.read_bytes(), left.name
    again = write_leaderboard(suite_path, runs=str(tmp_path / "runs-a"), out_dir=tmp_path / "lb-a")
    assert [p.read_bytes() for p in again] == [(tmp_path / "lb-b" / p.name).read_bytes() for p in again]


def _reversed(value):
    if isinstance(value, dict):
        return {k: _reversed(value[k]) for k in reversed(list(value))}
    return value


def test_a_write_that_dies_before_its_rename_leaves_the_previous_board_whole(tmp_path, monkeypatch):
    """Boards are written as records are (temp file, rename): a process killed mid-write leaves the old board or
    the new one, never a truncated one, and the board files get open()'s mode (0666 less the umask), not mkstemp's
    0600, so that the group sharing a leaderboards folder can read them."""
    import os

    from harness.results import store as store_module

    suite_path, found = synthetic(tmp_path)
    store = RecordStore(tmp_path / "runs")
    for r in found[:20]:
        store.write(r)
    written = write_leaderboard(suite_path, runs=str(tmp_path / "runs"), out_dir=tmp_path / "lb")
    before = {p.name: p.read_bytes() for p in written}
    assert all(os.stat(p).st_mode & 0o777 == store_module.FILE_MODE for p in written)
    for r in found[20:]:
        store.write(r)

    def killed(src, dst):
        raise KeyboardInterrupt("killed between the temp file and the rename")

    monkeypatch.setattr(os, "replace", killed)
    try:
        write_leaderboard(suite_path, runs=str(tmp_path / "runs"), out_dir=tmp_path / "lb")
    except KeyboardInterrupt:
        pass
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in (tmp_path / "lb").iterdir()} == before  # no temp file either
    after = write_leaderboard(suite_path, runs=str(tmp_path / "runs"), out_dir=tmp_path / "lb")
    assert any(p.read_bytes() != before[p.name] for p in after)
