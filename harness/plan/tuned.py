"""Where `attnbench tune` leaves a variant's best parameters and where planning picks them up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEFAULT_ROOT = "leaderboards/params"


def tuned_path(task: str, variant: str, root: str | Path = DEFAULT_ROOT) -> Path:
    return Path(root) / task / f"{variant}.yaml"


def load_tuned(task: str, variant: str, root: str | Path = DEFAULT_ROOT) -> dict[str, Any] | None:
    path = tuned_path(task, variant, root)
    if not path.is_file():
        return None
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or data.get("variant") != variant or not isinstance(data.get("attention"), dict):
        raise ValueError(f"{path} is not a tuned-parameters file of {task} x {variant}; re-run `attnbench tune {task} {variant}`")
    return data
