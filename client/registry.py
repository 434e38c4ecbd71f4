"""Algorithm name -> client procedure, loaded from the method declarations (core/methods.py names
each method's procedure as ``"module:Class"`` in ``headway.client.procedures``); one instance per class,
shared by the methods that name the same class. Checked at import, naming the method: the class
exists and its ``methods`` tuple names the method."""

from __future__ import annotations

import importlib

from headway.client import procedures
from headway.client.procedures.base import Procedure
from headway.core.methods import METHODS, Method, class_path


def load(method: Method) -> type:
    """The procedure class ``method`` declares; RuntimeError naming the method when it is missing or does not claim it."""
    module, name = class_path(method.procedure)
    where = f"{procedures.__name__}.{module}.{name}"
    try:
        cls = getattr(importlib.import_module(f"{procedures.__name__}.{module}"), name)
    except Exception as exc:  # a missing module or class, or a module that fails as it runs (SyntaxError, NameError, ...)
        # chained implicitly, not "from exc": the run's reason is the root of the cause chain (simulation/runner.py), and it
        # must name the method and the declared path; the traceback still shows the import's error above this one
        raise RuntimeError(  # noqa: B904
            f"method {method.name!r} declares client procedure {where}, which cannot be loaded: {type(exc).__name__}: {exc}"
        )
    claimed = getattr(cls, "methods", ())
    if isinstance(claimed, str) or method.name not in claimed:
        raise RuntimeError(f"method {method.name!r} declares client procedure {where}, whose methods tuple {claimed!r} does not name it")
    return cls


def _load_all() -> dict[str, Procedure]:
    classes = {name: load(method) for name, method in METHODS.items()}
    instances = {cls: cls() for cls in set(classes.values())}
    return {name: instances[cls] for name, cls in classes.items()}


PROCEDURES: dict[str, Procedure] = _load_all()
