"""The layers import one way (server -> strategies -> core, client -> core): checked on the
import graph of every module, built with ``ast`` from its import statements (function-local
ones too), the module names it passes to importlib, and strings naming a module of a layer
(``"headway.strategies.fedavg:FedAvg"``), which are imports waiting to happen.

Inside core, two more rules: core imports no Flower at all (not even its cryptographic
primitives: core/secagg_primitives.py has its own), checked on the source and by importing every
core module in a fresh interpreter; and a method's maths module imports shared core modules
only, never another method's, so each method's maths can change without touching another's."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from headway.core.methods import METHODS

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
# offline studies that are part of neither app and need both sides' files, each with why
BOTH_APPS_STUDIES = {
    "benchmarks.fedprof_layers": "scores each client's own (noised) data against the global models a finished run checkpointed",
}
# each method's maths module in core, by method name. core/<name>.py for a declared method must be here
# (checked); the others are named for what they compute, which no rule derives from the method's name
METHOD_MATHS = {
    "fedlog": "headway.core.fedlog",
    "fedpft": "headway.core.fedpft",
    "fedproto": "headway.core.prototypes",
    "fedprof": "headway.core.profiles",
}
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
            found.update(f"{name}.{a.name}" for a in node.names if name and is_module(f"{name}.{a.name}"))  # from core import privacy
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in IMPORTERS and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_PATH.fullmatch(node.value):
            if is_module(node.value.split(":")[0]):  # "server.crt" is a file name, "headway.strategies.fedavg" a module
                found.add(node.value.split(":")[0])
    return found


CODE = ("core", "client", "strategies", "server", "simulation")  # headway.<these> live in the repository's top-level folders


def source_path(name: str) -> Path:
    """Where module ``name`` (dotted) lives in the checkout, without its suffix: headway.core.x in core/x."""
    parts = name.split(".")
    if parts[0] == "headway" and len(parts) > 1 and parts[1] in CODE:
        parts = parts[1:]
    return ROOT.joinpath(*parts)


def is_module(name: str) -> bool:
    path = source_path(name)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def top(name: str) -> str:
    """The layer ``name`` belongs to: a code package (headway.core.x -> core), headway's own modules, or a third party's top-level name."""
    parts = name.split(".")
    return parts[1] if parts[0] == "headway" and len(parts) > 1 and parts[1] in CODE else parts[0]


def modules(folder: str) -> dict[str, tuple[str, str]]:
    """Module name -> (the name its relative imports resolve against, its source), for every module under
    ``folder``: a package's own ``__init__`` resolves relative imports inside the package."""
    out = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        module = ("headway." if folder in CODE else "") + ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[module.removesuffix(".__init__")] = (module, path.read_text())
    return out


def graph(folders: tuple[str, ...] = LAYERS) -> dict[str, set[str]]:
    """Module name -> the top-level packages it refers to, for every module under ``folders``."""
    out = {}
    for folder in folders:
        for module, (importer, source) in modules(folder).items():
            out[module] = {top(name) for name in references(source, importer)} - {""}
    return out


def test_the_checker_sees_every_kind_of_reference():
    source = """
import headway.client.app
from headway.strategies import fedavg
from ..server import results
import importlib

def late():
    from headway.simulation import runner
    importlib.import_module("headway.cli")
    __import__("flwr")

DECLARED = "headway.strategies.fedavg:FedAvg"
PROSE = "rows it keeps from clients; see headway.core.methods for the rest"
FILE = "client.key"
"""
    found = {top(n) for n in references(source, "headway.core.example")}
    assert found == {"client", "strategies", "server", "simulation", "headway", "importlib", "flwr"}
    assert references("from . import schema\nfrom .methods import METHODS\n", "headway.core.config") == {
        "headway.core",
        "headway.core.schema",
        "headway.core.methods",
    }
    crypto = references("from flwr.common.secure_aggregation.crypto.shamir import create_shares\n", "headway.core.x")
    assert {top(n) for n in crypto} == {"flwr"}  # Flower's primitives are Flower
    assert "headway.core.fedlog" in references(
        "from headway.core import fedlog as f\n", "headway.core.prototypes"
    )  # a module imported by name


def test_no_layer_refers_to_a_layer_above_it():
    bad = [
        f"{module} -> {', '.join(sorted(refs & FORBIDDEN[top(module)]))}"
        for module, refs in graph().items()
        if top(module) in FORBIDDEN and refs & FORBIDDEN[top(module)]
    ]
    assert not bad, "layering broken (server -> strategies -> core, client -> core):\n" + "\n".join(bad)


def test_only_the_runner_and_the_command_line_import_both_apps():
    folders = tuple(f for f in ("benchmarks", *LAYERS) if f not in BOTH_APPS_ALLOWED)
    both = [module for module, refs in graph(folders).items() if set(APPS) <= refs and module not in BOTH_APPS_STUDIES]
    assert not both, f"{both} import both the ServerApp side and the ClientApp side; only {BOTH_APPS_ALLOWED} may"


def test_core_imports_no_flower_not_even_through_what_it_imports():
    """Every core module in a fresh interpreter (this one has Flower loaded already): importing them all
    loads no ``flwr`` module, so no core import, and no third-party package core imports, brings Flower in."""
    names = sorted(modules("core"))
    probe = (
        "import importlib, sys\n"
        f"for m in {names!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'flwr'))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(names) > 20 and done.stdout.strip() == "[]", f"importing core loaded Flower: {done.stdout.strip()[:300]}"


def method_imports() -> dict[str, set[str]]:
    """Each core module -> the method maths modules (:data:`METHOD_MATHS`) it imports, other than itself."""
    maths = set(METHOD_MATHS.values())
    return {
        module: {name for name in references(source, importer) if name in maths} - {module}
        for module, (importer, source) in modules("core").items()
    }


def test_the_method_maths_list_follows_the_declarations():
    assert set(METHOD_MATHS) <= set(METHODS), f"{sorted(set(METHOD_MATHS) - set(METHODS))} are not declared in core/methods.py"
    named = {f"headway.core.{m.replace('-', '_')}" for m in METHODS} & set(modules("core"))  # core/<method>.py
    assert named <= set(METHOD_MATHS.values()), (
        f"{sorted(named - set(METHOD_MATHS.values()))}: a method's maths module missing from METHOD_MATHS"
    )
    assert all(module in modules("core") for module in METHOD_MATHS.values())


def test_no_core_module_imports_a_methods_maths():
    """A method's maths module is imported by no other core module, another method's or a shared one: what two
    methods share (class sums, the DP calibration) lives in a shared module both import."""
    bad = [f"{module} -> {', '.join(sorted(refs))}" for module, refs in method_imports().items() if refs]
    assert not bad, "core modules importing a method's maths (move the shared part to a shared module):\n" + "\n".join(bad)
