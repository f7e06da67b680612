"""Tuned parameters: where `attnbench tune` leaves a variant's best parameters, how they are promoted to the
committed folder, and where planning picks them up.

`tune` writes into the runs folder (`<runs-dir>/params/<task>/<variant>.yaml`, beside its Optuna study), never
into `leaderboards/params/`: a quick 1-trial try must not replace a committed 20-trial result. Promoting is the
explicit step `attnbench tune ... --promote`, which refuses to replace a result from a larger budget unless
forced. Every file records its study's budget (finished trials and the task's epoch budget) so that
`bench --params tuned` can say when a suite runs another budget than the one the parameters were tuned at.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import yaml

DEFAULT_ROOT = "leaderboards/params"
"""The committed, promoted parameters (`bench --params tuned` reads them by default)."""
RUNS_SUBDIR = "params"
"""Under the runs folder: what `tune` wrote, not promoted yet."""
BUDGET_KEYS = ("max_epochs", "patience")
"""Task parameters that bound a trial's training: with the trial count, a study's budget."""


class PromotionRefused(ValueError):
    """Promoting would replace a result tuned with a larger budget; the message names both budgets and --force."""


def tuned_path(task: str, variant: str, root: str | Path = DEFAULT_ROOT) -> Path:
    return Path(root) / task / f"{variant}.yaml"


def runs_params_dir(runs: str | Path) -> Path:
    return Path(runs) / RUNS_SUBDIR


def load_tuned(task: str, variant: str, root: str | Path = DEFAULT_ROOT) -> dict[str, Any] | None:
    path = tuned_path(task, variant, root)
    if not path.is_file():
        return None
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or data.get("variant") != variant or not isinstance(data.get("attention"), dict):
        raise ValueError(f"{path} is not a tuned-parameters file of {task} x {variant}; re-run `attnbench tune {task} {variant}`")
    return data


def study_budget(finished_trials: int, task_params: Mapping[str, Any]) -> dict[str, Any]:
    """What a params file records as its study's budget."""
    return {"trials": int(finished_trials), **{k: task_params[k] for k in BUDGET_KEYS if k in task_params}}


def budget_of(data: Mapping[str, Any]) -> dict[str, Any]:
    """A params file's budget; files written before budgets were recorded give only their trial count."""
    if isinstance(data.get("budget"), dict):
        return dict(data["budget"])
    trials = (data.get("tuning") or {}).get("trials") or {}
    return {"trials": int(trials.get("complete", 0)) + int(trials.get("pruned", 0))} if isinstance(trials, dict) else {}


def budget_text(budget: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in budget.items()) or "no budget recorded"


def budget_mismatch(data: Mapping[str, Any], task_params: Mapping[str, Any]) -> str | None:
    """Why tuned parameters may not carry over to a plan's task parameters (another epoch budget), or None."""
    budget = budget_of(data)
    if not any(k in budget for k in BUDGET_KEYS):
        return "tuned before budgets were recorded (its epochs are unknown)"
    differing = [f"{k}={budget[k]} (the suite: {task_params[k]})" for k in BUDGET_KEYS
                 if k in budget and k in task_params and budget[k] != task_params[k]]
    return f"tuned with {', '.join(differing)}" if differing else None


def larger_budget(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The parts of `old`'s budget that exceed `new`'s (empty: `new` is at least as large everywhere both know)."""
    return [f"{k}: {old[k]} > {new[k]}" for k in ("trials", *BUDGET_KEYS)
            if isinstance(old.get(k), int) and isinstance(new.get(k), int) and old[k] > new[k]]


def promote(task: str, variant: str, source_root: str | Path, target_root: str | Path = DEFAULT_ROOT, force: bool = False) -> Path:
    """Copy `tune`'s result into the committed folder (atomic rename), unless that holds a result from a larger
    budget and `force` is not given."""
    source = tuned_path(task, variant, source_root)
    new = load_tuned(task, variant, source_root)
    if new is None:
        raise ValueError(f"no tuned parameters of {task} x {variant} in {source_root}: run `attnbench tune {task} {variant}` first")
    old = load_tuned(task, variant, target_root)
    target = tuned_path(task, variant, target_root)
    if old is not None and not force:
        larger = larger_budget(budget_of(old), budget_of(new))
        if larger:
            raise PromotionRefused(
                f"{target} was tuned with a larger budget ({budget_text(budget_of(old))}) than {source} "
                f"({budget_text(budget_of(new))}; {'; '.join(larger)}); not replaced. Tune with at least that budget, "
                "or add --force to replace it anyway")
    target.parent.mkdir(parents=True, exist_ok=True)
    # a temp file of its own (not target.tmp): processes sharing a study may promote at the same moment
    fd, temporary = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".tmp", dir=target.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(source.read_text())
    os.replace(temporary, target)
    return target
