"""Bodies (input -> m features) and heads (m features -> outputs), built by name.

A model is built from (body name, input shape, m, outputs, seed), so every client
can rebuild the same initialization; clients may run different bodies as long as
they agree on m.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from headway.core import seeds
from torch import nn


class CNN(nn.Module):
    """Convolutions with max pooling, then fully connected layers with ReLU; optionally
    channel dropout after the last convolution and dropout on the output features, active
    in training only (parameter-free: the parameter names are the same with or without)."""

    nonnegative_features = True  # its features leave a ReLU: a summary implying a negative one is not real

    def __init__(
        self, convs: list[nn.Module], fcs: list[nn.Linear], conv_dropout: float = 0.0, feature_dropout: float = 0.0, pool_to: int = 0
    ):
        super().__init__()
        self.pool_to = pool_to  # > 0: the last maps are average-pooled to pool_to x pool_to (any image size gives one width)
        self.convs = nn.ModuleList(convs)
        self.fcs = nn.ModuleList(fcs)
        self.conv_dropout = nn.Dropout2d(conv_dropout) if conv_dropout else nn.Identity()
        self.feature_dropout = nn.Dropout(feature_dropout) if feature_dropout else nn.Identity()
        self.out_dim = fcs[-1].out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The features after the feature dropout, what the head is trained on."""
        return self.forward_pair(x)[0]

    def forward_pair(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(features after the feature dropout, the same features before it), from one pass."""
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            x = conv(x)
            if i == last:
                x = self.conv_dropout(x)
            x = torch.max_pool2d(torch.relu(x), 2)
        if self.pool_to:
            x = nn.functional.adaptive_avg_pool2d(x, self.pool_to)
        x = x.flatten(1)
        for fc in self.fcs:
            x = torch.relu(fc(x))
        return self.feature_dropout(x), x


def feature_pair(body: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(features after the body's feature dropout, the same before it) from one pass; the
    same tensor twice for a body without it. Terms that pull features towards class centres
    (FedLog-C's Eq. 13, FedProto's prototypes) take the second: on dropped-out features
    they would add a hidden (p/(1-p))·|f|^2 penalty that shrinks the features."""
    pair = getattr(body, "forward_pair", None)  # CNN and TorchvisionBody; bodies without dropout need none
    if pair is not None:
        return pair(x)
    f = body(x)
    return f, f


def mnist_cnn(input_shape: tuple[int, ...], m: int, dropout: float = 0.0) -> nn.Module:
    """FedLog Table A.2 (MNIST) without its last layer: 320 -> m (50). As the authors' model:
    Dropout2d(``dropout``) after the second convolution and dropout on the features."""
    return CNN([nn.Conv2d(input_shape[0], 10, 5), nn.Conv2d(10, 20, 5)], [nn.Linear(320, m or 50)], dropout, dropout)


def cifar_cnn(input_shape: tuple[int, ...], m: int, dropout: float = 0.0) -> nn.Module:
    """FedLog Table A.2 (CIFAR) without its last layer: 400 -> 120 -> m (100). As the
    authors' model: dropout(``dropout``) on the features."""
    return CNN([nn.Conv2d(input_shape[0], 6, 5), nn.Conv2d(6, 16, 5)], [nn.Linear(400, 120), nn.Linear(120, m or 100)], 0.0, dropout)


def cifar_cnn_small(input_shape: tuple[int, ...], m: int) -> nn.Module:
    """The CIFAR CNN without its second-to-last fully connected layer (FedLog §4.4): 400 -> m."""
    return CNN([nn.Conv2d(input_shape[0], 6, 5), nn.Conv2d(6, 16, 5)], [nn.Linear(400, m or 100)])


def lenet5(input_shape: tuple[int, ...], m: int) -> nn.Module:
    """LeNet-5 (FedProf Table 2) without its output layer: two 5×5 convolutions (6, 16
    channels; 28×28 inputs padded to 32×32), then 400 -> 120 -> m (84)."""
    pad = 2 if input_shape[-1] == 28 else 0
    return CNN([nn.Conv2d(input_shape[0], 6, 5, padding=pad), nn.Conv2d(6, 16, 5)], [nn.Linear(400, 120), nn.Linear(120, m or 84)])


def image_cnn(input_shape: tuple[int, ...], m: int) -> nn.Module:
    """The CIFAR CNN's layers for images of any size (side >= 4): its two 5×5 convolutions padded
    (6, 16 channels), the maps average-pooled to 5×5, then 400 -> 120 -> m (100)."""
    convs: list[nn.Module] = [nn.Conv2d(input_shape[0], 6, 5, padding=2), nn.Conv2d(6, 16, 5, padding=2)]
    return CNN(convs, [nn.Linear(400, 120), nn.Linear(120, m or 100)], pool_to=5)


class MLP(nn.Module):
    """Fully connected layers with ReLU on flat inputs."""

    nonnegative_features = True

    def __init__(self, sizes: list[int]):
        super().__init__()
        self.fcs = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.out_dim = sizes[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The input flattened and passed through every layer with a ReLU after each, the last included: these are features, not logits."""
        x = x.flatten(1)
        for fc in self.fcs:
            x = torch.relu(fc(x))
        return x


def _flat(input_shape: tuple[int, ...]) -> int:
    n = 1
    for d in input_shape:
        n *= d
    return n


class Flat(nn.Module):
    """No layers: the input itself, flattened, as the features. With it the model is the
    linear head alone (e.g. a linear probe on frozen features, ``inputs=features``)."""

    def __init__(self, width: int):
        super().__init__()
        self.out_dim = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The input flattened: the features are the raw inputs, so a head on them is a linear probe."""
        return x.flatten(1)


def linear(input_shape: tuple[int, ...], m: int) -> nn.Module:
    """The input as its own features (see :class:`Flat`); m must be 0 or the input's width."""
    width = _flat(input_shape)
    if m and m != width:
        raise ValueError(
            f"body 'linear' has no layers, so its features are the input's {width} values; feature-dim={m} cannot apply: leave it 0"
        )
    return Flat(width)


def mlp(input_shape: tuple[int, ...], m: int) -> nn.Module:
    """Two fully connected layers (tabular data): in -> 64 -> m (32)."""
    return MLP([_flat(input_shape), 64, m or 32])


def mlp_deep(input_shape: tuple[int, ...], m: int) -> nn.Module:
    """Three fully connected layers: in -> 64 -> 64 -> m (32)."""
    return MLP([_flat(input_shape), 64, 64, m or 32])


class TorchvisionBody(nn.Module):
    """A torchvision network with its classifier replaced by a projection to m features,
    after the network's own classifier dropout where it has one (MobileNet V2: 0.2)."""

    def __init__(self, net: nn.Module, width: int, m: int, dropout: float = 0.0):
        super().__init__()
        self.net = net
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.proj = nn.Linear(width, m) if m and m != width else nn.Identity()
        self.out_dim = m or width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The wrapped network's output through the dropout and the projection to the configured width."""
        return self.proj(self.dropout(self.net(x)))

    def forward_pair(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(features through the dropout, the same without it), from one pass of the network."""
        h = self.net(x)
        kept = self.proj(h)
        if isinstance(self.dropout, nn.Identity):
            return kept, kept
        return self.proj(self.dropout(h)), kept


def mobilenet_v2(input_shape: tuple[int, ...], m: int) -> nn.Module:
    """torchvision's MobileNetV2, untrained, its first convolution adapted to the input's channels, its 1,280 features as the body's."""
    from torchvision.models import mobilenet_v2 as build

    net = build(weights=None)
    if input_shape[0] != 3:
        old = net.features[0][0]
        net.features[0][0] = nn.Conv2d(input_shape[0], old.out_channels, 3, 2, 1, bias=False)
    net.classifier = nn.Identity()
    return TorchvisionBody(net, 1280, m, dropout=0.2)  # torchvision's classifier dropout, kept


def resnet18(input_shape: tuple[int, ...], m: int) -> nn.Module:
    """torchvision's ResNet-18, untrained, its first convolution adapted to the input's channels, its 512 features as the body's."""
    from torchvision.models import resnet18 as build

    net = build(weights=None)
    if input_shape[0] != 3:
        net.conv1 = nn.Conv2d(input_shape[0], 64, 7, 2, 3, bias=False)
    net.fc = nn.Identity()
    return TorchvisionBody(net, 512, m)


def shufflenet_v2(input_shape: tuple[int, ...], m: int) -> nn.Module:
    """torchvision's ShuffleNet V2 ×1.0, untrained (FedProf's CIFAR-10 model), 1024 features."""
    from torchvision.models import shufflenet_v2_x1_0 as build

    net = build(weights=None)
    if input_shape[0] != 3:
        old = net.conv1[0]
        net.conv1[0] = nn.Conv2d(input_shape[0], old.out_channels, 3, 2, 1, bias=False)
    net.fc = nn.Identity()
    return TorchvisionBody(net, 1024, m)


BODIES: dict[str, Callable[[tuple[int, ...], int], nn.Module]] = {
    "mnist-cnn": mnist_cnn,
    "cifar-cnn": cifar_cnn,
    "cifar-cnn-small": cifar_cnn_small,
    "lenet5": lenet5,
    "image-cnn": image_cnn,
    "shufflenet-v2": shufflenet_v2,
    "linear": linear,
    "mlp": mlp,
    "mlp-deep": mlp_deep,
    "mobilenet-v2": mobilenet_v2,
    "resnet18": resnet18,
}


class Net(nn.Module):
    """A body followed by a linear head."""

    def __init__(self, body: nn.Module, head: nn.Module):
        super().__init__()
        self.body = body
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the head on the body's features."""
        return self.head(self.body(x))


# bodies whose papers' authors train them with dropout (``body-dropout``); others have none
WITH_DROPOUT = ("mnist-cnn", "cifar-cnn")


# ----- bodies users bring: an import path, or a torchvision architecture by name ------------
TORCHVISION = "torchvision:"
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
FORMS = "a registry name, torchvision:<arch>[@weights.pth] or package.module:factory"


class BodyError(ValueError):
    """A body name that cannot be resolved or built; its message is one line naming the body and why."""


def _line(exc: BaseException) -> str:
    """``exc``'s message on one line, at most 300 characters."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def is_custom_body(name: str) -> bool:
    """Whether ``name`` is a torchvision or import-path body (registry names have no colon):
    resolving it imports code, which the server does only for its own run config's names."""
    return ":" in name


def body_factory(name: str) -> Callable[..., nn.Module]:
    """The factory ``(input_shape, feature_dim) -> nn.Module`` that body ``name`` names: a
    BODIES entry (the bodies in WITH_DROPOUT also take the dropout); ``torchvision:<arch>``
    (optionally ``@weights.pth``, a local state dict of the full torchvision model); or
    ``package.module:factory``, imported here. Torchvision and import-path factories come
    wrapped: what they build is run once on a 2-row zero batch, must output a (batch, width)
    tensor, gets ``out_dim`` set where it has none, and must output feature_dim features
    when that is > 0. BodyError (one line naming the body and the reason) otherwise."""
    if name in BODIES:
        return BODIES[name]
    if name.startswith(TORCHVISION):
        return _checked(name, _torchvision_builder(name))
    if is_custom_body(name):
        return _checked(name, _imported(name))
    raise BodyError(
        f"unknown body {name!r}; allowed: {', '.join(sorted(BODIES))}, torchvision:<arch>[@weights.pth] or package.module:factory"
    )


def _imported(name: str) -> Callable[..., nn.Module]:
    if not _IMPORT_PATH.match(name):
        raise BodyError(f"body {name!r} is not {FORMS} (an import path is package.module:factory, e.g. headway_example_body:small_cnn)")
    module_name, attr = name.split(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise BodyError(
            f"body {name!r}: module {module_name!r} cannot be imported (ModuleNotFoundError: {_line(exc)}); "
            "install it or put it on PYTHONPATH, on the server and on every SuperNode that runs it"
        ) from None
    except Exception as exc:  # the module itself fails to import (SyntaxError, ImportError, its own code)
        raise BodyError(f"body {name!r}: importing module {module_name!r} raised {type(exc).__name__}: {_line(exc)}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise BodyError(f"body {name!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise BodyError(
            f"body {name!r}: {attr!r} in module {module_name!r} is of type {type(obj).__name__}, not callable; "
            "it must be a factory (input_shape, feature_dim) -> nn.Module"
        )
    return obj


def _torchvision_builder(name: str) -> Callable[[tuple[int, ...], int], nn.Module]:
    arch, at, weights = name[len(TORCHVISION) :].partition("@")
    from torchvision import models

    if arch not in models.list_models(module=models):  # classification architectures only
        raise BodyError(
            f"body {name!r}: torchvision has no classification architecture {arch!r} "
            "(e.g. resnet18, mobilenet_v3_small, efficientnet_b0; see torchvision.models.list_models())"
        )
    if at and not weights:
        raise BodyError(f"body {name!r}: '@' must be followed by a weights file (a state dict of the full torchvision model)")
    if weights and not Path(weights).is_file():
        raise BodyError(f"body {name!r}: weights file {weights!r} does not exist (relative paths are from the working directory)")

    def build(input_shape: tuple[int, ...], m: int) -> nn.Module:
        if len(input_shape) != 3:
            raise BodyError(
                f"body {name!r}: torchvision networks take images (channels, height, width); the inputs have shape {tuple(input_shape)}"
            )
        net = models.get_model(arch, weights=None)  # untrained: nothing is downloaded
        state = _load_weights(name, weights) if weights else None
        if state is not None:
            try:
                net.load_state_dict(state, strict=True)
            except Exception as exc:
                raise BodyError(f"body {name!r}: weights file {weights!r} does not fit torchvision {arch}: {_line(exc)}") from None
        if getattr(net, "aux_logits", False):  # googlenet, inception_v3: the auxiliary classifiers (training-only outputs) go
            net.aux_logits = False
            for aux in ("aux1", "aux2", "AuxLogits"):
                if hasattr(net, aux):
                    setattr(net, aux, None)
        _adapt_first_conv(name, net, input_shape[0], pretrained=state is not None)
        width, dropout = _drop_classifier(name, net)
        return TorchvisionBody(net, width, m, dropout)

    return build


def _load_weights(name: str, path: str) -> Mapping[str, Any]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)  # tensors only: a weights file runs no code
    except Exception as exc:
        raise BodyError(
            f"body {name!r}: weights file {path!r} cannot be read as a state dict: {type(exc).__name__}: {_line(exc)}"
        ) from None
    if not isinstance(state, Mapping):
        raise BodyError(f"body {name!r}: weights file {path!r} holds a value of type {type(state).__name__}, not a state dict")
    return state


def _parent(net: nn.Module, qualified: str) -> tuple[nn.Module, str]:
    *path, leaf = qualified.split(".")
    parent = net
    for part in path:
        parent = getattr(parent, part)
    return parent, leaf


def _adapt_first_conv(name: str, net: nn.Module, channels: int, pretrained: bool) -> None:
    """The network's first convolution takes ``channels`` input channels (torchvision's take
    3): a fresh one, as the registry's resnet18 does; with loaded weights, the pretrained
    filters summed over RGB and shared out over the channels (on a gray image copied into
    every channel it computes what the RGB filters compute on it copied into three)."""
    if channels == 3:
        return
    first = next(((n, mod) for n, mod in net.named_modules() if isinstance(mod, nn.Conv2d)), None)
    if first is None or first[1].in_channels != 3 or first[1].groups != 1:
        raise BodyError(f"body {name!r}: cannot adapt torchvision's first convolution to {channels}-channel inputs")
    qualified, old = first
    new = nn.Conv2d(
        channels,
        old.out_channels,
        old.kernel_size,  # type: ignore[arg-type]  # torch types a Conv2d's sizes tuple[int, ...]; they are pairs
        old.stride,  # type: ignore[arg-type]
        old.padding,  # type: ignore[arg-type]
        old.dilation,  # type: ignore[arg-type]
        1,
        old.bias is not None,
        old.padding_mode,
    )
    if pretrained:
        with torch.no_grad():
            new.weight.copy_(old.weight.sum(1, keepdim=True).repeat(1, channels, 1, 1) / channels)
            if old.bias is not None and new.bias is not None:
                new.bias.copy_(old.bias)
    parent, leaf = _parent(net, qualified)
    setattr(parent, leaf, new)


def _drop_classifier(name: str, net: nn.Module) -> tuple[int, float]:
    """Replace the network's last nn.Linear (its classifier: fc, classifier[-1], heads.head, ...)
    by Identity; returns its in_features (the width) and the dropout directly before it in its
    Sequential, moved out to TorchvisionBody as mobilenet-v2's is (0 where there is none)."""
    linears = [(n, mod) for n, mod in net.named_modules() if isinstance(mod, nn.Linear)]
    if not linears or linears[-1][1].out_features != 1000:
        raise BodyError(
            f"body {name!r}: found no final nn.Linear classifier (1000 ImageNet classes) to replace; "
            "use package.module:factory for this network"
        )
    qualified, fc = linears[-1]
    parent, leaf = _parent(net, qualified)
    setattr(parent, leaf, nn.Identity())
    dropout = 0.0
    if isinstance(parent, nn.Sequential) and leaf.isdigit() and int(leaf) > 0:
        before = parent[int(leaf) - 1]
        if isinstance(before, nn.Dropout):
            dropout = float(before.p)
            parent[int(leaf) - 1] = nn.Identity()
    return fc.in_features, dropout


def _describe(out: Any) -> str:
    if isinstance(out, torch.Tensor):
        return f"a tensor of shape {tuple(out.shape)}"
    return f"a value of type {type(out).__name__}"


def output_width(name: str, body: nn.Module, input_shape: tuple[int, ...], m: int = 0) -> int:
    """The width body ``name`` outputs on a 2-row zero batch of ``input_shape`` (in eval
    mode, no gradients: nothing changes); BodyError unless it outputs a (2, width) tensor,
    agrees with its ``out_dim`` where it has one, and outputs ``m`` features when m > 0."""
    shape = tuple(input_shape)
    param = next(body.parameters(), None)
    x = torch.zeros((2, *shape), device=param.device if param is not None else "cpu")
    training = body.training
    body.eval()
    try:
        with torch.no_grad():
            out = body(x)
    except Exception as exc:
        raise BodyError(f"body {name!r} cannot run on inputs of shape {shape}: {type(exc).__name__}: {_line(exc)}") from None
    finally:
        body.train(training)
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 2:
        raise BodyError(f"body {name!r} must output a 2-D (batch, width) tensor; on 2 inputs of shape {shape} it output {_describe(out)}")
    width = int(out.shape[1])
    declared = getattr(body, "out_dim", None)
    if declared is not None and declared != width:
        raise BodyError(f"body {name!r} has out_dim={declared} but outputs {width} features")
    if m and width != m:
        raise BodyError(
            f"body {name!r} outputs {width} features, but feature-dim={m}: its factory receives feature_dim={m} and must output that many"
        )
    return width


def _checked(name: str, factory: Callable[..., Any]) -> Callable[[tuple[int, ...], int], nn.Module]:
    """``factory`` with its output checked (see :func:`body_factory`)."""

    def build(input_shape: tuple[int, ...], m: int) -> nn.Module:
        try:
            body = factory(tuple(input_shape), m)
        except BodyError:
            raise
        except Exception as exc:
            raise BodyError(f"body {name!r}: the factory raised {type(exc).__name__}: {_line(exc)}") from None
        if not isinstance(body, nn.Module):
            raise BodyError(f"body {name!r}: the factory returned {_describe(body)}, not a torch.nn.Module")
        width = output_width(name, body, input_shape, m)
        if getattr(body, "out_dim", None) is None:
            body.out_dim = width  # type: ignore[assignment]  # nn.Module types attributes Tensor | Module; this one is an int
        return body

    return build


def build_body(name: str, input_shape: tuple[int, ...], m: int = 0, seed: int = 0, dropout: float = 0.0) -> nn.Module:
    """Body ``name`` (a BODIES name, ``torchvision:<arch>[@weights]`` or
    ``package.module:factory``: :func:`body_factory`) with m output features (0: the body's
    own width), seeded, in eval mode (training switches it to train mode for its duration);
    ``dropout`` applies to the bodies in WITH_DROPOUT and is ignored by the others."""
    factory = body_factory(name)  # before the seed: an import may draw random numbers
    torch.manual_seed(seed)
    body = factory(tuple(input_shape), m, dropout) if name in WITH_DROPOUT else factory(tuple(input_shape), m)
    return body.eval()


def body_width(body: nn.Module) -> int:
    """The number of features ``body`` outputs: its ``out_dim``, which :func:`build_body` sets on every body."""
    width = getattr(body, "out_dim", None)
    if width is None:
        raise BodyError(f"{type(body).__name__} declares no out_dim (the number of features it outputs)")
    return int(width)


def build_model(name: str, input_shape: tuple[int, ...], m: int, outputs: int, seed: int = 0, dropout: float = 0.0) -> Net:
    """Body and linear head, seeded, so every client can rebuild the same initial model."""
    body = build_body(name, input_shape, m, seed, dropout)
    torch.manual_seed(seed + seeds.HEAD)
    return Net(body, nn.Linear(body_width(body), outputs)).eval()


# ----- the body a run gets when it names none (body=auto) -----------------------------------
AUTO = "auto"
# what auto picks on images, the first that fits: the papers' bodies on their inputs (28×28: MNIST's, 32×32: CIFAR's), else
# one sized for any image; on anything else (a table's feature vector) an MLP
AUTO_IMAGE_BODIES = ("mnist-cnn", "cifar-cnn", "image-cnn")
AUTO_OTHER_BODY = "mlp"


def fits(name: str, input_shape: tuple[int, ...], m: int = 0) -> bool:
    """Whether registry body ``name`` builds for ``input_shape`` and outputs m features (m > 0) on a
    zero batch of it: a body declares what it accepts by running on it. Leaves torch's RNG as it was."""
    try:
        with torch.random.fork_rng(devices=[]):
            output_width(name, build_body(name, tuple(input_shape), m), tuple(input_shape), m)
    except Exception:  # any refusal: a size mismatch, too small an image, a width other than m
        return False
    return True


def fitting_bodies(input_shape: tuple[int, ...], m: int = 0) -> list[str]:
    """The registry bodies that fit ``input_shape`` with feature-dim ``m``, sorted (for error messages)."""
    return [name for name in sorted(BODIES) if fits(name, input_shape, m)]


def auto_body(input_shape: tuple[int, ...], m: int = 0) -> str:
    """The body a run gets when it names none: on images (channels, height, width) the first of
    AUTO_IMAGE_BODIES that fits, on anything else AUTO_OTHER_BODY. Deterministic: the same shape
    gives the same body on the server and on every client. BodyError when none fits."""
    shape = tuple(input_shape)
    candidates = AUTO_IMAGE_BODIES if len(shape) == 3 else (AUTO_OTHER_BODY,)
    for name in candidates:
        if fits(name, shape, m):
            return name
    raise BodyError(
        f"no built-in body fits inputs of shape {shape} with feature-dim={m} (tried {', '.join(candidates)}); name one in 'body' ({FORMS})"
    )


def resolve_device(choice: str) -> torch.device:
    """``auto`` is CUDA when present, else CPU; ``cuda`` without a GPU is an error."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda but torch sees no CUDA device; use device=auto or cpu")
    if choice == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


def nonnegative_features(name: str, input_shape: tuple[int, ...], m: int = 0) -> bool:
    """Whether every feature body ``name`` outputs is >= 0 (its last layer is a ReLU)."""
    return bool(getattr(build_body(name, input_shape, m), "nonnegative_features", False))


def common_width(bodies: list[str], input_shape: tuple[int, ...], m: int = 0) -> int:
    """The feature width every body in ``bodies`` outputs; ValueError when they differ."""
    widths = {b: body_width(build_body(b, input_shape, m)) for b in bodies}
    if len(set(widths.values())) != 1:
        raise ValueError(f"every body must output the same number of features; got {widths}: set 'feature-dim'")
    return next(iter(widths.values()))
