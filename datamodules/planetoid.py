"""Planetoid citation graphs (Cora, CiteSeer, PubMed) with the public split of Yang et al. 2016."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import lightning as L
import torch
from torch_geometric.data import Data
from torch_geometric.datasets import Planetoid
from torch_geometric.transforms import NormalizeFeatures

from .paths import MissingDataError, cache_dir, cache_lock, data_root, download_problem, sha256_of

NAMES = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
RAW_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")

# sha256 of the files in github.com/kimiyoung/planetoid data/ (the files PyG downloads), so that a
# truncated or altered copy is reported instead of silently training on it.
RAW_SHA256 = {
    "ind.cora.allx": "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543",
    "ind.cora.ally": "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71",
    "ind.cora.graph": "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d",
    "ind.cora.test.index": "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875",
    "ind.cora.tx": "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a",
    "ind.cora.ty": "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad",
    "ind.cora.x": "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab",
    "ind.cora.y": "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1",
    "ind.citeseer.allx": "2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668",
    "ind.citeseer.ally": "f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95",
    "ind.citeseer.graph": "d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7",
    "ind.citeseer.test.index": "2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4",
    "ind.citeseer.tx": "539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21",
    "ind.citeseer.ty": "55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce",
    "ind.citeseer.x": "d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6",
    "ind.citeseer.y": "8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924",
    "ind.pubmed.allx": "508e538e2abdccdd54c4d3e9f49d638b4af7107d85845f66ddea5a5152658b7e",
    "ind.pubmed.ally": "0c37bbe3b5014ec365e9d393cf4791925e5ed94fb194305d74f064a8d7b50f0e",
    "ind.pubmed.graph": "5b89f0036ca22909471f1e6558eb42fa06e0c730a577bde5b058b40638f81dc9",
    "ind.pubmed.test.index": "b101d421688bbaecbd82e8a18f1e282378d6830f3a37666f28ebc47f844341b5",
    "ind.pubmed.tx": "4eb5f5d0f30f26497eb0ac6ac9719d09c67e284f1ed0385c93f3ef27a671da3d",
    "ind.pubmed.ty": "ee2e0d4819d9fbcc403689c3bf2e49face401b605932f093bc58ab6461130fdd",
    "ind.pubmed.x": "fbe9cb5c47200d1b7769a26e579be3b7130b556831f9d850e77c4c74f2599b33",
    "ind.pubmed.y": "e6c807633307a07ed659249006536a147c7999c797f11a2560752990181b41b3",
}


def raw_file_names(name: str) -> list[str]:
    return [f"ind.{name}.{part}" for part in RAW_PARTS]


def local_raw_dir(root: Path, name: str) -> Path:
    """Accept both <root>/planetoid/<Name>/raw (the layout of ../shared/data) and <root>/<Name>/raw."""
    for candidate in (root / "planetoid" / NAMES[name] / "raw", root / NAMES[name] / "raw"):
        if candidate.is_dir():
            return candidate
    return root / "planetoid" / NAMES[name] / "raw"


def _incomplete_copy(name: str, root: Path) -> str | None:
    """Where the data root holds the set under another folder name (../shared/data's `PubMed_missing_allx`, named so
    that PyG does not try to download the rest): which of the files are there and which lack, so that the reason a
    task is skipped names the one missing file rather than the whole set."""
    files = raw_file_names(name)
    for folder in sorted((root / "planetoid").glob(f"{NAMES[name]}*/raw")) if (root / "planetoid").is_dir() else ():
        present = [f for f in files if (folder / f).is_file()]
        if present:
            lacking = [f for f in files if f not in present]
            return (f"{NAMES[name]}: the data root's {folder.parent.relative_to(root)}/ holds {len(present)} of its {len(files)} "
                    f"raw Planetoid files and lacks {', '.join(lacking)}; with {'it' if len(lacking) == 1 else 'them'} there "
                    f"(github.com/kimiyoung/planetoid, data/), rename the folder to planetoid/{NAMES[name]}, or point "
                    f"--data-root or ATTNBENCH_DATA at a root that has all {len(files)}.")
    return None


def check_raw_files(name: str, root: Path) -> Path:
    """The folder of `name`'s raw files under `root`; MissingDataError naming each missing or corrupt file."""
    raw = local_raw_dir(root, name)
    files = raw_file_names(name)
    missing = [f for f in files if not (raw / f).is_file()]
    if missing:
        near = _incomplete_copy(name, root) if not raw.is_dir() else None
        if near:
            raise MissingDataError(near)
        raise MissingDataError(
            f"{NAMES[name]}: missing {', '.join(missing)} in {raw}. Put the eight Planetoid files "
            f"ind.{name}.{{{','.join(RAW_PARTS)}}} (github.com/kimiyoung/planetoid, data/) there, or point at a data "
            f"root that has them (--data-root or ATTNBENCH_DATA); with neither set, PyG downloads them when online."
        )
    corrupt = [f for f in files if sha256_of(raw / f) != RAW_SHA256[f]]
    if corrupt:
        raise MissingDataError(
            f"{NAMES[name]}: {', '.join(corrupt)} in {raw} do not match the published Planetoid files "
            f"(sha256 differs: truncated or altered). Replace them with fresh copies of github.com/kimiyoung/planetoid data/."
        )
    return raw


def data_available(name: str, root: str | Path | None = None) -> str | None:
    """None if the task can load; else the reason it cannot (for suites that skip absent optional data)."""
    resolved = data_root(root)
    if resolved is None:  # PyG downloads on first use: the files must be in the cache already, or reachable
        cached = cache_dir() / "planetoid" / NAMES[name] / "raw"
        if all((cached / f).is_file() for f in raw_file_names(name)):
            return None
        return download_problem(f"{NAMES[name]} (Planetoid)", "github.com", f"planetoid/{NAMES[name]}/raw/ind.{name}.*")
    try:
        check_raw_files(name, resolved)
    except MissingDataError as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=4)
def load_graph(name: str, root: str | None = None, cache: str | None = None) -> Data:
    """The processed graph, cached per process so that a worker running many seeds loads it once."""
    if name not in NAMES:
        raise ValueError(f"unknown Planetoid data set {name!r}; choose one of {sorted(NAMES)}")
    work_root = cache_dir(cache) / "planetoid"
    work_root.mkdir(parents=True, exist_ok=True)
    source = data_root(root)
    # Several worker processes may load the same graph at once; PyG's processing is not safe for that.
    with cache_lock(work_root / f"{NAMES[name]}.lock"):
        target = work_root / NAMES[name] / "raw"
        drop_stale_cache(name, target)
        if source is not None:
            raw = check_raw_files(name, source)
            target.mkdir(parents=True, exist_ok=True)
            for f in raw_file_names(name):
                if not (target / f).is_file():
                    shutil.copyfile(raw / f, target / f)
        try:
            dataset = Planetoid(str(work_root), NAMES[name], split="public", transform=NormalizeFeatures())
        except Exception as exc:  # offline download failure, unreadable pickle, ...
            raise MissingDataError(
                f"{NAMES[name]}: could not load Planetoid data into {work_root} ({type(exc).__name__}: {exc}). "
                f"Offline, set ATTNBENCH_DATA (or --data-root) to a folder holding planetoid/{NAMES[name]}/raw/."
            ) from exc
        # A download (no data root) is checked too: PyG does not verify what it fetched.
        check_raw_files(name, work_root)
    return dataset[0]


def drop_stale_cache(name: str, cached_raw: Path) -> None:
    """Remove cached raw files whose sha256 is not the published one (a truncated copy or download), and the
    processed graph with them, since it may have been built from them; they are then copied from the data root
    or downloaded again. Without this a truncated cached file would be processed as if it were whole."""
    stale = [f for f in raw_file_names(name) if (cached_raw / f).is_file() and sha256_of(cached_raw / f) != RAW_SHA256[f]]
    for f in stale:
        (cached_raw / f).unlink()
    if stale:
        shutil.rmtree(cached_raw.parent / "processed", ignore_errors=True)


class WholeGraph:
    """The graph as the one batch of every epoch, iterated by Lightning as it iterates a DataLoader. Not a
    DataLoader: its iterator draws a seed from the global generator and reads it on the host each time an epoch
    starts it (twice an epoch, training and validation), for workers and a sampler that a one-graph loader has
    none of. Not a list either, which Lightning takes for a collection of loaders. Under DDP every rank gets the
    whole graph, as the DistributedSampler's repeat gave it (`NodeClassificationModule._own_share`)."""

    def __init__(self, graph: Data):
        self.graph = graph

    def __iter__(self):
        yield self.graph

    def __len__(self) -> int:
        return 1


class PlanetoidDataModule(L.LightningDataModule):
    """Full-batch transductive node classification: every loader yields the whole graph once; the
    train/val/test masks pick the nodes that count."""

    def __init__(self, name: str, data_root: str | None = None, cache_dir: str | None = None):
        super().__init__()
        self.name = name
        self.data_root = data_root
        self.cache_dir = cache_dir
        self.graph: Data | None = None

    def prepare_data(self) -> None:
        load_graph(self.name, self.data_root, self.cache_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.graph is None:
            graph = load_graph(self.name, self.data_root, self.cache_dir).clone()
            # Planetoid features are ~1% non-zero: a sparse input makes input dropout and the first
            # projection ~10x cheaper than on the dense matrix (DESIGN.md section 7).
            graph.x = graph.x.to_sparse_coo().coalesce()
            self.graph = graph

    @property
    def num_features(self) -> int:
        self.setup()
        return self.graph.num_node_features

    @property
    def num_classes(self) -> int:
        self.setup()
        return int(self.graph.y.max()) + 1

    def _loader(self) -> WholeGraph:
        self.setup()
        return WholeGraph(self.graph)

    def train_dataloader(self) -> WholeGraph:
        return self._loader()

    def val_dataloader(self) -> WholeGraph:
        return self._loader()

    def test_dataloader(self) -> WholeGraph:
        return self._loader()
