"""docs/results.md names every field a run writes: the names it documents, read from its text, against
the keys of a real run's rounds.jsonl and summary.json (the integration runs of test_user_data call
:func:`undocumented`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def documented_patterns(text: str | None = None) -> list[re.Pattern[str]]:
    """Every backticked field name of docs/results.md as a pattern: `eval_bytes_*` and `prepare_*` match any
    tail, `accuracy_p<id>` any id, and a name given as `_share` after another (`secagg_server_cpu_setup`/`_share`)
    any key ending so."""
    text = (ROOT / "docs" / "results.md").read_text() if text is None else text
    out = []
    for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_*<>]*)`", text):
        body = re.escape(name).replace(r"\*", "[a-z0-9_]*")
        body = re.sub(r"<[a-z]+>", r"[0-9]+", body.replace(r"\<", "<").replace(r"\>", ">"))
        out.append(re.compile(("[a-z0-9_]*" if name.startswith("_") else "") + body))
    return out


def undocumented(folder: Path) -> dict[str, list[str]]:
    """The keys of ``folder``'s rounds.jsonl and summary.json (top level) that docs/results.md does not name."""
    patterns = documented_patterns()
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines() if line.strip()]
    files = {"rounds.jsonl": {k for r in rounds for k in r}, "summary.json": set(json.loads((folder / "summary.json").read_text()))}
    return {f: sorted(k for k in keys if not any(p.fullmatch(k) for p in patterns)) for f, keys in files.items()}


def test_patterns_read_the_docs_shorthands():
    patterns = documented_patterns("`eval_bytes_*`, `accuracy_p<id>`, `secagg_server_cpu_setup`/`_share`, `loss`")
    matches = lambda k: any(p.fullmatch(k) for p in patterns)  # noqa: E731
    assert matches("eval_bytes_up") and matches("accuracy_p12") and matches("secagg_server_cpu_share") and matches("loss")
    assert not matches("train_loss") and not matches("accuracy_px") and not matches("losses")


def test_the_fields_the_issue_found_missing_are_documented():
    patterns = documented_patterns()
    for key in (
        "loss",
        "accuracy_client_mean",
        "accuracy_client_min",
        "prepare_clients",
        "test_examples",
        "refused_nodes",
        "train_examples",
    ):
        assert any(p.fullmatch(key) for p in patterns), key
