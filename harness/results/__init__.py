"""Results: where run records are written and read, and how they move between machines.

Enters: a finished (or failed, or dead) run from harness.run, as a `Record` (record.py).
Leaves: the `RecordStore` (store.py), one immutable JSON file per run key under <runs-dir>/records/, which
harness.report reads to build the boards and which `bench` consults to skip finished runs. exchange.py moves
records between stores (`attnbench results export/import`): identical records merge, different ones under the
same key are kept as conflicts under records/conflicts/, never overwritten."""
