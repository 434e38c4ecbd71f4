"""Local training and evaluation loops shared by every method's client procedure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import torch
from headway.core.data import augment_batch
from headway.core.methods import ENSEMBLES
from torch import nn

CPU = torch.device("cpu")  # the default device of training and prediction
Out = TypeVar("Out")  # what a training forward pass gives its loss: logits, or (features, logits)


def make_optimizer(name: str, params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The optimizer the ``optimizer`` key names: Adam, or SGD with momentum 0.5."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.5)
    raise ValueError(f"unknown optimizer {name!r}; allowed: adam, sgd")


def batches(n: int, batch_size: int, generator: torch.Generator, shuffle: bool = True) -> Iterator[torch.Tensor]:
    """Mini-batches of indices into ``n`` rows, shuffled by ``generator`` (reproducible from the seed) unless ``shuffle`` is False."""
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    for i in range(0, n, batch_size):
        yield order[i : i + batch_size]


def train_epochs(
    forward: Callable[[torch.Tensor], Out],
    params: list[nn.Parameter],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    optimizer: str,
    loss_fn: Callable[[Out, torch.Tensor], torch.Tensor],
    augment: bool = False,
    seed: int = 0,
    device: torch.device = CPU,
    fresh_optimizer_each_epoch: bool = False,
    modules: Iterable[nn.Module] = (),
) -> float:
    """Minimize ``loss_fn(forward(xb), yb)`` over ``params``; returns the last epoch's mean loss.

    ``forward`` maps a batch to whatever ``loss_fn`` takes (logits, or features and
    logits); ``modules`` are put in train mode for the duration.
    """
    if epochs <= 0 or len(x) == 0:
        return float("nan")
    gen = torch.Generator().manual_seed(seed)
    for mod in modules:
        mod.train()
    opt = make_optimizer(optimizer, params, lr)
    mean = float("nan")
    for _ in range(epochs):
        if fresh_optimizer_each_epoch:
            opt = make_optimizer(optimizer, params, lr)
        total, count = 0.0, 0
        for idx in batches(len(x), batch_size, gen):
            xb, yb = x[idx], y[idx]
            if augment:
                xb = augment_batch(xb, gen)
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            loss = loss_fn(forward(xb), yb)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        mean = total / max(count, 1)
    for mod in modules:
        mod.eval()
    return mean


@torch.no_grad()
def predict(
    forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, batch_size: int = 1000, device: torch.device = CPU
) -> torch.Tensor:
    """Outputs of ``forward`` over ``x`` in batches, on the CPU. An empty ``x`` gives an
    empty output of the right width (forward runs on the 0-row batch), so an empty
    partition yields empty statistics instead of a shape error."""
    outs = [forward(x[i : i + batch_size].to(device)).cpu() for i in range(0, max(len(x), 1), batch_size)]
    return torch.cat(outs)


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of rows whose arg-max matches the label (nan on an empty split)."""
    if len(y) == 0:
        return float("nan")
    return float((logits.argmax(1) == y).float().mean())


def task_loss(task: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The training loss of a task: cross-entropy for classification, mean squared error for regression."""
    return nn.functional.cross_entropy if task == "classification" else nn.functional.mse_loss


def task_metrics(task: str, outputs: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Metrics of a prediction: accuracy for classification; for regression MSE and R²,
    1 − Σ(y − ŷ)² / Σ(y − ȳ)² over every target (the "accuracy" of a regression run)."""
    if task == "classification":
        return {"accuracy": accuracy(outputs, y), "loss": float(nn.functional.cross_entropy(outputs, y)) if len(y) else float("nan")}
    if not len(y):
        return {"mse": float("nan"), "loss": float("nan"), "r2": float("nan")}
    mse = float(nn.functional.mse_loss(outputs, y))
    spread = float(((y - y.mean(0)) ** 2).sum())
    r2 = 1.0 - float(((outputs - y) ** 2).sum()) / spread if spread > 0 else float("nan")
    return {"mse": mse, "loss": mse, "r2": r2}


@torch.no_grad()
def ensemble_outputs(
    models: Iterable[Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor, rule: str = "logits", batch_size: int = 1000
) -> torch.Tensor:
    """Every model's outputs over ``x`` combined by ``rule`` (LG-FedAvg's new test): ``logits``, their mean (the paper's);
    ``probabilities``, the log of the mean softmax, where one model moves a class's probability by at most 1/K however
    extreme its logits; ``median``, the coordinate-wise median, which no minority of models can move arbitrarily."""
    if rule not in ENSEMBLES:
        raise ValueError(f"unknown ensemble rule {rule!r}; allowed: {', '.join(ENSEMBLES)}")
    outs = [predict(model, x, batch_size) for model in models]
    if not outs:
        raise ValueError("an ensemble needs at least one model")
    stacked = torch.stack(outs)
    if rule == "median":
        return stacked.median(dim=0).values
    if rule == "probabilities":
        return torch.log(torch.softmax(stacked, dim=-1).mean(dim=0))
    return stacked.mean(dim=0)


class trainable_only:
    """Context manager: only ``names`` (parameter names of ``model``) require grad inside.

    Frozen parameters get no gradients, so autograd also skips the layers beneath them.
    """

    def __init__(self, model: nn.Module, names: Iterable[str]):
        self.model, self.names = model, set(names)

    def __enter__(self) -> list[nn.Parameter]:
        self.saved = {n: p.requires_grad for n, p in self.model.named_parameters()}
        for n, p in self.model.named_parameters():
            p.requires_grad_(n in self.names)
        return [p for n, p in self.model.named_parameters() if n in self.names]

    def __exit__(self, *exc: object) -> None:
        for n, p in self.model.named_parameters():
            p.requires_grad_(self.saved[n])
