"""The layers import one way (server -> strategies -> core, client -> core): checked on the
import graph of every module, built with ``ast`` from its import statements (function-local
ones too), the module names it passes to importlib, and strings naming a module of a layer
(``"strategies.fedavg:FedAvg"``), which are imports waiting to happen."""

from __future__ import annotations

import ast
import re

from tests.conftest import ROOT

LAYERS = ("core", "client", "strategies", "server", "simulation", "headway")
APPS = ("client", "server")  # the two Flower apps: only the runner and the command line hold both
# layer -> the layers (and third-party packages) it must never refer to
FORBIDDEN = {
    "core": {"client", "strategies", "server", "simulation", "headway", "flwr"},
    "client": {"strategies", "server", "simulation", "headway"},
    "strategies": {"client", "server", "simulation", "headway"},
    "server": {"client", "simulation", "headway"},
}
BOTH_APPS_ALLOWED = ("simulation", "headway")
# Flower's cryptographic primitives are libraries, not the framework: core/secagg.py builds SecAgg+ from
# them (key pairs, key agreement and encryption, Shamir) rather than writing cryptography of its own
FLOWER_PRIMITIVES = ("flwr.common.secure_aggregation", "flwr.supercore.primitives")
MODULE_PATH = re.compile(rf"({'|'.join(LAYERS)})(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?")
IMPORTERS = ("import_module", "__import__")


def references(source: str, module: str) -> set[str]:
    """Every module that the source of ``module`` (dotted name) imports or names: import
    statements anywhere, relative ones resolved; constant names passed to importlib's
    import_module or __import__; and any string that is a dotted path into one of our layers."""
    package = module.rsplit(".", 1)[0] if "." in module else ""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if package else []
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.add(name)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in IMPORTERS and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_PATH.fullmatch(node.value):
            if is_module(node.value.split(":")[0]):  # "server.crt" is a file name, "strategies.fedavg" a module
                found.add(node.value.split(":")[0])
    return found


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def top(name: str) -> str:
    """The top-level package ``name`` belongs to; Flower's cryptographic primitives count apart from Flower."""
    if any(name == p or name.startswith(p + ".") for p in FLOWER_PRIMITIVES):
        return "flwr-primitives"
    return name.split(".")[0]


def graph(folders: tuple[str, ...] = LAYERS) -> dict[str, set[str]]:
    """Module name -> the top-level packages it refers to, for every module under ``folders``."""
    out = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)  # a package's own __init__ resolves relative imports in it
            out[module.removesuffix(".__init__")] = {top(name) for name in references(path.read_text(), module)} - {""}
    return out


def test_the_checker_sees_every_kind_of_reference():
    source = """
import client.app
from strategies import fedavg
from ..server import results
import importlib

def late():
    from simulation import runner
    importlib.import_module("headway.cli")
    __import__("flwr")

DECLARED = "strategies.fedavg:FedAvg"
PROSE = "rows it keeps from clients; see core.methods for the rest"
FILE = "client.key"
"""
    found = {top(n) for n in references(source, "core.example")}
    assert found == {"client", "strategies", "server", "simulation", "headway", "importlib", "flwr"}
    assert references("from . import schema\nfrom .methods import METHODS\n", "core.config") == {"core", "core.methods"}
    crypto = references("from flwr.common.secure_aggregation.crypto.shamir import create_shares\nfrom flwr.app import Message\n", "core.x")
    assert {top(n) for n in crypto} == {"flwr-primitives", "flwr"}  # the primitives pass, the framework does not


def test_no_layer_refers_to_a_layer_above_it():
    bad = [
        f"{module} -> {', '.join(sorted(refs & FORBIDDEN[top(module)]))}"
        for module, refs in graph().items()
        if top(module) in FORBIDDEN and refs & FORBIDDEN[top(module)]
    ]
    assert not bad, "layering broken (server -> strategies -> core, client -> core):\n" + "\n".join(bad)


def test_only_the_runner_and_the_command_line_import_both_apps():
    folders = tuple(f for f in ("benchmarks", *LAYERS) if f not in BOTH_APPS_ALLOWED)
    both = [module for module, refs in graph(folders).items() if set(APPS) <= refs]
    assert not both, f"{both} import both the ServerApp side and the ClientApp side; only {BOTH_APPS_ALLOWED} may"
