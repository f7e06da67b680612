"""The early-stopping rules against hand-worked sequences of validation metrics."""

import math

from modules.tasks.stopping import GATRule, MonitorRule


def run(rule, epochs):
    return [(d.save, d.stop) for d in map(rule.update, epochs)]


def test_gat_rule_resets_patience_when_either_metric_reaches_its_best_and_saves_when_both_do():
    rule = GATRule(patience=2)
    epochs = [
        {"val/loss": 1.0, "val/acc": 0.5},  # both best: save
        {"val/loss": 0.9, "val/acc": 0.4},  # loss best only: reset, no save
        {"val/loss": 0.95, "val/acc": 0.5},  # accuracy ties its best: reset, no save (loss is not at its best)
        {"val/loss": 0.9, "val/acc": 0.5},  # both tie their bests: save
        {"val/loss": 0.91, "val/acc": 0.49},  # neither: wait 1
        {"val/loss": 0.92, "val/acc": 0.3},  # neither: wait 2 = patience: stop
    ]
    assert run(rule, epochs) == [(True, False), (False, False), (False, False), (True, False), (False, False), (False, True)]


def test_gat_rule_never_counts_a_non_finite_loss_as_best():
    rule = GATRule(patience=1)
    assert run(rule, [{"val/loss": 1.0, "val/acc": 0.2}, {"val/loss": math.nan, "val/acc": 0.9}]) == [(True, False), (False, True)]
    assert rule.best_accuracy == 0.2


def test_monitor_rule_is_strict_and_stops_after_patience_epochs_without_improvement():
    rule = MonitorRule("val/loss", higher_is_better=False, patience=2)
    values = [1.0, 1.0, 0.5, 0.6, 0.7]
    assert run(rule, [{"val/loss": v} for v in values]) == [(True, False), (False, False), (True, False), (False, False), (False, True)]


def test_monitor_rule_stops_on_a_non_finite_value():
    rule = MonitorRule("val/acc", higher_is_better=True, patience=10)
    assert run(rule, [{"val/acc": 0.3}, {"val/acc": math.inf}]) == [(True, False), (False, True)]
