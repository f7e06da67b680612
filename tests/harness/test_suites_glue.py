"""The GLUE suites: glue-albert (the alignment paper's own backbone and fine-tuning recipe) plans offline without
downloading anything, and glue-minilm (once glue-paper: MiniLM, another backbone) plans the runs it always did.

Offline here means HF_HUB_OFFLINE=1, an empty Hugging Face cache of the test's own and every socket refused, so
a test that reached for the Hub or a download would fail rather than wait."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from harness.plan.planner import plan
from harness.plan.suite import list_suites, load_suite

REPO = Path(__file__).resolve().parents[2]
PRESENT = {"glue-mrpc", "glue-cola", "glue-rte", "glue-sst2", "glue-stsb"}
"""The GLUE tasks whose train and dev files the shared data holds; MNLI, QQP and QNLI (no train.tsv) are not."""

# task -> (lr, batch_size, max_epochs, warmup_ratio): MNLI from the authors' run_glue_albert_mnil.sh (batch 8 x 2
# accumulation steps, 1000 warm-up of 100,000 steps), the others from ALBERT's Table 16 (harness/suites/glue-albert.yaml).
RECIPE = {
    "glue-mnli": (3e-5, 16, 4, 0.01),
    "glue-qnli": (1e-5, 32, 10, 0.0606),
    "glue-qqp": (5e-5, 128, 5, 0.0714),
    "glue-rte": (3e-5, 32, 10, 0.25),
    "glue-sst2": (1e-5, 32, 10, 0.06),
    "glue-cola": (1e-5, 16, 10, 0.06),
    "glue-stsb": (2e-5, 16, 10, 0.0595),
    "glue-mrpc": (2e-5, 32, 7, 0.25),
}
# ALBERT's Table 16: task -> (optimizer steps, batch, warm-up steps), and the full train sets' sizes.
TABLE_16 = {"glue-qnli": (33000, 32, 2000), "glue-qqp": (14000, 128, 1000), "glue-rte": (800, 32, 200), "glue-sst2": (20935, 32, 1256),
            "glue-cola": (5336, 16, 320), "glue-stsb": (3598, 16, 214), "glue-mrpc": (800, 32, 200)}
TRAIN_SIZES = {"glue-mnli": 392702, "glue-qnli": 104743, "glue-qqp": 363846, "glue-rte": 2490, "glue-sst2": 67349,
               "glue-cola": 8551, "glue-stsb": 5749, "glue-mrpc": 3668}


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network, an empty Hugging Face cache; returns the cache folder (it must stay empty)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))

    def refuse(*args, **kwargs):
        raise AssertionError(f"a network connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return cache


def test_glue_albert_plans_every_run_with_the_recipe_without_downloading(shared_data, offline):
    suite = load_suite("glue-albert")
    assert {t.name for t in suite.tasks} == set(RECIPE)  # the tasks of the alignment paper's GLUE table, no WNLI
    assert {t.name for t in suite.tasks if t.optional} == set(RECIPE) - PRESENT
    the_plan = plan(suite, str(shared_data))
    variants = {v.label or v.name for v in suite.variants}
    assert len(variants) >= 12 and {"softmax", "align-gan", "align-ot", "align-ct", "bam-weibull"} <= variants
    expected = {(task, variant, seed) for task in PRESENT for variant in variants for seed in range(5)}
    assert {(s.task, s.display, s.seed) for s in the_plan.specs} == expected
    assert len(the_plan.specs) == len(expected)
    # a task without data here is skipped, saying which file is missing
    assert set(the_plan.skipped_tasks) == set(RECIPE) - PRESENT
    for task, why in the_plan.skipped_tasks.items():
        assert "train.tsv" in why, (task, why)
    for spec in the_plan.specs:
        lr, batch, epochs, warmup = RECIPE[spec.task]
        p = spec.params
        assert p["backbone"] == "albert-base-v2" and p["max_length"] == 512
        assert (p["lr"], p["batch_size"], p["max_epochs"], p["warmup_ratio"]) == (lr, batch, epochs, warmup), spec.task
        assert p["weight_decay"] == 0.0 and p["dropout"] == 0.0 and p["patience"] >= p["max_epochs"]
        assert p["max_train_examples"] is None  # the full training sets
    assert not any(offline.iterdir()), "planning wrote to the Hugging Face cache"


def test_the_unrun_tasks_plan_with_their_recipe_too(shared_data, offline):
    """MNLI, QQP and QNLI have no data here; their specs (what a GPU node with the data runs) carry the recipe."""
    from harness.plan.spec import make_spec

    suite = load_suite("glue-albert")
    for task in suite.tasks:
        spec = make_spec(task.name, "softmax", 0, {**suite.params, **task.params})
        lr, batch, epochs, warmup = RECIPE[task.name]
        assert (spec.params["lr"], spec.params["batch_size"], spec.params["max_epochs"], spec.params["warmup_ratio"]) == (lr, batch, epochs, warmup)
        assert spec.params["backbone"] == "albert-base-v2"


def test_the_recipe_is_the_sources_arithmetic():
    """Epochs = the source's optimizer steps x batch over the full train set, rounded; warm-up = its warm-up steps
    over its steps. MNLI: the authors' 100,000 steps of 8 x 2 with 1,000 warm-up (their max_steps overrides
    --num_train_epochs 3)."""
    for task, (steps, batch, warmup) in TABLE_16.items():
        lr, suite_batch, epochs, ratio = RECIPE[task]
        assert suite_batch == batch
        assert epochs == round(steps * batch / TRAIN_SIZES[task]), task
        assert ratio == pytest.approx(warmup / steps, abs=5e-4), task
    assert RECIPE["glue-mnli"][1:] == (8 * 2, round(100000 * 16 / TRAIN_SIZES["glue-mnli"]), 1000 / 100000)


def test_glue_albert_is_refused_offline_before_any_record(shared_data, offline, tmp_path, capsys):
    from harness.cli import main

    runs = tmp_path / "runs"
    code = main(["bench", "--suite", "glue-albert", "--data-root", str(shared_data), "--runs-dir", str(runs), "--variants", "softmax"])
    err = capsys.readouterr().err
    assert code != 0
    assert "albert-base-v2" in err and str(offline) in err and "from_pretrained('albert-base-v2')" in err
    assert not (runs.exists() and any(runs.rglob("*.json"))), "a record was written"
    assert not any(offline.iterdir())


def _fake_cached_config(cache: Path) -> None:
    """albert-base-v2's config.json alone, laid out as the Hub cache holds it: enough for the checkpoint check,
    nothing to train with (no weights, no tokenizer)."""
    snapshot = cache / "models--albert-base-v2" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "albert"}))
    (cache / "models--albert-base-v2" / "refs").mkdir()
    (cache / "models--albert-base-v2" / "refs" / "main").write_text("0" * 40)


def test_glue_albert_dry_run_lists_its_runs_without_downloading(shared_data, offline, tmp_path, capsys):
    """With the checkpoint cached (here its config alone) the dry run lists every run and fetches nothing."""
    from harness.cli import main

    _fake_cached_config(offline)
    before = sorted(p.relative_to(offline) for p in offline.rglob("*"))
    code = main(["bench", "--suite", "glue-albert", "--dry-run", "--data-root", str(shared_data), "--runs-dir", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert code == 0
    for task in PRESENT:
        assert task in out
    assert "300" in out or out.count("pending") >= 300  # 5 tasks x 12 variants x 5 seeds
    assert sorted(p.relative_to(offline) for p in offline.rglob("*")) == before


def test_glue_albert_dry_run_lists_its_runs_offline_with_no_checkpoint(shared_data, offline, tmp_path, capsys):
    """A missing checkpoint is not missing data: the dry run lists every run, marks each as blocked and says what a
    real bench refuses with (the model, the cache looked in, how to fetch it); it trains nothing, so it exits 0."""
    from harness.cli import main

    runs = tmp_path / "runs"
    code = main(["bench", "--suite", "glue-albert", "--dry-run", "--data-root", str(shared_data), "--runs-dir", str(runs)])
    out = capsys.readouterr().out
    assert code == 0
    for task in PRESENT:
        assert task in out
    assert out.count("no checkpoint") >= 300  # 5 tasks x 12 variants x 5 seeds, each marked
    assert "300 runs: 0 finished, 0 failed, 300 pending, 300 of them no checkpoint" in out
    assert "albert-base-v2" in out and str(offline) in out and "from_pretrained('albert-base-v2')" in out
    assert not runs.exists()
    assert not any(offline.iterdir())


def test_a_missing_checkpoint_blocks_only_the_runs_still_to_run(shared_data, offline):
    """A real bench checks the checkpoint of the runs it would start: finished runs need none, so a suite run to
    the end renders its board on a machine without the checkpoint. A missing checkpoint leaves the data checks,
    and so the trivial baselines, alone."""
    from harness.plan.planner import MissingCheckpointError

    the_plan = plan(load_suite("glue-albert"), str(shared_data))
    assert not the_plan.missing_data
    assert set(the_plan.missing_checkpoints()) == {s.key for s in the_plan.specs}
    the_plan.require_checkpoints([])
    with pytest.raises(MissingCheckpointError, match="albert-base-v2"):
        the_plan.require_checkpoints(s.key for s in the_plan.specs[:1])
    assert the_plan.trivial_baseline("glue-rte") is not None
    assert not any(offline.iterdir())


def test_glue_minilm_is_glue_paper_renamed_with_the_same_runs(shared_data):
    """Renaming changed no run: a suite's name is not in the key, and its committed plan is the same runs."""
    assert "glue-paper" not in list_suites() and {"glue-minilm", "glue-albert"} <= set(list_suites())
    suite = load_suite("glue-minilm")
    the_plan = plan(suite, str(shared_data))
    assert {s.params["backbone"] for s in the_plan.specs} == {"minilm"}
    assert {s.extra["suite"] for s in the_plan.specs} == {"glue-minilm"}
    assert set(the_plan.skipped_tasks) == {"glue-mnli", "glue-qqp", "glue-qnli"}
    assert len(the_plan.specs) == len(PRESENT | {"glue-wnli"}) * len(suite.variants) * 3
    # the keys glue-paper planned (its records in tests/fixtures/boards/records.jsonl were written under that name)
    paper_keys = {r["key"] for r in _fixture_records() if r["spec"]["extra"].get("suite") == "glue-paper"}
    assert paper_keys and paper_keys <= {s.key for s in the_plan.specs}


def _fixture_records() -> list[dict]:
    path = REPO / "tests" / "fixtures" / "boards" / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
