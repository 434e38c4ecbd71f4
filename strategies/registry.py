"""Algorithm name -> strategy class, derived from the method declarations (core/methods.py)."""

from core.methods import METHODS
from strategies.base import HeadwayStrategy

STRATEGIES: dict[str, type[HeadwayStrategy]] = {name: method.load_strategy() for name, method in METHODS.items()}
