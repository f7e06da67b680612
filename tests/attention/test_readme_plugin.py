"""The README's plugin example is what a new user copies first: it must pass `attnbench check` as written (issue 39)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_plugin_example_passes_check(tmp_path):
    readme = (REPO / "README.md").read_text()
    example = re.search(r"```python\n(# my_variant\.py\n.*?)```", readme, re.S).group(1)
    (tmp_path / "my_variant.py").write_text(example)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "harness.cli", "check", str(tmp_path / "my_variant.py")], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every property that ran holds" in done.stdout and " FAIL" not in done.stdout


def test_a_bf16_failure_says_what_to_change():
    import pytest

    from modules.attention.contract import check_bf16_autocast

    with pytest.raises(AssertionError) as caught:  # the README's example at a sharpening temperature fails, and says why
        check_bf16_autocast("fenchel", {"alpha": 8.0, "learn_alpha": False}, layouts=("dense",))
    message = str(caught.value)
    assert "What to change" in message and "float32" in message and "--precision 32" in message
