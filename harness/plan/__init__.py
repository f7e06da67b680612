"""Planning: what will run, decided once per command before anything runs.

Enters: a suite (harness/suites/*.yaml, or a path) or one task x variant from the command line, the data
root, and tuned parameters from `attnbench tune` (leaderboards/params/<task>/<variant>.yaml).
Leaves: a `Plan` (planner.py): every run as a `RunSpec` with its content-hash key (spec.py), the data
checked once per task, the attention configs resolved once, each task's metrics. harness.run executes
its specs; harness.report renders the same plan with the records the runs left."""


PRECISIONS = ("32", "bf16-mixed", "16-mixed")
"""Lightning Trainer precisions a run can use (`--precision`); "32" is the default and every older record's.
Here rather than in spec.py so that the command line offers them without importing torch."""
