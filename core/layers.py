"""Naming a model's layers so methods can share some and keep the rest local.

A *layer* is a module that owns parameters directly (a convolution, a linear map, a
norm). Layers are listed in the order the model registers them, which for headway's
``Net(body, head)`` is the order of the forward pass, so "the top k layers" are the k
closest to the output.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

from torch import nn

T = TypeVar("T")


def layer_names(model: nn.Module) -> list[str]:
    """Module paths of the layers of ``model``, input side first."""
    return [name for name, mod in model.named_modules() if name and any(True for _ in mod.parameters(recurse=False))]


def top_layers(model: nn.Module, k: int) -> list[str]:
    """The ``k`` layers nearest the output (k may not exceed the number of layers)."""
    names = layer_names(model)
    if not 0 <= k <= len(names):
        raise ValueError(f"asked for the top {k} layers of a model with {len(names)}: {names}")
    return names[len(names) - k :] if k else []


def in_layers(key: str, layers: Iterable[str]) -> bool:
    """Whether state-dict ``key`` (e.g. ``body.fcs.0.weight``) belongs to one of ``layers``."""
    return any(key.startswith(layer + ".") for layer in layers)


def select(state: Mapping[str, T], layers: Iterable[str], inside: bool = True) -> dict[str, T]:
    """The entries of ``state`` in ``layers`` (``inside=False``: the entries outside them)."""
    layers = list(layers)
    return {k: v for k, v in state.items() if in_layers(k, layers) == inside}
