"""Algorithm name -> strategy class: every class of the ``strategies`` package that sets its
own ``name`` registers under it, and every method declared in core/methods.py must have
exactly one (RuntimeError naming what is missing, doubled or undeclared)."""

from __future__ import annotations

import importlib
import pkgutil

import strategies
from core.methods import one_per_method
from strategies.base import HeadwayStrategy


def discover() -> dict[str, type[HeadwayStrategy]]:
    """Import every module of the package and match the strategies found to the declared methods."""
    claims = []
    for info in pkgutil.iter_modules(strategies.__path__):
        module = importlib.import_module(f"{strategies.__name__}.{info.name}")
        for cls in vars(module).values():
            is_strategy = isinstance(cls, type) and issubclass(cls, HeadwayStrategy) and cls is not HeadwayStrategy
            if is_strategy and cls.__module__ == module.__name__ and "name" in vars(cls):  # intermediate bases (LayerSharing) set none
                claims.append((cls.name, cls))
    return one_per_method("strategy", claims)


STRATEGIES: dict[str, type[HeadwayStrategy]] = discover()
