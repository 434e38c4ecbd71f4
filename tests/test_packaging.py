"""What `make setup` and `pip install headway` get: the constraints file pins every dependency `make`
installs inside pyproject's ranges, and the built wheel carries the licence and no top-level module but `headway`."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"


def pins(text: str) -> dict[str, str]:
    """The `name==version` lines of a constraints file, by canonical name (comments and blank lines skipped)."""
    found: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep and name.strip() and version.strip(), f"constraints.txt: {raw!r} is not name==version; run `make constraints`"
        found[canonicalize_name(name.strip())] = version.strip()
    return found


def make_extras() -> list[str]:
    """The extras `make setup` installs, read from the Makefile's `pip install ... -e ".[...]"` line."""
    match = re.search(r'-e "\.\[([^\]]+)\]"', (ROOT / "Makefile").read_text())
    assert match, 'the Makefile no longer installs headway with -e ".[extras]"'
    return [extra.strip() for extra in match.group(1).split(",")]


def unpinned(requirements: list[str], pinned: dict[str, str]) -> list[str]:
    """Each requirement with no pin, or pinned at a version outside its range, as one line saying which."""
    wrong = []
    for line in requirements:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        version = pinned.get(canonicalize_name(req.name))
        if version is None:
            wrong.append(f"{req.name}: not in constraints.txt")
        elif not req.specifier.contains(version, prereleases=True):
            wrong.append(f"{req.name}: constraints.txt pins {version}, outside pyproject's {req.specifier}")
    return wrong


def test_constraints_pin_every_dependency_make_installs_inside_pyprojects_range():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    extras = make_extras()
    assert {"test", "lint"} <= set(extras)
    # setuptools too: make setup builds headway's editable install with the venv's
    requirements = list(pyproject["build-system"]["requires"]) + list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    pinned = pins(CONSTRAINTS.read_text())
    assert "headway" not in pinned  # the project itself comes from the checkout, never from the pins
    assert unpinned(requirements, pinned) == []


def test_a_pin_outside_the_range_or_missing_is_named():
    pinned = {"torch": "2.13.0", "numpy": "2.4.6"}
    assert unpinned(["torch==2.14.1", "numpy>=1.26", "scipy>=1.11"], pinned) == [
        "torch: constraints.txt pins 2.13.0, outside pyproject's ==2.14.1",
        "scipy: not in constraints.txt",
    ]
    with pytest.raises(AssertionError, match="is not name==version"):
        pins("-e ./somewhere\n")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """headway's wheel, built from a copy of the checkout's packages (no build/ leftovers, no network)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "results", "*.egg-info")
    for folder in sorted(p for p in ROOT.iterdir() if (p / "__init__.py").is_file()):
        shutil.copytree(folder, src / folder.name, ignore=ignore)
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet", "-w", str(out), str(src)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = out.glob("headway-*.whl")
    return zipfile.ZipFile(built)


def dist_info(wheel: zipfile.ZipFile) -> str:
    """The wheel's `headway-<version>.dist-info/` folder name."""
    (folder,) = {name.split("/", 1)[0] for name in wheel.namelist() if name.split("/", 1)[0].endswith(".dist-info")}
    return folder


@pytest.mark.slow
def test_the_wheel_carries_the_apache_licence(wheel):
    info = dist_info(wheel)
    assert wheel.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
    metadata = wheel.read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200] and "Version 2.0, January 2004" in (ROOT / "LICENSE").read_text()[:200]


@pytest.mark.slow
def test_the_wheel_installs_only_headway_as_a_top_level_module(wheel):
    info = dist_info(wheel)
    assert wheel.read(f"{info}/top_level.txt").decode().split() == ["headway"]
    assert {name.split("/", 1)[0] for name in wheel.namelist()} == {"headway", info}


CODE_FOLDERS = ("core", "client", "server", "strategies", "simulation")


@pytest.mark.slow
def test_the_wheel_holds_every_code_module_under_headway(wheel):
    """Each .py of the repository's code folders is in the wheel as headway/<folder>/..., byte for byte."""
    expected = {
        f"headway/{p.relative_to(ROOT).as_posix()}"
        for folder in CODE_FOLDERS
        for p in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    expected |= {f"headway/{p.name}" for p in (ROOT / "headway").glob("*.py")}
    held = {name for name in wheel.namelist() if name.endswith(".py")}
    assert held == expected
    assert wheel.read("headway/core/fedlog.py") == (ROOT / "core" / "fedlog.py").read_bytes()


USER_MODULES = {
    "client.py": "MINE = 'client'\n",
    "server.py": "MINE = 'server'\n",
    "core/__init__.py": "MINE = 'core'\n",
    "strategies/__init__.py": "MINE = 'strategies'\n",
}
PROBE = (
    "import client, core, server, strategies\n"
    "import headway.client.app, headway.core.settings, headway.server.app, headway.strategies.fedavg\n"
    "assert (client.MINE, core.MINE, server.MINE, strategies.MINE) == ('client', 'core', 'server', 'strategies')\n"
    "print(headway.client.app.__file__); print(headway.core.settings.__file__); print(headway.strategies.fedavg.__file__)\n"
)


@pytest.mark.slow
@pytest.mark.parametrize("install", ["wheel", "checkout"])
def test_a_users_client_py_and_core_package_shadow_nothing_of_ours(install, wheel, tmp_path):
    """A user's run folder holding client.py, server.py and packages core/ and strategies/: both theirs and
    headway's import, each from where it lives (the built wheel installed, or this checkout on the path)."""
    user = tmp_path / "my-run"
    for name, text in USER_MODULES.items():
        (user / name).parent.mkdir(parents=True, exist_ok=True)
        (user / name).write_text(text)
    if install == "wheel":
        site = tmp_path / "site"
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(site), wheel.filename],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        home = site / "headway"
    else:
        site, home = ROOT, ROOT
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=user, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    files = [Path(line).resolve() for line in done.stdout.split()]
    assert len(files) == 3 and all(home.resolve() in f.parents and user.resolve() not in f.parents for f in files), files


def bare_imports(source: str) -> list[str]:
    """Modules ``source`` imports (statements, or a constant passed to import_module) under a code folder's
    bare name (``core.x``), which from a checkout would load a second copy beside ``headway.core.x``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            found += [arg.value for arg in node.args[:1] if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
    return [name for name in found if name.split(".")[0] in CODE_FOLDERS]


def test_no_file_imports_a_code_folder_by_its_bare_name():
    assert bare_imports("import core.x\nfrom strategies import y\nimportlib.import_module('client.app')\nfrom . import z\n") == [
        "core.x",
        "strategies",
        "client.app",
    ]
    files = [p for p in ROOT.rglob("*.py") if not {".venv", "build", "results", ".git"} & set(p.relative_to(ROOT).parts)]
    bad = {str(p.relative_to(ROOT)): names for p in files if (names := bare_imports(p.read_text()))}
    assert len(files) > 200 and not bad, bad
