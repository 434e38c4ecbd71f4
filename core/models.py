"""Bodies (input -> m features) and heads (m features -> outputs), built by name.

A model is built from (body name, input shape, m, outputs, seed), so every client
can rebuild the same initialization; clients may run different bodies as long as
they agree on m.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


class CNN(nn.Module):
    """Convolutions with max pooling, then fully connected layers with ReLU; optionally
    channel dropout after the last convolution and dropout on the output features, active
    in training only (parameter-free: the parameter names are the same with or without)."""

    nonnegative_features = True  # its features leave a ReLU: a summary implying a negative one is not real

    def __init__(self, convs: list[nn.Module], fcs: list[nn.Linear], conv_dropout: float = 0.0, feature_dropout: float = 0.0):
        super().__init__()
        self.convs = nn.ModuleList(convs)
        self.fcs = nn.ModuleList(fcs)
        self.conv_dropout = nn.Dropout2d(conv_dropout) if conv_dropout else nn.Identity()
        self.feature_dropout = nn.Dropout(feature_dropout) if feature_dropout else nn.Identity()
        self.out_dim = fcs[-1].out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_pair(x)[0]

    def forward_pair(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(features after the feature dropout, the same features before it), from one pass."""
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            x = conv(x)
            if i == last:
                x = self.conv_dropout(x)
            x = torch.max_pool2d(torch.relu(x), 2)
        x = x.flatten(1)
        for fc in self.fcs:
            x = torch.relu(fc(x))
        return self.feature_dropout(x), x


def feature_pair(body: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(features after the body's feature dropout, the same before it) from one pass; the
    same tensor twice for a body without it. Terms that pull features towards class centres
    (FedLog-C's Eq. 13, FedProto's prototypes) take the second: on dropped-out features
    they would add a hidden (p/(1-p))·|f|^2 penalty that shrinks the features."""
    if hasattr(body, "forward_pair"):  # CNN and TorchvisionBody; bodies without dropout need none
        return body.forward_pair(x)
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


class MLP(nn.Module):
    """Fully connected layers with ReLU on flat inputs."""

    nonnegative_features = True

    def __init__(self, sizes: list[int]):
        super().__init__()
        self.fcs = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.out_dim = sizes[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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
        return x.flatten(1)


def linear(input_shape: tuple[int, ...], m: int) -> nn.Module:
    """The input as its own features (see :class:`Flat`); m must be 0 or the input's width."""
    width = _flat(input_shape)
    if m and m != width:
        raise ValueError(f"body 'linear' has no layers, so its features are the input's {width} values; feature-dim={m} cannot apply: leave it 0")
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
        return self.proj(self.dropout(self.net(x)))

    def forward_pair(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(features through the dropout, the same without it), from one pass of the network."""
        h = self.net(x)
        kept = self.proj(h)
        if isinstance(self.dropout, nn.Identity):
            return kept, kept
        return self.proj(self.dropout(h)), kept


def mobilenet_v2(input_shape: tuple[int, ...], m: int) -> nn.Module:
    from torchvision.models import mobilenet_v2 as build

    net = build(weights=None)
    if input_shape[0] != 3:
        old = net.features[0][0]
        net.features[0][0] = nn.Conv2d(input_shape[0], old.out_channels, 3, 2, 1, bias=False)
    net.classifier = nn.Identity()
    return TorchvisionBody(net, 1280, m, dropout=0.2)  # torchvision's classifier dropout, kept


def resnet18(input_shape: tuple[int, ...], m: int) -> nn.Module:
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
        return self.head(self.body(x))


# bodies whose papers' authors train them with dropout (``body-dropout``); others have none
WITH_DROPOUT = ("mnist-cnn", "cifar-cnn")


def build_body(name: str, input_shape: tuple[int, ...], m: int = 0, seed: int = 0, dropout: float = 0.0) -> nn.Module:
    """Body ``name`` with m output features (0: the body's own width), seeded, in eval mode
    (training switches it to train mode for its duration); ``dropout`` applies to the
    bodies in WITH_DROPOUT and is ignored by the others."""
    if name not in BODIES:
        raise ValueError(f"unknown body {name!r}; allowed: {', '.join(sorted(BODIES))}")
    torch.manual_seed(seed)
    body = BODIES[name](tuple(input_shape), m, dropout) if name in WITH_DROPOUT else BODIES[name](tuple(input_shape), m)
    return body.eval()


def build_model(name: str, input_shape: tuple[int, ...], m: int, outputs: int, seed: int = 0, dropout: float = 0.0) -> Net:
    """Body and linear head, seeded, so every client can rebuild the same initial model."""
    body = build_body(name, input_shape, m, seed, dropout)
    torch.manual_seed(seed + 1)
    return Net(body, nn.Linear(body.out_dim, outputs)).eval()


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
    widths = {b: build_body(b, input_shape, m).out_dim for b in bodies}
    if len(set(widths.values())) != 1:
        raise ValueError(f"every body must output the same number of features; got {widths}: set 'feature-dim'")
    return next(iter(widths.values()))
