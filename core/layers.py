"""Naming a model's layers so methods can share some and keep the rest local.

A *layer* is a module that owns parameters directly (a convolution, a linear map, a
norm). Layers are listed in the order the model registers them, which for headway's
``Net(body, head)`` is the order of the forward pass, so "the top k layers" are the k
closest to the output.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
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


def is_top_k(spec: str) -> bool:
    """Whether layer spec ``spec`` is the top-k shorthand (a whole number, e.g. ``"2"``)."""
    return spec.strip().isdigit()


def pattern_matches(pattern: str, name: str) -> bool:
    """Whether glob ``pattern`` names layer ``name``, whole or with its first component dropped
    (``convs.*`` names ``body.convs.0``), so users need not spell the model's wrapper."""
    _, _, rest = name.partition(".")
    return fnmatchcase(name, pattern) or (bool(rest) and fnmatchcase(rest, pattern))


def match_layers(model: nn.Module, spec: str | int) -> list[str]:
    """The layers of ``model`` that layer spec ``spec`` names, input side first: a whole number k is the
    top k layers (:func:`top_layers`); otherwise a comma list of glob patterns over :func:`layer_names`.
    ValueError naming the pattern and the layers when a pattern names none, or when the patterns name
    every layer (nothing would stay local)."""
    text = str(spec).strip()
    if is_top_k(text):
        return top_layers(model, int(text))
    names = layer_names(model)
    patterns = [p.strip() for p in text.split(",")]
    if not all(patterns):
        raise ValueError(f"layer spec {text!r} has an empty pattern; write a comma list of patterns such as 'convs.*,head'")
    for pattern in patterns:
        if not any(pattern_matches(pattern, n) for n in names):
            raise ValueError(f"pattern {pattern!r} names no layer; the layers are {', '.join(names)}")
    chosen = [n for n in names if any(pattern_matches(p, n) for p in patterns)]
    if len(chosen) == len(names):
        raise ValueError(
            f"{text!r} names every layer ({', '.join(names)}), which is whole-model averaging: use fedavg, or leave a layer local"
        )
    return chosen
