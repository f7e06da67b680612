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
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise MissingWeightsError(
                f"image_weights=pretrained: could not load timm's ImageNet weights for {spec.backbone!r} from {weights_cache(spec.backbone)} "
                f"nor download them ({type(exc).__name__}{': ' + reason if reason else ''}); fetch them once online "
                f"(python -c \"import timm; timm.create_model('{spec.backbone}', pretrained=True)\"), or run with --set image_weights=random"
            ) from exc
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(ENCODER_SEED)
            encoder = timm.create_model(spec.backbone, pretrained=False, features_only=True, out_indices=(stage,))
    return encoder.eval().requires_grad_(False)


def weights_cache(backbone: str) -> str:
    """Where timm looks for `backbone`'s pretrained weights, for a message that says which folder to fill: the
    Hugging Face cache for the models timm publishes on the Hub (its first choice), else torch hub's folder."""
    import timm
    from huggingface_hub import constants

    config = timm.models.get_pretrained_cfg(backbone)
    if config is not None and config.hf_hub_id:
        return f"the Hugging Face cache ({constants.HF_HUB_CACHE}, as {config.hf_hub_id})"
    return f"torch hub's checkpoint folder ({Path(torch.hub.get_dir()) / 'checkpoints'})"


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


FINGERPRINT_SAMPLE = 256
_fingerprints: dict[tuple, str] = {}


def _fingerprint(paths: Sequence[Path], spec: ImageEncoderSpec) -> str:
    """The cache key of a feature file: the spec, the library versions, every image's path, and the size and
    mtime of the folders holding them and of an evenly spread sample of FINGERPRINT_SAMPLE images. Statting
    all of them cost 123k stats per call on COCO (slow on a shared filesystem); adding, removing or renaming
    an image changes its folder's mtime, and a replaced image is caught when sampled. Memoised per process."""
    import timm

    memo_key = (tuple(str(p) for p in paths), spec)
    if memo_key in _fingerprints:
        return _fingerprints[memo_key]
    # One listing per folder instead of a stat per image: two calls for COCO's 123k images.
    listings = {folder: set(os.listdir(folder)) if os.path.isdir(folder) else set() for folder in {str(Path(p).parent) for p in paths}}
    missing = [str(p) for p in paths if Path(p).name not in listings[str(Path(p).parent)]]
    if missing:
        raise MissingDataError(f"{len(missing)} image file(s) are missing, e.g. {missing[:3]}")
    digest = hashlib.sha256(repr((asdict(spec), timm.__version__, torch.__version__)).encode())
    for path in paths:
        digest.update(f"{path}\n".encode())
    folders = sorted({str(Path(p).parent) for p in paths})
    step = max(1, -(-len(paths) // FINGERPRINT_SAMPLE))
    for item in [*folders, *(str(p) for p in paths[::step])]:
        stat = os.stat(item)
        digest.update(f"{item}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    _fingerprints[memo_key] = digest.hexdigest()[:24]
    return _fingerprints[memo_key]


def feature_device() -> torch.device:
    """Where features are extracted: this worker's GPU when it has one (a worker sees only its own)."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def cached_grid_features(paths: Sequence[str | Path], spec: ImageEncoderSpec, cache_root: Path, *, batch_size: int | None = None) -> Tensor:
    """Grid features [N, h*w, C] (float16) of the images at `paths`, in that order, from the cache or
    computed once (parallel workers wait for one another instead of computing twice), on this worker's GPU
    when it has one. The file is memory-mapped, not read: COCO's are ~25 GB, and 8 workers each loading
    theirs would need ~200 GB of RAM; mapped, the page cache holds one copy for the node."""
    paths = [Path(p) for p in paths]
    path = cache_root / "image_features" / f"{spec.backbone}-{_fingerprint(paths, spec)}.pt"

    def build() -> Tensor:
        device = feature_device()
        encoder = create_image_encoder(spec).to(device)
        transform = image_transform(encoder, spec)
        size = batch_size or (128 if device.type == "cuda" else 32)
        chunks = []
        for start in range(0, len(paths), size):
            batch = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths[start : start + size]])
            chunks.append(grid_features(encoder, batch.to(device, non_blocking=True)).to(torch.float16).cpu())
        return torch.cat(chunks)

    return load_or_build(path, build, mmap=True)


def pretrained_weights_problem(backbone: str, weights: str) -> str | None:
    """A vision-language task's checkpoint_problem (modules/tasks/base.py): None unless pretrained weights were
    asked for and do not load (offline without a filled cache), in which case which model, the cache looked in
    and how to fetch them. Checked before any run, or every vl-paper run would fail on its own, one after
    another, on an offline node; not a data problem, so a dry run still lists the runs it blocks."""
    if weights != "pretrained":
        return None
    try:
        create_image_encoder(ImageEncoderSpec(backbone, weights))
    except MissingWeightsError as exc:
        return str(exc)
    return None
