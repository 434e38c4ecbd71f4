"""Stream salts (core/seeds.py): a method's own stream takes its salt from its name, declared in its
module, and the salts every existing result depends on stay what they were."""

from __future__ import annotations

import re
from pathlib import Path

from headway.core import seeds

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("core", "client", "server", "strategies", "simulation", "headway")
DECLARED = re.compile(r"""seeds\.salt\(\s*["']([^"']+)["']\s*\)""")


def named_streams() -> list[str]:
    """Every stream name passed to ``seeds.salt`` in the product code."""
    return [name for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py")) for name in DECLARED.findall(path.read_text())]


def test_a_salt_is_a_stable_32_bit_hash_of_its_name():
    assert seeds.salt("fedbabu-finetune") == 0x39E8DBE0  # sha256 of the tagged name: the same on every machine and version
    assert seeds.salt("fedbabu-finetune") != seeds.salt("fedbabu-finetune2")
    assert all(0 <= seeds.salt(n) < 2**32 for n in ("a", "fedbabu-finetune", "x" * 100))


def test_the_listed_salts_keep_their_values():
    """Every result before named salts drew from these: changing one changes those runs."""
    listed = {
        "DEVICES": 0x656E6572,
        "NOISE": 0x6E6F6973,
        "HOLDOUT": 0x686F6C64,
        "CLIENT_SIZES": 0x73697A65,
        "SERVER_HOLDOUT": 104729,
        "SAMPLING": 7919,
        "HEAD": 1,
        "PER_CLIENT_INIT": "init",
        "BATCHES": 0,
        "FEDREP_HEAD": 2,
        "FEDPFT_MIXTURES": 0x676D6D,
        "FEDPFT_LOCAL_HEAD": 1,
        "FEDPFT_SYNTHESIS": 2,
        "FEDPFT_CHAIN_HEAD": 3,
    }
    assert {name: getattr(seeds, name) for name in listed} == listed


def test_named_streams_are_distinct_and_collide_with_no_listed_salt():
    names = named_streams()
    assert "fedbabu-finetune" in names  # the scan sees the declarations it checks
    assert len(names) == len(set(names)), names
    listed = {value for name, value in vars(seeds).items() if name.isupper()}
    assert not {seeds.salt(n) for n in names} & listed
