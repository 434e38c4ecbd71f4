"""docs/testing.md's mechanical claims against the files they describe: the markers it names
are the registered ones, each suite's make target selects the markers the page puts in it,
the commands and files it names exist, CI runs what it says with the data required, the time
limits are the configured ones, and a missing data set fails under HEADWAY_REQUIRE_DATA=1."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib

import pytest

from tests.conftest import ROOT, SYSTEM_TIMEOUT_S

PAGE = (ROOT / "docs" / "testing.md").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()
PYTEST_INI = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
SUITES = ("test-fast", "test", "test-system")  # the make targets that run pytest


def registered_markers() -> set[str]:
    """The marker names of pyproject's ``markers`` list (``name: help`` or ``name(args): help``)."""
    return {re.split(r"[:(]", line, maxsplit=1)[0].strip() for line in PYTEST_INI["markers"]}


def marker_table() -> dict[str, str]:
    """The page's marker table: marker (``""`` for the row of tests with none) -> its "in" cell."""
    section = PAGE.split("## Markers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (`\w+`|\(none\)) \| .+? \| (.+?) \|$", section, re.MULTILINE)
    return {name.strip("`") if name != "(none)" else "": cell for name, cell in rows}


def recipe(target: str) -> str:
    """The first command of a Makefile target."""
    found = re.search(rf"^{re.escape(target)}:.*\n\t(.+)$", MAKEFILE, re.MULTILINE)
    assert found, f"the Makefile has no target {target!r}"
    return found.group(1)


def selects(target: str, marker: str) -> bool:
    """Whether ``make target``'s ``-m`` expression selects a test carrying only ``marker`` ("" for none).
    A marker name the expression uses but pyproject does not register is a KeyError here."""
    expression = re.search(r'pytest\b.*? -m (?:"([^"]+)"|(\w+))', recipe(target))
    assert expression, f"make {target} selects no marker expression: {recipe(target)}"
    names = {m: m == marker for m in registered_markers()}
    # pytest's -m grammar is names, and, or, not and parentheses: Python's own, evaluated with nothing else in scope
    return bool(eval(expression.group(1) or expression.group(2), {"__builtins__": {}}, names))


def test_the_markers_the_page_names_are_the_registered_ones():
    table = marker_table()
    assert "" in table and len(table) >= 5, table
    assert set(table) - {""} == registered_markers()
    assert "--strict-markers" in PYTEST_INI["addopts"]  # the page says a misspelt marker is an error


def test_each_suite_runs_the_markers_the_page_puts_in_it():
    for marker, cell in marker_table().items():
        named = set(re.findall(r"`make ([\w-]+)`", cell))
        if not named:  # needs_data: its suites are those of the test's other markers
            assert "other markers" in cell, (marker, cell)
            continue
        assert named == {t for t in SUITES if selects(t, marker)}, (marker or "(none)", cell)


def test_the_make_commands_the_page_names_are_targets():
    named = set(re.findall(r"`?make ([\w-]+)", PAGE))
    assert {"test", "test-fast", "test-system", "lint"} <= named
    targets = set(re.findall(r"^([\w-]+):", MAKEFILE, re.MULTILINE))
    assert named <= targets, named - targets


def test_ci_runs_what_the_page_says_with_the_data_required():
    ci = (ROOT / ".ci" / "run").read_text()
    said = re.search(r"CI \(`\.ci/run`\) runs (.+?)\.", PAGE.replace("\n", " "))
    assert said, "the page no longer says what CI runs"
    assert re.findall(r"`make ([\w-]+)`", said.group(1)) == re.findall(r"^make ([\w-]+)", ci, re.MULTILINE)
    assert re.search(r"^export HEADWAY_REQUIRE_DATA=1$", ci, re.MULTILINE) and "HEADWAY_REQUIRE_DATA=1" in PAGE
    first_make = re.search(r"^make ", ci, re.MULTILINE)
    assert first_make and ci.index("HEADWAY_REQUIRE_DATA=1") < first_make.start()


def test_the_files_the_page_names_exist():
    named = set(re.findall(r"`((?:tests|client|core|server|strategies|simulation|headway|\.ci)/[\w./-]+)`", PAGE))
    named |= {p for p in re.findall(r"`([\w.-]+\.toml)`", PAGE)}
    assert "tests/conftest.py" in named and "pyproject.toml" in named
    missing = sorted(p for p in named if not (ROOT / p.split(":")[0]).exists())
    assert not missing, missing


def test_the_suite_bullets_name_files_that_hold_tests_of_their_marker():
    bullets = re.findall(r"^- \*\*[^*]+\*\* \(`(\w+)`\):(.+?)(?=^- |^## |\Z)", PAGE, re.MULTILINE | re.DOTALL)
    assert {marker for marker, _ in bullets} >= {"integration", "deployment", "system"}, bullets
    checked = 0
    for marker, text in bullets:
        for path in re.findall(r"`(tests/\w+\.py)`", text):
            assert f"pytest.mark.{marker}" in (ROOT / path).read_text(), (path, marker)
            checked += 1
    assert checked >= 3  # the System bullet names its files


def test_the_time_limits_are_the_configured_ones():
    section = PAGE.split("## Time limits", 1)[1].split("\n## ", 1)[0].replace("\n", " ")
    default, system = (int(n.replace(",", "")) for n in re.findall(r"([\d,]+) s (?:by default|for `system` tests)", section))
    assert default == int(PYTEST_INI["timeout"]) and system == SYSTEM_TIMEOUT_S
    assert 'timeout_method = "signal"' in section and PYTEST_INI["timeout_method"] == "signal"


PROBE = """
import pytest
from tests.conftest import needs_data


@needs_data("no-such-data-set")
def test_marked():
    pass


def test_fixture(data_dir):
    pass


def test_own_check():
    pytest.skip("adult.data not found: set HEADWAY_DATA_DIR")


def test_not_about_data():
    pytest.skip("needs root")
"""


@pytest.mark.parametrize("required, expected", [("", "ssss"), ("1", "EEFs")])
def test_a_missing_data_set_skips_or_under_require_data_fails(tmp_path, required, expected):
    """The conftest's rules on an empty data folder: each kind of data skip (marker, fixture,
    a test's own check naming HEADWAY_DATA_DIR) skips, or fails under HEADWAY_REQUIRE_DATA=1;
    a skip for another reason stays a skip."""
    (tmp_path / "data").mkdir()
    probe = tmp_path / "test_probe.py"
    probe.write_text(textwrap.dedent(PROBE))
    env = {**os.environ, "HEADWAY_DATA_DIR": str(tmp_path / "data"), "HEADWAY_REQUIRE_DATA": required, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path)]
    done = subprocess.run(
        [*cmd, "-v", "-p", "no:cacheprovider", str(probe)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    outcome = {"SKIPPED": "s", "ERROR": "E", "FAILED": "F", "PASSED": "."}
    got = {m.group(1): outcome[m.group(2)] for m in re.finditer(r"::(test_\w+) (SKIPPED|ERROR|FAILED|PASSED)\b", done.stdout)}
    order = ["test_marked", "test_fixture", "test_own_check", "test_not_about_data"]
    assert "".join(got.get(name, "?") for name in order) == expected, done.stdout[-3000:]
    assert done.returncode == (1 if required else 0), done.stdout[-3000:]
    if required:
        assert done.stdout.count("HEADWAY_REQUIRE_DATA=1: missing data fails the test") >= 3, done.stdout[-3000:]


def test_the_lint_rules_and_typed_packages_are_the_configured_ones():
    """The Lint section's ruff rule codes are all selected, and the packages it says mypy
    requires typed are exactly those with ``disallow_untyped_defs``, none exempted."""
    section = PAGE.split("## Lint", 1)[1].split("\n## ", 1)[0]
    tools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    codes = set(re.findall(r"`([A-Z]+\d*)`", section))
    assert {"PT", "SIM", "D101", "D102", "D103"} <= codes and codes <= set(tools["ruff"]["lint"]["select"]), codes
    typed = set(re.findall(r"`(\w+)`", section.split("requires", 1)[1].split("(`disallow_untyped_defs`", 1)[0]))
    overrides = tools["mypy"]["overrides"]
    required = {m.removesuffix(".*") for o in overrides if o.get("disallow_untyped_defs") for m in o["module"]}
    packages = set(tools["setuptools"]["packages"])
    assert required == {"headway"} and {f"headway.{name}" for name in typed - {"headway"}} == {p for p in packages if p.count(".") == 1}, (
        typed,
        required,
    )
    exempted = [m for o in overrides if o.get("disallow_untyped_defs") is False for m in o["module"] if m.split(".")[0] in required]
    assert "no module exempted" in section and not exempted, exempted
