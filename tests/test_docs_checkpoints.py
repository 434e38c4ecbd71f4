"""docs/checkpoints.md's simulation commands, run as printed (tests/doc_commands.py reads them):
a two-round run, then `headway run --resume` extending it to three rounds on the same folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from headway.server.checkpoint import load_checkpoint

from tests.conftest import ROOT
from tests.doc_commands import commands, placeholders

PAGE = ROOT / "docs" / "checkpoints.md"


def test_the_page_prints_a_run_and_its_resume() -> None:
    printed = [c.argv[1:3] for c in commands(PAGE.read_text()) if c.program == "headway"]
    assert printed == [["run", "benchmarks/configs/mnist-table1.toml"], ["run", "--resume"]]


def test_the_printed_run_and_resume_extend_the_run_by_a_round(tmp_path: Path, data_dir: str) -> None:
    text = PAGE.read_text()
    out = tmp_path / "resumable"
    names = placeholders(text)
    env = {**os.environ, "HEADWAY_DATA_DIR": data_dir}
    for cmd in (c for c in commands(text) if c.program == "headway"):
        argv = cmd.substitute({names["OUT"]: str(out)}).argv
        done = subprocess.run([sys.executable, "-m", "headway", *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert summary["status"] == "complete" and summary["rounds"] == 3
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert summary["resumed"][0]["after_round"] == 2
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["round-000001.ckpt", "round-000002.ckpt", "round-000003.ckpt"]
    # the clients' state is filed under the run's random key, the same after the resume (not the public run id)
    ckpt = load_checkpoint(out)
    assert ckpt is not None
    key = ckpt.run_key
    assert len(key) == 32 and int(key, 16) >= 0
    assert sorted(p.name for p in (out / "client-state").iterdir() if p.is_dir()) == [f"run-{key}"]
