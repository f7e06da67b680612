"""Grid features of images from a frozen timm encoder, computed once and cached.

The BAM and alignment papers run captioning and VQA on precomputed, frozen image features; so does
attnbench, which also makes every variant see the same image features. `weights="pretrained"` loads
timm's ImageNet weights (needs the network, or a filled Hugging Face / torch hub cache);
`weights="random"` is a fixed random initialisation (seed 0, independent of the run seed), the offline
default: features are then the same on every run and machine with the same torch and timm.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch
from PIL import Image
from torch import Tensor, nn

from datamodules.paths import MissingDataError, load_or_build

WEIGHTS = ("random", "pretrained")
ENCODER_SEED = 0


class MissingWeightsError(RuntimeError):
    """Pretrained image-encoder weights were asked for and could not be loaded."""


@dataclass(frozen=True)
class ImageEncoderSpec:
    backbone: str = "resnet18"
    """Any timm model that supports features_only=True."""
    weights: str = "random"
    image_size: int = 224
    """Images are resized (not cropped, so no object leaves the frame) to image_size x image_size."""
    stage: int = -1
    """Which feature stage gives the grid (timm out_indices; -1 = the last, stride 32)."""

    def __post_init__(self):
        if self.weights not in WEIGHTS:
            raise ValueError(f"image weights must be one of {WEIGHTS}, got {self.weights!r}")


def create_image_encoder(spec: ImageEncoderSpec) -> nn.Module:
    import timm

    if spec.backbone not in timm.list_models():
        close = timm.list_models(f"*{spec.backbone}*")[:8]
        raise ValueError(f"unknown timm backbone {spec.backbone!r}" + (f"; did you mean one of {close}?" if close else ""))
    stage = spec.stage if spec.stage >= 0 else len(timm.create_model(spec.backbone, features_only=True, pretrained=False).feature_info) - 1
    if spec.weights == "pretrained":
        try:
            encoder = timm.create_model(spec.backbone, pretrained=True, features_only=True, out_indices=(stage,))
        except Exception as exc:  # timm raises whatever the hub client raises offline
            raise MissingWeightsError(
                f"could not load pretrained weights for timm model {spec.backbone!r} ({type(exc).__name__}: {exc}). "
                "Go online once (or fill $HF_HOME with them), or run with --set image_weights=random"
            ) from exc
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(ENCODER_SEED)
            encoder = timm.create_model(spec.backbone, pretrained=False, features_only=True, out_indices=(stage,))
    return encoder.eval().requires_grad_(False)


def image_transform(encoder: nn.Module, spec: ImageEncoderSpec):
    from torchvision import transforms

    config = getattr(encoder, "pretrained_cfg", {}) or {}
    mean, std = config.get("mean", (0.485, 0.456, 0.406)), config.get("std", (0.229, 0.224, 0.225))
    return transforms.Compose([
        transforms.Resize((spec.image_size, spec.image_size), antialias=True),
        transforms.ToTensor(),
        transforms.Normalize(mean, std),
    ])


def feature_width(encoder: nn.Module) -> int:
    return int(encoder.feature_info.channels()[-1])


@torch.no_grad()
def grid_features(encoder: nn.Module, images: Tensor) -> Tensor:
    """[B, 3, H, W] -> [B, h*w, C] grid tokens (row-major)."""
    grid = encoder(images)[-1]
    return grid.flatten(2).transpose(1, 2)


def _fingerprint(paths: Sequence[Path], spec: ImageEncoderSpec) -> str:
    import timm

    digest = hashlib.sha256(repr((asdict(spec), timm.__version__, torch.__version__)).encode())
    for path in paths:
        # Name, size and mtime rather than the bytes: hashing a full COCO image folder would take minutes.
        stat = os.stat(path)
        digest.update(f"{Path(path).resolve()}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:24]


def cached_grid_features(paths: Sequence[str | Path], spec: ImageEncoderSpec, cache_root: Path, *, batch_size: int = 32) -> Tensor:
    """Grid features [N, h*w, C] (float16) of the images at `paths`, in that order, from the cache or
    computed once (parallel workers wait for one another instead of computing twice)."""
    paths = [Path(p) for p in paths]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise MissingDataError(f"{len(missing)} image file(s) are missing, e.g. {missing[:3]}")
    path = cache_root / "image_features" / f"{spec.backbone}-{_fingerprint(paths, spec)}.pt"

    def build() -> Tensor:
        encoder = create_image_encoder(spec)
        transform = image_transform(encoder, spec)
        chunks = []
        for start in range(0, len(paths), batch_size):
            batch = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths[start : start + batch_size]])
            chunks.append(grid_features(encoder, batch).to(torch.float16))
        return torch.cat(chunks)

    return load_or_build(path, build)
