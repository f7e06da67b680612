"""vl-paper without the pretrained image encoder's weights: missing weights block runs, they are not missing
data. A dry run lists every run, marked, and exits 0; a real bench or run refuses before anything runs or is
recorded; missing data still stops both (tests/harness/test_suite.py).

The data root here holds what vl-paper reads, built from the shared subsets: coco/ with a Karpathy split file
written for its 239 images, and vqa2/ as the VQA subset layout. Offline means HF_HUB_OFFLINE, empty Hugging
Face and torch hub caches of the test's own and every socket refused, so a test that reached for a download
would fail rather than wait."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from harness.plan.planner import plan
from harness.plan.suite import load_suite

FETCH = "timm.create_model('resnet50', pretrained=True)"


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network, empty weight caches; returns the Hugging Face cache folder (it must stay empty)."""
    import torch
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub read the variable when it was imported, maybe before this test
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "torch-hub"))

    def refuse(*args, **kwargs):
        raise AssertionError(f"a network connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return cache


@pytest.fixture
def vl_data(shared_data, tmp_path) -> Path:
    """A data root with every file vl-paper's parameters name (coco/dataset_coco.json, vqa2/)."""
    root = tmp_path / "data"
    coco = root / "coco"
    coco.mkdir(parents=True)
    for name in ("captions.json", "images"):
        (coco / name).symlink_to(shared_data / "coco" / name)
    images = json.loads((shared_data / "coco" / "captions.json").read_text())["images"]
    splits = ["train"] * 8 + ["restval", "val", "test"]
    (coco / "dataset_coco.json").write_text(json.dumps({"images": [
        {"cocoid": image["id"], "filename": image["file_name"], "split": splits[i % len(splits)]} for i, image in enumerate(images)]}))
    (root / "vqa2").symlink_to(shared_data / "vqa")
    return root


def test_vl_paper_dry_run_lists_its_runs_offline_without_the_encoder_weights(vl_data, offline, tmp_path, capsys):
    """The dry run lists every run, marks each as blocked and says what a real bench refuses with (the model, the
    cache looked in, how to fetch it), once for both tasks; it trains nothing, so it exits 0."""
    from harness.cli import main

    runs = tmp_path / "runs"
    total = len(plan(load_suite("vl-paper"), str(vl_data)).specs)
    assert total == 2 * 12 * 3  # 2 tasks x every variant x 3 seeds
    code = main(["bench", "--suite", "vl-paper", "--dry-run", "--data-root", str(vl_data), "--runs-dir", str(runs)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = captured.out
    assert "coco-captions" in out and "vqa" in out
    assert f"{total} runs: 0 finished, 0 failed, {total} pending, {total} of them no checkpoint" in out
    assert "coco-captions, vqa: image_weights=pretrained" in out  # one problem, both tasks
    assert "'resnet50'" in out and str(offline) in out and FETCH in out and "image_weights=random" in out
    assert "network connection" not in out  # the offline Hub said no, not the refused socket
    assert not runs.exists()
    assert not any(offline.iterdir())


def test_vl_paper_is_refused_offline_before_any_record(vl_data, offline, tmp_path, capsys):
    from harness.cli import main

    runs = tmp_path / "runs"
    code = main(["bench", "--suite", "vl-paper", "--data-root", str(vl_data), "--runs-dir", str(runs), "--variants", "softmax",
                 "--leaderboard-dir", str(tmp_path / "boards")])
    err = capsys.readouterr().err
    assert code == 2
    assert "'resnet50'" in err and str(offline) in err and FETCH in err and "network connection" not in err
    assert not (runs.exists() and any(runs.rglob("*.json"))), "a record was written"
    assert not (tmp_path / "boards").exists()
    assert not any(offline.iterdir())


def test_missing_encoder_weights_block_only_the_runs_still_to_run(vl_data, offline):
    """Finished runs need no weights; missing weights leave the data checks, and so the trivial baselines, alone."""
    from harness.plan.planner import MissingCheckpointError

    the_plan = plan(load_suite("vl-paper"), str(vl_data))
    assert not the_plan.missing_data and not the_plan.skipped_tasks
    assert set(the_plan.missing_checkpoints()) == {s.key for s in the_plan.specs}
    the_plan.require_checkpoints([])
    with pytest.raises(MissingCheckpointError, match="resnet50"):
        the_plan.require_checkpoints(s.key for s in the_plan.specs if s.task == "vqa")
    assert the_plan.trivial_baseline("vqa") is not None
    assert not any(offline.iterdir())


def test_run_with_pretrained_weights_offline_dry_runs_and_refuses(shared_data, offline, tmp_path, capsys):
    """`run`: the dry run prints the configuration and what a real run refuses with, and exits 0; the real run
    refuses (exit 2) before anything runs. The default random weights need nothing (easy-vqa and coco-captions
    plan as ever)."""
    from harness.cli import main

    runs = tmp_path / "runs"
    argv = ["run", "coco-captions", "softmax", "--set", "image_weights=pretrained", "--set", "backbone=resnet50",
            "--data-root", str(shared_data), "--runs-dir", str(runs)]
    assert main([*argv, "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "resnet50" in captured.out
    assert "real run is refused" in captured.err and FETCH in captured.err
    assert main(argv) == 2
    assert FETCH in capsys.readouterr().err
    assert not (runs.exists() and any(runs.rglob("*.json"))), "a record was written"
    assert not plan(load_suite("vl-quick"), str(shared_data)).missing_checkpoints()
    assert not any(offline.iterdir())
