"""Algorithm name -> client procedure: every class of ``client.procedures`` that sets its own
``methods`` (a tuple: one procedure may serve several methods) registers under each, and every
method declared in core/methods.py must have exactly one (RuntimeError naming what is missing,
doubled or undeclared)."""

from __future__ import annotations

import importlib
import pkgutil

from client import procedures
from client.procedures.base import Procedure
from core.methods import one_per_method


def discover() -> dict[str, Procedure]:
    """Import every procedure module and match the classes found to the declared methods; one
    instance per class."""
    claims = []
    for info in pkgutil.iter_modules(procedures.__path__):
        module = importlib.import_module(f"{procedures.__name__}.{info.name}")
        for cls in vars(module).values():
            if isinstance(cls, type) and cls.__module__ == module.__name__ and "methods" in vars(cls):
                methods = vars(cls)["methods"]
                if isinstance(methods, str):
                    raise TypeError(f"{cls.__module__}.{cls.__qualname__}.methods must be a tuple of method names, not a string")
                claims += [(name, cls) for name in methods]
    classes = one_per_method("client procedure", claims)
    instances = {cls: cls() for cls in set(classes.values())}
    return {name: instances[cls] for name, cls in classes.items()}


PROCEDURES: dict[str, Procedure] = discover()
