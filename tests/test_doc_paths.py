"""The README's and docs/'s claims of which file holds what: every source file they name in
backticks exists, and where they name a definition in it (`strategies/replies.py: decode`), the
file defines it. A module split or a renamed function then fails here instead of leaving the
page pointing at nothing."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# a backticked path into the code, optionally followed by ": name" (a function, class or constant there)
NAMED = re.compile(r"`((?:core|client|server|strategies|simulation|headway|tests|benchmarks)/[\w/]+\.py)(?::\s*(\w+))?`")


def claims(page_text: str) -> list[tuple[str, str | None]]:
    """The (path, name or None) pairs a page names; a placeholder such as ``benchmarks/NAME.py`` is no claim."""
    return [(m.group(1), m.group(2)) for m in NAMED.finditer(page_text) if not re.search(r"/[A-Z_]+\.py$", m.group(1))]


def defines(source: str, name: str) -> bool:
    """Whether ``source`` defines ``name``: a def or class at any depth, or a module-level assignment."""
    return bool(re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^{name}\s*[:=]", source, re.MULTILINE))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_files_and_names_a_page_points_to_exist(page):
    problems = []
    for path, name in claims(page.read_text()):
        target = ROOT / path
        if not target.is_file():
            problems.append(f"{path}: no such file")
        elif name and not defines(target.read_text(), name):
            problems.append(f"{path}: defines no {name}")
    assert not problems, problems


def test_the_pages_name_files_at_all():
    """The pattern still finds what the pages say, so the test above cannot pass on nothing."""
    found = {path for page in PAGES for path, _ in claims(page.read_text())}
    assert {"core/gmm.py", "strategies/replies.py", "simulation/flower_fixes.py"} <= found, sorted(found)
    assert any(name for page in PAGES for _, name in claims(page.read_text()))
