import shutil

import pytest
import torch

from datamodules.paths import MissingDataError
from datamodules.planetoid import PlanetoidDataModule, load_graph, raw_file_names


@pytest.mark.parametrize("name, nodes, features, classes", [("cora", 2708, 1433, 7), ("citeseer", 3327, 3703, 6)])
def test_public_split_from_local_files(shared_data, tmp_path, name, nodes, features, classes):
    dm = PlanetoidDataModule(name, str(shared_data), str(tmp_path / "cache"))
    dm.setup()
    g = dm.graph
    assert g.num_nodes == nodes and dm.num_features == features and dm.num_classes == classes
    assert (int(g.train_mask.sum()), int(g.val_mask.sum()), int(g.test_mask.sum())) == (20 * classes, 500, 1000)
    assert g.x.is_sparse
    rows = torch.sparse.sum(g.x, dim=1).to_dense()
    nonzero = rows > 0
    torch.testing.assert_close(rows[nonzero], torch.ones(int(nonzero.sum())))  # row-normalised features


def test_data_root_is_never_written(shared_data, tmp_path):
    raw = shared_data / "planetoid" / "Cora"
    before = sorted(p.relative_to(raw) for p in raw.rglob("*"))
    load_graph.cache_clear()
    load_graph("cora", str(shared_data), str(tmp_path / "cache"))
    assert sorted(p.relative_to(raw) for p in raw.rglob("*")) == before
    assert (tmp_path / "cache" / "planetoid" / "Cora" / "processed").is_dir()


def test_missing_files_are_named(shared_data, tmp_path):
    root = tmp_path / "data"
    target = root / "planetoid" / "Cora" / "raw"
    target.mkdir(parents=True)
    for f in raw_file_names("cora")[:5]:
        shutil.copy(shared_data / "planetoid" / "Cora" / "raw" / f, target / f)
    load_graph.cache_clear()
    with pytest.raises(MissingDataError) as info:
        load_graph("cora", str(root), str(tmp_path / "cache"))
    for f in raw_file_names("cora")[5:]:
        assert f in str(info.value)
    assert "ATTNBENCH_DATA" in str(info.value)


def test_corrupt_file_is_reported(shared_data, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(shared_data / "planetoid" / "Cora", root / "planetoid" / "Cora")
    victim = root / "planetoid" / "Cora" / "raw" / "ind.cora.graph"
    victim.write_bytes(victim.read_bytes()[:100])
    load_graph.cache_clear()
    with pytest.raises(MissingDataError, match="ind.cora.graph.*do not match"):
        load_graph("cora", str(root), str(tmp_path / "cache"))
