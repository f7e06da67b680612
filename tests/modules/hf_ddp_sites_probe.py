"""Two gloo CPU processes train tiny ViT (image patches, by use_attention) and BART (cross-attention, padded
encoder mask, by the registration door) with fenchel under DistributedDataParallel with its default settings (no
find_unused_parameters) for two steps each; writes what rank 0 saw as JSON. Run by tests/modules/test_hf_ddp.py:
python -m tests.modules.hf_ddp_sites_probe OUT.json"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers

from modules.hf import FAMILIES, attention_terms, register, use_attention

VARIANT = "fenchel"


def build(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if family == "vit":
        return use_attention(transformers.ViTForImageClassification(FAMILIES["vit"].config()), VARIANT)
    return transformers.BartForConditionalGeneration._from_config(FAMILIES["bart"].config(), attn_implementation=f"attnbench-{VARIANT}")


def batch(family: str, data: torch.Generator) -> dict[str, torch.Tensor]:
    if family == "vit":
        return {"pixel_values": torch.randn(2, 3, 16, 16, generator=data), "labels": torch.tensor([0, 1])}
    ids = torch.randint(3, 60, (2, 7), generator=data)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0  # a padded encoder mask reaches the cross-attention
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(3, 60, (2, 5), generator=data)}


def worker(rank: int, world: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    seen = {}
    for family in ("vit", "bart"):
        model = build(family)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.5)
        data = torch.Generator().manual_seed(rank)  # each rank its own batches
        losses = []
        for _ in range(2):
            out_ = ddp(**batch(family, data))
            terms = attention_terms(model)
            loss = out_.loss if terms.loss is None else out_.loss + terms.loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss))
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        frozen = sorted(n for n, p in model.named_parameters() if not p.requires_grad)
        seen[family] = {"ranks_equal": all(torch.equal(gathered[0], g) for g in gathered), "losses": losses, "frozen": frozen}
    if rank == 0:
        Path(out).write_text(json.dumps(seen))
    dist.destroy_process_group()


def main(out: str) -> None:
    register(VARIANT)
    with tempfile.TemporaryDirectory() as folder:
        # fork: the children inherit the imports (torch, transformers) instead of paying for them again
        mp.start_processes(worker, args=(2, str(Path(folder) / "store"), out), nprocs=2, start_method="fork")


if __name__ == "__main__":
    main(sys.argv[1])
