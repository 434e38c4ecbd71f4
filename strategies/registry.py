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

import headway.strategies as strategies
from headway.core.methods import METHODS, Method, class_path
from headway.core.schema import ConfigError
from headway.core.settings import Settings
from headway.strategies.base import HeadwayStrategy
from headway.strategies.capabilities import ROBUST_AGGREGATION, ROBUST_HOOKS, SECURE_SUM, SECURE_SUM_HOOKS, capabilities_of, hidden_hooks


def load(method: Method) -> type[HeadwayStrategy]:
    """The strategy class ``method`` declares; RuntimeError naming the method when it is missing or no strategy of it."""
    module, name = class_path(method.strategy)
    where = f"{strategies.__name__}.{module}.{name}"
    try:
        cls = getattr(importlib.import_module(f"{strategies.__name__}.{module}"), name)
    except Exception as exc:  # a missing module or class, or a module that fails as it runs (SyntaxError, NameError, ...)
        # chained implicitly, not "from exc": the run's reason is the root of the cause chain (simulation/runner.py), and it
        # must name the method and the declared path; the traceback still shows the import's error above this one
        raise RuntimeError(  # noqa: B904
            f"method {method.name!r} declares strategy {where}, which cannot be loaded: {type(exc).__name__}: {exc}"
        )
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
        found.append(_no_robust_step(cls))
    return [f"{method.name!r}: {p}" for p in found]


def _no_robust_step(cls: type[HeadwayStrategy]) -> str:
    """Why ``cls`` takes no robust rule and what to do: restate the hooks its own ``aggregate_train`` hides
    (strategies/capabilities.py), or declare what its server combines instead of averaging."""
    hidden = hidden_hooks(cls, ROBUST_HOOKS)
    if not hidden:
        return (
            f"its strategy {cls.__qualname__} implements no robust aggregation step: declare server_combines (what its server does instead)"
        )
    hooks = ", ".join(hidden)
    return (
        f"its strategy {cls.__qualname__} defines its own aggregate_train, which hides the {hooks} it inherits "
        f"(a hook counts only where the class defining aggregate_train, or a subclass, defines it): if its aggregate_train still "
        f"averages the round's model updates, restate {hooks} in {cls.__qualname__} (def {hidden[0]}(self, ...): return "
        f"super().{hidden[0]}(...)) to keep robust aggregation (and sum_spec, aggregate_sum for secure-aggregation); "
        "otherwise declare server_combines (what its server does instead)"
    )


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
    (secure-aggregation) or a robust rule (aggregation). Run before any client is asked (headway.server.app)."""
    name = settings.algorithm
    if settings.secure_aggregation != "off" and SECURE_SUM not in CAPABILITIES[name]:
        cls = STRATEGIES[name]
        hidden = [] if getattr(cls, "hides_sum_on_purpose", False) else hidden_hooks(cls, SECURE_SUM_HOOKS)
        why = (
            f"its strategy {cls.__qualname__} defines its own aggregate_train, which hides the {', '.join(hidden)} it inherits: "
            "restate them in it if its aggregation is still the sum's (strategies/capabilities.py)"
            if hidden
            else f"{name}'s server needs what each client sends, not only their sum"
        )
        raise ConfigError(
            f"run-config key 'secure-aggregation' is {settings.secure_aggregation!r}, which only {', '.join(able(SECURE_SUM))} implement: {why}"
        )
    if settings.aggregation != "mean" and ROBUST_AGGREGATION not in CAPABILITIES[name]:
        raise ConfigError(
            f"run-config key 'aggregation' is {settings.aggregation!r}, which only {', '.join(able(ROBUST_AGGREGATION))} implement (it replaces their "
            f"average of the round's model updates); {name} {METHODS[name].server_combines}: leave it 'mean'"
        )
