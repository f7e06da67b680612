"""Two gloo CPU processes train a tiny BERT with fenchel under DistributedDataParallel with its default settings
(no find_unused_parameters) for two steps, through the registration door; writes what rank 0 saw as JSON.
Run by tests/modules/test_hf_ddp.py: python -m tests.modules.hf_ddp_probe OUT.json"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers

from modules.hf import FAMILIES, attention_terms, kernels, register

VARIANT = "fenchel"


def worker(rank: int, world: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_config(FAMILIES["bert"].config(), attn_implementation=f"attnbench-{VARIANT}")
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.5)
    table = kernels(model)[0].position_bias.weight
    before = table.detach().clone()
    data = torch.Generator().manual_seed(rank)  # each rank its own batches
    losses = []
    for _ in range(2):
        out_ = ddp(input_ids=torch.randint(3, 60, (2, 6), generator=data), labels=torch.tensor([0, 1]))
        terms = attention_terms(model)
        loss = out_.loss if terms.loss is None else out_.loss + terms.loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    if rank == 0:
        Path(out).write_text(json.dumps({"ranks_equal": all(torch.equal(gathered[0], g) for g in gathered),
                                         "position_table_moved": not torch.equal(before, table.detach()), "losses": losses}))
    dist.destroy_process_group()


def main(out: str) -> None:
    register(VARIANT)
    with tempfile.TemporaryDirectory() as folder:
        # fork: the children inherit the imports (torch, transformers) instead of paying for them again
        mp.start_processes(worker, args=(2, str(Path(folder) / "store"), out), nprocs=2, start_method="fork")


if __name__ == "__main__":
    main(sys.argv[1])
