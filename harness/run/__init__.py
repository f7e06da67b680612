"""Running: a Plan's RunSpecs -> Records in the store.

Enters: RunSpecs from harness.plan.
Leaves: one Record per run, written to harness.results' store by the process that ran it (worker.py, the one
worker body), and a summary per run to whoever waits.

- runner.py: one run (seed -> DataModule + LightningModule -> fit -> test -> Record); callbacks.py its
  Lightning callbacks; distributed.py Lightning DDP for one run over several devices or nodes.
- worker.py: what a worker process does with specs, the same for both launchers:
- worker_pool.py: N local worker processes (one per GPU, or CPU cores split between them);
- job_array.py: a submitit job array (SLURM, or submitit's local executor) of shards of runs."""
