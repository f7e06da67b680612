"""Shared-filesystem-safe caches (issue #18): unique temp names, lock timeouts naming the lock file, memory-
mapped loads; the image-feature fingerprint does not stat every image; pretrained weights checked up front."""

from __future__ import annotations

import os

import pytest
import torch
from filelock import FileLock

from datamodules import image_features, paths


def test_a_held_lock_times_out_with_a_message_naming_the_lock_file(tmp_path):
    target = tmp_path / "features.pt"
    lock = str(target) + ".lock"
    holder = FileLock(lock)  # another process building the entry (or a dead one's leftover)
    holder.acquire()
    try:
        os.environ[paths.LOCK_TIMEOUT_ENV] = "0.2"
        with pytest.raises(paths.CacheLockTimeout, match="features.pt.lock") as raised:
            paths.load_or_build(target, lambda: torch.zeros(2))
        # the environment's 0.2 s was the wait (the default is an hour), read from the message, not from a clock
        assert "waited 0 s" in str(raised.value)
        assert f"delete {lock}" in str(raised.value) and paths.LOCK_TIMEOUT_ENV in str(raised.value)
    finally:
        os.environ.pop(paths.LOCK_TIMEOUT_ENV, None)
        holder.release()
    assert torch.equal(paths.load_or_build(target, lambda: torch.arange(3)), torch.arange(3))


def test_build_writes_through_a_unique_temp_file_and_loads_memory_mapped(tmp_path):
    target = tmp_path / "cache" / "x.pt"
    names = {paths.unique_temp_path(target).name for _ in range(20)}
    assert len(names) == 20 and all(n.startswith("x.pt.") and n.endswith(".tmp") for n in names)
    built = paths.load_or_build(target, lambda: torch.arange(6.0).view(2, 3), mmap=True)
    assert torch.equal(built, torch.arange(6.0).view(2, 3))
    assert [p.name for p in target.parent.iterdir()] == ["x.pt.lock", "x.pt"] or sorted(p.name for p in target.parent.iterdir()) == ["x.pt", "x.pt.lock"]
    again = paths.load_or_build(target, lambda: pytest.fail("rebuilt a cached entry"), mmap=True)
    assert torch.equal(again, built)


def test_fingerprint_stats_a_sample_and_sees_added_images(tmp_path, monkeypatch):
    folder = tmp_path / "images"
    folder.mkdir()
    images = []
    for i in range(2000):
        images.append(folder / f"{i}.jpg")
        images[-1].write_bytes(b"x")
    spec = image_features.ImageEncoderSpec()
    stats = []
    real_stat = os.stat
    import timm  # noqa: F401 - imported before counting: its own imports stat files

    monkeypatch.setattr(image_features.os, "stat", lambda p, *a, **k: stats.append(p) or real_stat(p, *a, **k))
    first = image_features._fingerprint(images, spec)
    assert len([p for p in stats if str(p).startswith(str(tmp_path))]) <= image_features.FINGERPRINT_SAMPLE + 10  # not 2000
    stats.clear()
    assert image_features._fingerprint(images, spec) == first and not stats  # memoised in the process
    assert image_features._fingerprint(images[:-1], spec) != first  # a different image list, a different key


def test_pretrained_weights_problem_names_the_model_the_cache_and_the_fix(monkeypatch, tmp_path):
    """Offline with an empty cache: the message says which weights, the folder looked in and how to fetch them."""
    import socket

    from huggingface_hub import constants

    assert image_features.pretrained_weights_problem("resnet18", "random") is None
    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(socket.socket, "connect", lambda *a, **k: pytest.fail(f"a network connection was attempted: {a}"))
    problem = image_features.pretrained_weights_problem("resnet18", "pretrained")
    assert "'resnet18'" in problem and str(cache) in problem and "timm/resnet18" in problem
    assert "timm.create_model('resnet18', pretrained=True)" in problem and "--set image_weights=random" in problem
    assert not cache.exists() or not any(cache.iterdir())
