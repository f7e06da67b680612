"""Tasks (datamodule + host model + metrics + budget), registered on import; plugins via the
entry-point group `attnbench.tasks` or --plugin FILE.py."""

from .base import TASKS, Metric, Task, TrainParams, TrivialBaseline, get_task, list_tasks, register_task

from . import captioning, planetoid, text, vqa  # noqa: F401,E402

__all__ = ["TASKS", "Metric", "Task", "TrainParams", "TrivialBaseline", "get_task", "list_tasks", "register_task"]
