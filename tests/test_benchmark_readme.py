"""benchmarks/README.md and benchmarks/results/ agree: every results path the README names
exists, and every folder or file under benchmarks/results/ is named by the README (or listed
below as uncited on purpose, with the reason). A figure cannot then cite a run that is not
committed, and a committed run cannot sit there with no figure saying what it is."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from tests.conftest import ROOT

README = ROOT / "benchmarks" / "README.md"
RESULTS = ROOT / "benchmarks" / "results"

# results/<path> as the README writes it (also benchmarks/results/<path>); '*' allowed as a glob
CITATION = re.compile(r"(?<![\w.-])(?:benchmarks/)?results/([\w.*/-]*)")

# path under benchmarks/results -> why no figure in the README cites it
UNCITED_ON_PURPOSE: dict[str, str] = {}


def citations(text: str) -> set[str]:
    """The results paths ``text`` names, relative to benchmarks/results, without a trailing slash
    or full stop; the bare folder name ``results/`` is no citation."""
    found = {m.group(1).rstrip("./") for m in CITATION.finditer(text)}
    return {path for path in found if path}


def exists(path: str, results: Path) -> bool:
    """Whether the cited ``path`` (a glob where it holds '*') names anything under ``results``."""
    return any(results.glob(path)) if "*" in path else (results / path).exists()


def covered(path: str, cited: set[str]) -> bool:
    """Whether ``path`` or a folder above it is cited (a glob citation matches as fnmatch does)."""
    parts = path.split("/")
    prefixes = {"/".join(parts[: i + 1]) for i in range(len(parts))}
    return any(fnmatch.fnmatchcase(prefix, c) for c in cited for prefix in prefixes)


def uncited(results: Path, cited: set[str]) -> list[str]:
    """Entries under ``results`` that no citation covers. An entry that holds a cited path deeper
    down (``lg-fedavg/`` for ``lg-fedavg/table4/``) is not cited as a whole: each of its own
    entries must be."""
    missing: list[str] = []

    def walk(folder: Path) -> None:
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith("."):
                continue
            rel = entry.relative_to(results).as_posix()
            if covered(rel, cited):
                continue
            if entry.is_dir() and any(c.startswith(rel + "/") for c in cited):
                walk(entry)
            else:
                missing.append(rel)

    walk(results)
    return missing


def test_every_results_path_the_readme_names_exists():
    cited = citations(README.read_text())
    absent = sorted(path for path in cited if not exists(path, RESULTS))
    assert not absent, f"benchmarks/README.md cites results that are not in benchmarks/results: {absent}; commit the run or fix the path"


def test_every_results_folder_is_cited_by_the_readme():
    cited = citations(README.read_text())
    missing = [path for path in uncited(RESULTS, cited) if path not in UNCITED_ON_PURPOSE]
    assert not missing, (
        f"benchmarks/results holds runs no figure in benchmarks/README.md names: {missing}; "
        "cite each beside its figure as results/<path>/, or list it in UNCITED_ON_PURPOSE with the reason"
    )


def test_the_uncited_list_holds_only_uncited_runs_that_exist():
    cited = citations(README.read_text())
    stale = sorted(path for path in UNCITED_ON_PURPOSE if not (RESULTS / path).exists() or covered(path, cited))
    assert not stale, f"UNCITED_ON_PURPOSE lists runs that are gone or now cited: {stale}; remove them from the list"


def test_the_checks_find_what_they_look_for(tmp_path):
    """On a made-up tree: a cited path that is missing, an uncited run beside cited ones, a glob
    and a nested citation, so the checks above cannot pass on nothing."""
    for folder in ("a/run-s0", "b/x/run", "b/y/run", "c/steps/1-one", "d"):
        (tmp_path / folder).mkdir(parents=True)
    text = "see `results/a/` and `benchmarks/results/b/x/`, `results/c/steps/1-*` and results/e/. Every folder under `results/`"
    cited = citations(text)
    assert cited == {"a", "b/x", "c/steps/1-*", "e"}
    assert [path for path in sorted(cited) if not exists(path, tmp_path)] == ["e"]
    assert uncited(tmp_path, cited) == ["b/y", "d"]
