"""No hand-written list of methods in the docs or the keys' help: a sentence naming three or more
declared methods in a row goes false when a method is added, so prose points to the table that
`headway generate` writes into docs/methods.md (from the strategies and the declarations) instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from headway.core.methods import METHODS
from headway.core.settings import SCHEMA

from headway import generate

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
LONGEST = 2  # the most declared method names one list may hold
NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)*")  # "LG-FedAvg" is one name, "FedProf's" is FedProf
# what may stand between two names of one list: commas, slashes, 'and'/'or', markup, a parenthesis without a name
BETWEEN = re.compile(r"(?:[\s,/`*]|\band\b|\bor\b|\([^()]*\))*")
GENERATED = re.compile(rf"^{re.escape('<!-- BEGIN generated')}.*?^{re.escape(generate.TABLE_END)}$", re.S | re.M)


def method_lists(text: str) -> list[list[str]]:
    """The runs of declared method names in ``text`` joined only by list separators, longer than LONGEST."""
    names = {name.lower() for name in METHODS}
    hits = [m for m in NAME.finditer(text) if m.group().lower() in names]
    runs: list[list[re.Match[str]]] = []
    for hit in hits:
        if runs and BETWEEN.fullmatch(text, runs[-1][-1].end(), hit.start()):
            runs[-1].append(hit)
        else:
            runs.append([hit])
    return [[m.group() for m in run] for run in runs if len(run) > LONGEST]


def outside_generated(text: str) -> str:
    """``text`` less the blocks `headway generate` writes (they list every method by construction)."""
    return GENERATED.sub("", text)


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_no_doc_lists_methods_by_hand(doc):
    if doc.name == Path(generate.DOC).name:  # generated from the declarations: true by construction
        return
    found = method_lists(outside_generated(doc.read_text()))
    assert not found, f"{doc.relative_to(ROOT)} lists methods by hand {found}: point to docs/methods.md's generated table instead"


def test_no_key_help_lists_methods():
    found = {name: method_lists(key.help) for name, key in SCHEMA.items() if method_lists(key.help)}
    assert not found, f"help texts list methods by hand (core/settings.py): {found}; say the rule instead"


def test_a_hand_list_is_found_and_the_generated_table_is_not():
    """The scan itself: what it must catch and what it must let pass."""
    assert method_lists("FedAvg, FedProx, LG-FedAvg (global layers), FedPer and `fedrep`.") == [
        ["FedAvg", "FedProx", "LG-FedAvg", "FedPer", "fedrep"]
    ]
    assert method_lists("fedavg/fedprox/fedper: how") == [["fedavg", "fedprox", "fedper"]]
    assert method_lists("FedAvg and FedProx; see FedPer, which differs from FedRep and FedLog") == []
    assert method_lists("FedLog-C, DP-FedLog and FedProf") == []
    assert method_lists(outside_generated(generate.capability_table())) == []
    assert method_lists(generate.capability_table()) == []  # one method a row: no row is a list either
