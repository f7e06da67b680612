"""Studies beside the main flow, built from its parts.

- tune.py: Optuna studies per (task, variant) on validation data; writes the best parameters that
  `bench --params tuned` plans (harness/plan/tuned.py).
- scaling.py: a suite run with 1, 2, ... workers, and the speed-up.
- perf.py: forward+backward time of every variant relative to softmax.
- probe.py: probes of a pretrained model's attention (the Fenchel-duality paper's figure on MiniLM)."""
