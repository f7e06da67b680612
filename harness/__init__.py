"""attnbench's harness, one sub-package per stage of the flow:

    plan/     suite YAML or command line -> Plan (RunSpecs with content-hash keys)
    run/      RunSpecs -> runs on local workers, submitit job arrays or DDP -> Records
    results/  the typed Record and the store of one JSON file per run
    report/   Plan + Records -> board, statistics -> leaderboards/<suite>.{md,csv,html}
    studies/  tune, scaling, perf, probe: beside the flow, built from it
    cli.py    the `attnbench` command; bench.py: plan -> run -> report for a suite"""

import warnings

# torch_geometric triggers torch's jit.script deprecation warning on import; it says nothing to our users.
warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=FutureWarning)
