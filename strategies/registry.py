"""Algorithm name -> strategy class, loaded from the method declarations (core/methods.py names
each method's strategy as ``"module:Class"`` in this package), and the refusals that need the
class: a secure sum or a robust rule for a method whose strategy does not implement it
(strategies/capabilities.py reads what it implements).

Checked at import, naming the method: every declared method's class exists, is a
HeadwayStrategy under the method's name, and its capabilities agree with its declaration
(a method declaring what its server combines instead of an average implements no robust rule,
and one declaring nothing does)."""

from __future__ import annotations

import importlib

import strategies
from core.methods import METHODS, Method, class_path
from core.schema import ConfigError
from core.settings import Settings
from strategies.base import HeadwayStrategy
from strategies.capabilities import ROBUST_AGGREGATION, SECURE_SUM, capabilities_of


def load(method: Method) -> type[HeadwayStrategy]:
    """The strategy class ``method`` declares; RuntimeError naming the method when it is missing or no strategy of it."""
    module, name = class_path(method.strategy)
    where = f"{strategies.__name__}.{module}.{name}"
    try:
        cls = getattr(importlib.import_module(f"{strategies.__name__}.{module}"), name)
    except (ImportError, AttributeError) as exc:
        raise RuntimeError(f"method {method.name!r} declares strategy {where}, which cannot be loaded: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, HeadwayStrategy)):
        raise RuntimeError(f"method {method.name!r} declares strategy {where}, which is no HeadwayStrategy subclass")
    return cls


def problems(method: Method, cls: type[HeadwayStrategy]) -> list[str]:
    """What disagrees between ``method``'s declaration and its strategy class ``cls``."""
    found = []
    if cls.name != method.name:
        found.append(f"its strategy {cls.__qualname__} has name {cls.name!r}")
    robust = ROBUST_AGGREGATION in capabilities_of(cls)
    if robust and method.server_combines:
        found.append(
            f"its strategy {cls.__qualname__} implements a robust aggregation step, but the declaration says its server {method.server_combines}"
        )
    if not robust and not method.server_combines:
        found.append(
            f"its strategy {cls.__qualname__} implements no robust aggregation step: declare server_combines (what its server does instead)"
        )
    return [f"{method.name!r}: {p}" for p in found]


def _load_all() -> dict[str, type[HeadwayStrategy]]:
    classes = {name: load(method) for name, method in METHODS.items()}
    found = [p for name, cls in classes.items() for p in problems(METHODS[name], cls)]
    if found:
        raise RuntimeError("strategies disagree with their declarations in core/methods.py: " + "; ".join(found))
    return classes


STRATEGIES: dict[str, type[HeadwayStrategy]] = _load_all()
CAPABILITIES: dict[str, frozenset[str]] = {name: capabilities_of(cls) for name, cls in STRATEGIES.items()}


def able(capability: str) -> list[str]:
    """The methods whose strategy implements ``capability``, in declaration order."""
    return [name for name, found in CAPABILITIES.items() if capability in found]


def check_capabilities(settings: Settings) -> None:
    """ConfigError when the run's settings ask a method for what its strategy does not implement: a secure sum
    (secure-aggregation) or a robust rule (aggregation). Run before any client is asked (server.app)."""
    name = settings.algorithm
    if settings.secure_aggregation != "off" and SECURE_SUM not in CAPABILITIES[name]:
        raise ConfigError(
            f"run-config key 'secure-aggregation' is {settings.secure_aggregation!r}, which only {', '.join(able(SECURE_SUM))} implement: "
            f"{name}'s server needs what each client sends, not only their sum"
        )
    if settings.aggregation != "mean" and ROBUST_AGGREGATION not in CAPABILITIES[name]:
        raise ConfigError(
            f"run-config key 'aggregation' is {settings.aggregation!r}, which only {', '.join(able(ROBUST_AGGREGATION))} implement (it replaces their "
            f"average of the round's model updates); {name} {METHODS[name].server_combines}: leave it 'mean'"
        )
