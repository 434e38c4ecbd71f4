"""Data-quality scenarios (FedProf §5): some clients' training data is corrupted, by kind,
deterministically from the run seed after partitioning. Test splits are never touched.

``client-noise`` is a comma list ``kind:fraction``; round(fraction · N) clients get each
kind, drawn without overlap from a permutation of the partition ids seeded by ``seed``.

Image kinds (arrays of uint8, (n, C, H, W)):
- ``irrelevant``: every image replaced by structured noise that carries no class
  information: uniform noise on a 7×7 grid, upsampled to the image size (blobs with the
  image's value range), one fresh pattern per image; labels are kept, so they are wrong.
- ``blur``: Gaussian blur with σ = 1.5 pixels on every channel.
- ``salt-pepper``: a density of 0.3 of the pixels set to 0 or 255, half each.
Tabular kinds (standardized float features):
- ``polluted``: every feature replaced by a value drawn uniformly from [−5, 5] standard
  deviations, independent of the target (a sensor sending invalid readings).
- ``noisy``: Gaussian noise of one standard deviation added to every reading.

``client-transform`` is another scenario: a comma list ``partition:kind`` that changes the
named clients' train AND test images alike (a device whose data comes from another domain,
LG-FedAvg's rotated MNIST, Table 3). Kinds: ``rotate90``, ``rotate180``, ``rotate270``
(counter-clockwise, square images of any data set) and ``hflip``.
"""

from __future__ import annotations

import numpy as np
from headway.core import seeds

IMAGE_KINDS = ("irrelevant", "blur", "salt-pepper")
TABULAR_KINDS = ("polluted", "noisy")
KINDS = IMAGE_KINDS + TABULAR_KINDS
TRANSFORMS = {"rotate90": 1, "rotate180": 2, "rotate270": 3, "hflip": 0}  # kind -> quarter turns (hflip: none, a mirror)
SALT_PEPPER_DENSITY = 0.3
BLUR_SIGMA = 1.5


def parse_client_noise(text: str) -> list[tuple[str, float]]:
    """``"irrelevant:0.15,blur:0.2"`` -> [("irrelevant", 0.15), ("blur", 0.2)], checked."""
    out: list[tuple[str, float]] = []
    for item in (p.strip() for p in str(text).split(",")):
        if not item:
            continue
        kind, sep, share = item.partition(":")
        kind = kind.strip()
        if not sep or kind not in KINDS:
            raise ValueError(f"client-noise item {item!r}: expected kind:fraction with kind one of {', '.join(KINDS)}")
        try:
            value = float(share)
        except ValueError:
            raise ValueError(f"client-noise item {item!r}: fraction {share!r} is not a number") from None
        if not 0 <= value <= 1:
            raise ValueError(f"client-noise item {item!r}: fraction must be in [0, 1]")
        out.append((kind, value))
    if sum(v for _, v in out) > 1 + 1e-9:
        raise ValueError(f"client-noise fractions sum to {sum(v for _, v in out):g}, more than 1")
    return out


def noise_assignment(spec: str, num_clients: int, seed: int) -> dict[int, str]:
    """Partition id -> noise kind for every corrupted client (clean clients are absent)."""
    order = np.random.default_rng([int(seed), seeds.NOISE]).permutation(num_clients)
    out, start = {}, 0
    for kind, share in parse_client_noise(spec):
        count = int(round(share * num_clients))
        for pid in order[start : start + count]:
            out[int(pid)] = kind
        start += count
    return out


def corrupt(x: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """A corrupted copy of one client's training inputs ``x``."""
    if kind in IMAGE_KINDS and (x.ndim != 4 or x.dtype != np.uint8):
        raise ValueError(f"client-noise kind {kind!r} is for images (uint8, n×C×H×W); this data set's inputs are {x.dtype} {x.shape[1:]}")
    if kind in TABULAR_KINDS and x.ndim != 2:
        raise ValueError(f"client-noise kind {kind!r} is for tabular data; this data set's inputs are images")
    if len(x) == 0:
        return x.copy()
    if kind == "irrelevant":
        from scipy.ndimage import zoom

        n, c, h, w = x.shape
        coarse = rng.uniform(0, 255, size=(n, c, 7, 7))
        return np.clip(zoom(coarse, (1, 1, h / 7, w / 7), order=1), 0, 255).astype(np.uint8)
    if kind == "blur":
        from scipy.ndimage import gaussian_filter

        return np.clip(np.rint(gaussian_filter(x.astype(np.float32), sigma=(0, 0, BLUR_SIGMA, BLUR_SIGMA))), 0, 255).astype(np.uint8)
    if kind == "salt-pepper":
        out = x.copy()
        hit = rng.random(x.shape[:1] + x.shape[2:]) < SALT_PEPPER_DENSITY  # the same pixels in every channel
        salt = rng.random(hit.shape) < 0.5
        mask = np.broadcast_to(hit[:, None], x.shape)
        out[mask] = np.broadcast_to(np.where(salt, 255, 0)[:, None], x.shape)[mask]
        return out
    if kind == "polluted":
        return rng.uniform(-5.0, 5.0, size=x.shape).astype(x.dtype)
    if kind == "noisy":
        return (x + rng.normal(0.0, 1.0, size=x.shape)).astype(x.dtype)
    raise ValueError(f"unknown client-noise kind {kind!r}")


def parse_client_transform(text: str) -> dict[int, str]:
    """``"100:rotate90,7:hflip"`` -> {100: "rotate90", 7: "hflip"}, checked (one line saying what is wrong)."""
    out: dict[int, str] = {}
    for item in (p.strip() for p in str(text).split(",")):
        if not item:
            continue
        pid, sep, kind = (t.strip() for t in item.partition(":"))
        if not sep or kind not in TRANSFORMS or not pid.isdigit():
            raise ValueError(
                f"client-transform item {item!r}: expected partition-id:kind with kind one of {', '.join(TRANSFORMS)} (e.g. '100:rotate90')"
            )
        if int(pid) in out:
            raise ValueError(f"client-transform names partition {int(pid)} twice")
        out[int(pid)] = kind
    return out


def transform(x: np.ndarray, kind: str) -> np.ndarray:
    """``x`` (images, n×C×H×W, square) rotated counter-clockwise or mirrored as ``kind`` says; a new array."""
    if x.ndim != 4 or x.shape[2] != x.shape[3]:
        raise ValueError(
            f"client-transform kind {kind!r} is for square images (n×C×H×W); this data set's inputs are {x.dtype} {x.shape[1:]}"
        )
    if kind == "hflip":
        return np.ascontiguousarray(x[:, :, :, ::-1])
    return np.ascontiguousarray(np.rot90(x, k=TRANSFORMS[kind], axes=(2, 3)))
