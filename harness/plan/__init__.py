"""Planning: what will run, decided once per command before anything runs.

Enters: a suite (harness/suites/*.yaml, or a path) or one task x variant from the command line, the data
root, and tuned parameters from `attnbench tune` (leaderboards/params/<task>/<variant>.yaml).
Leaves: a `Plan` (planner.py): every run as a `RunSpec` with its content-hash key (spec.py), the data
checked once per task, the attention configs resolved once, each task's metrics. harness.run executes
its specs; harness.report renders the same plan with the records the runs left."""
