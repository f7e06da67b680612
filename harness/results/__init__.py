"""Results: where run records are written and read.

Enters: a finished (or failed, or dead) run from harness.run, as a `Record` (record.py).
Leaves: the `RecordStore` (store.py), one immutable JSON file per run key under <runs-dir>/records/, which
harness.report reads to build the boards and which `bench` consults to skip finished runs."""
