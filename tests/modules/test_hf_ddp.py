"""DistributedDataParallel over a transformers model with a variant, with DDP's default settings: a kernel parameter
its site never reads (fenchel's degree coupling at token sequences) is declared frozen, so DDP does not wait for its
gradient (was: "Expected to have finished reduction in the prior iteration" at the second step)."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_two_gloo_processes_train_a_fenchel_model_two_steps(tmp_path):
    out = tmp_path / "ddp.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "tests.modules.hf_ddp_probe", str(out)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    seen = json.loads(out.read_text())
    assert seen["ranks_equal"] and seen["position_table_moved"] and len(seen["losses"]) == 2


def test_two_gloo_processes_train_fenchel_at_image_patches_and_cross_attention_with_ddp_defaults(tmp_path):
    """ViT's layers and BART's cross-attention never read fenchel's degree coupling (key-padding masks or none give
    every key the same degree): it is frozen there, so DDP's defaults run (was: "Expected to have finished
    reduction" at step 2, naming no parameter, even with a padded encoder mask)."""
    out = tmp_path / "ddp.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "tests.modules.hf_ddp_sites_probe", str(out)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    seen = json.loads(out.read_text())
    for family in ("vit", "bart"):
        assert seen[family]["ranks_equal"] and len(seen[family]["losses"]) == 2, family
    assert any("encoder_attn.attnbench_kernel.degree_weight" in name for name in seen["bart"]["frozen"])
    assert any("attention.attnbench_kernel.degree_weight" in name for name in seen["vit"]["frozen"])
