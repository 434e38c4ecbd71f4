"""Algorithm name -> client procedure, derived from the method declarations (core/methods.py)."""

from client.procedures.base import Procedure
from core.methods import METHODS

PROCEDURES: dict[str, Procedure] = {name: method.load_procedure()() for name, method in METHODS.items()}
