"""docs/your-data.md's commands, taken from the page's text (tests/doc_commands.py) and run as printed.

The page's placeholders (its ``<!-- doc-test: ... -->`` comment) point at data this test writes: a
folder of 32×32 colour PNGs in class folders, and a CSV of UCI Adult rows (generated rows where the
shared data is absent). Commands run in a temporary folder that links the checkout's ``.venv`` and
``examples``, so relative paths mean what they mean at the repository root. How each kind is treated:

- ``headway run``: run for real, with ``TINY`` appended (later ``--set`` values win: 3 clients,
  2 rounds, 1 local epoch) so it stays fast; it must exit 0 with a complete summary, and a run that
  names no body must have picked the one that fits (config.json's ``body``).
- ``headway split``: run for real (it needs MNIST; skipped, saying why, without it).
- ``headway supernode``: run with ``--dry-run`` (no SuperLink here): the launcher must accept every
  argument and print Flower's command. The real deployment is tests/test_docs_deployment.py's.
- ``flwr run``: its ``--run-config`` is parsed by Flower's parser and checked by headway's schema.

A command of another kind makes the test fail: every command on the page is run or checked.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, data_root, missing_data
from tests.doc_commands import DocCommand, commands, placeholders

PAGE = ROOT / "docs" / "your-data.md"
TINY = ["--set", "num-clients=3", "--set", "num-server-rounds=2", "--set", "local-epochs=1"]
COLOURS = {"red": (200, 40, 40), "green": (40, 200, 40), "blue": (40, 40, 200)}
ADULT = ["age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation", "relationship", "race", "sex"]
ADULT += ["capital-gain", "capital-loss", "hours-per-week", "native-country", "income"]


def write_png_folder(root: Path, train: int = 20, test: int = 6) -> Path:
    """ROOT/train/<colour>/*.png and ROOT/test/<colour>/*.png: 32×32 RGB images, noisy around the class's colour."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("test", test)):
        for name, colour in COLOURS.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = np.clip(np.array(colour)[None, None, :] + rng.normal(0, 40, (32, 32, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def write_table(path: Path, rows: int = 300) -> Path:
    """A scikit-learn-style CSV with a header and an 'income' label: UCI Adult's first rows, or generated ones without it."""
    source = data_root() / "uci-adult" / "adult.data"
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(ADULT)
        if source.is_file():
            with open(source) as fh:
                kept = [r for r in csv.reader(fh, skipinitialspace=True) if len(r) == len(ADULT)]
            writer.writerows(kept[:rows])
            return path
        rng = np.random.default_rng(0)
        for _ in range(rows):
            age, hours = int(rng.integers(18, 80)), int(rng.integers(10, 70))
            rich = age > 40 and hours > 40
            row = [age, "Private", 100000, "HS-grad", 9, "Never-married", "Sales", "Husband", "White", "Male", 0, 0, hours]
            writer.writerow([*row, "United-States", ">50K" if rich else "<=50K"])
    return path


@pytest.fixture(scope="module")
def page_commands() -> list[DocCommand]:
    return commands(PAGE)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A folder standing in for the repository root, and the page's placeholders bound to this test's data."""
    work = tmp_path_factory.mktemp("your-data")
    for name in (".venv", "examples"):
        (work / name).symlink_to(ROOT / name)
    names = placeholders(PAGE)
    assert {"ROOT", "TABLE"} <= set(names), f"{PAGE.name} must define the placeholders ROOT and TABLE in its doc-test comment"
    values = {names["ROOT"]: str(write_png_folder(work / "pngs")), names["TABLE"]: str(write_table(work / "table.csv"))}
    return work, values


def run(cmd: DocCommand, cwd: Path, extra: list[str] | None = None, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` as printed (its environment words too) in ``cwd``, with ``extra`` arguments appended."""
    env = {**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", **cmd.env}
    if "PYTHONPATH" in cmd.env:  # relative entries are relative to cwd, as in a shell; Ray's workers need them absolute
        env["PYTHONPATH"] = os.pathsep.join(str((cwd / p).resolve()) for p in cmd.env["PYTHONPATH"].split(os.pathsep))
    env.setdefault("HEADWAY_DATA_DIR", str(data_root()))
    return subprocess.run([*cmd.argv, *(extra or [])], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def kind(cmd: DocCommand) -> str:
    return f"{cmd.program} {cmd.argv[1] if len(cmd.argv) > 1 else ''}".strip()


def test_every_command_on_the_page_is_one_this_test_runs_or_checks(page_commands):
    assert page_commands, f"no commands found in {PAGE}"
    known = {"headway run", "headway split", "headway supernode", "flwr run"}
    unknown = [f"line {c.line}: {c.text}" for c in page_commands if kind(c) not in known]
    assert not unknown, f"commands in {PAGE.name} that no test runs: {unknown}"
    assert sum(kind(c) == "headway run" for c in page_commands) >= 3  # images, a table, your own body


def test_every_run_on_the_page_is_a_small_one(page_commands):
    """The page promises five minutes: a run that names no client or round count runs the defaults (50 clients x
    100 rounds: 6.3 min on a tester's 400 images), so each names both, at most 10 clients and 20 rounds."""
    for cmd in (c for c in page_commands if kind(c) == "headway run"):
        keys = dict(s.split("=", 1) for s in cmd.option("--set"))
        counts = {k: keys.get(k, "the default") for k in ("num-clients", "num-server-rounds")}
        small = counts["num-clients"].isdigit() and int(counts["num-clients"]) <= 10
        small = small and counts["num-server-rounds"].isdigit() and int(counts["num-server-rounds"]) <= 20
        assert small, f"line {cmd.line}: {cmd.text} runs {counts}"


def test_the_supernode_commands_are_accepted_by_the_launcher(page_commands, workdir):
    work, values = workdir
    nodes = [c.substitute(values) for c in page_commands if kind(c) == "headway supernode"]
    assert nodes
    for cmd in nodes:
        done = run(cmd, work, ["--dry-run"], timeout=60)
        assert done.returncode == 0, f"line {cmd.line}: {cmd.text}\n{done.stderr}"
        assert done.stdout.startswith("flower-supernode ") and "--node-config data=" in done.stdout, done.stdout


def test_the_flwr_run_config_is_one_headway_accepts(page_commands):
    from flwr.common.config import parse_config_args
    from headway.core.config import resolve

    runs = [c for c in page_commands if kind(c) == "flwr run"]
    assert runs
    for cmd in runs:
        keys = parse_config_args(cmd.option("--run-config"))
        assert resolve(keys)["dataset"] == keys.get("dataset", "mnist"), cmd.text  # ConfigError on an unknown key or a bad value


@pytest.mark.system  # whole real runs: make test-system keeps make test under 15 minutes
@pytest.mark.integration
@pytest.mark.slow
def test_the_headway_run_commands_run_as_printed(page_commands, workdir):
    work, values = workdir
    runs = [c.substitute(values) for c in page_commands if kind(c) == "headway run"]
    for cmd in runs:
        done = run(cmd, work, TINY)
        out = work / cmd.option("--out")[0]
        assert done.returncode == 0, f"line {cmd.line}: {cmd.text} exited {done.returncode}\n{done.stderr[-3000:]}"
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["rounds"] == 2 and summary["failures"] == 0, summary
        named = [s.split("=", 1)[1] for s in cmd.option("--set") if s.startswith("body=")]
        config = json.loads((out / "config.json").read_text())
        table = any(s.startswith("dataset=") and s.endswith(".csv") for s in cmd.option("--set"))
        expected = named[0] if named else ("mlp" if table else "cifar-cnn")  # no body named: the one that fits the data
        assert config["body"] == expected and set(summary["participants"].values()) == {expected}, (cmd.text, config["body"])


@pytest.mark.slow
def test_the_split_command_writes_node_folders(page_commands, workdir):
    work, _ = workdir
    if not (data_root() / "mnist").is_dir():
        missing_data(f"MNIST not found in {data_root()}: the page's split command splits it")
    splits = [c for c in page_commands if kind(c) == "headway split"]
    assert splits
    for cmd in splits:
        done = run(cmd, work, timeout=300)
        assert done.returncode == 0, f"line {cmd.line}: {cmd.text}\n{done.stderr[-3000:]}"
        out = work / cmd.option("--out")[0]
        assert sorted(p.name for p in out.iterdir()) == [f"node-{i}" for i in range(int(cmd.option("--num-clients")[0]))]


def test_a_run_without_a_body_fits_the_data_and_a_named_misfit_names_those_that_fit():
    """The default body follows the inputs' shape (MNIST keeps the papers' mnist-cnn); a named
    body that does not fit is refused naming the bodies that do."""
    from headway.core.config import ConfigError, check_bodies, fitted_body, resolve_settings

    cfg = resolve_settings({})
    assert cfg.body == "auto"
    assert fitted_body(cfg, (1, 28, 28)) == "mnist-cnn"  # MNIST: the paper setting
    assert fitted_body(cfg, (3, 32, 32)) == "cifar-cnn"
    assert fitted_body(cfg, (3, 64, 48)) == "image-cnn"
    assert fitted_body(cfg, (108,)) == "mlp"
    assert fitted_body(resolve_settings({"body": "mnist-cnn"}), (3, 32, 32)) == "mnist-cnn"  # a named body is kept as named
    with pytest.raises(ConfigError) as err:
        check_bodies(resolve_settings({"body": "mnist-cnn"}), (3, 32, 32))
    assert "bodies that fit inputs of shape (3, 32, 32): cifar-cnn" in str(err.value) and "image-cnn" in str(err.value)
    assert "mnist-cnn" not in str(err.value).split("bodies that fit")[1]
    with pytest.raises(ConfigError, match="bodies that fit inputs of shape \\(14,\\): linear, mlp, mlp-deep"):
        check_bodies(resolve_settings({"body": "cifar-cnn"}), (14,))


def test_server_and_client_pick_the_same_body_from_the_same_inputs():
    """The server's build_strategy and a client's environment resolve body=auto alike, and the
    server's settings (what config.json records) name the concrete body."""
    from headway.core.config import resolve_settings
    from headway.server.app import build_strategy

    cfg = resolve_settings({"dataset": "uci-adult", "num-clients": 3, "partition": "iid", "algorithm": "fedavg"})
    if not (data_root() / "uci-adult").is_dir():
        missing_data(f"UCI Adult not found in {data_root()}")
    strategy = build_strategy(cfg)
    assert strategy.settings.body == strategy.settings.to_config()["body"] == "mlp"
    assert cfg.body == "auto"  # the settings are frozen: the strategy holds a fitted copy
    from headway.client.env import client_env

    env = client_env({"dataset": "uci-adult", "num-clients": 3, "partition": "iid", "algorithm": "fedavg"}, {"partition-id": 0})
    assert env.body == "mlp"
