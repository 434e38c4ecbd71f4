"""Run one experiment through Flower's simulation engine and write its results folder.

    python -m server.run CONFIG.toml --out DIR [--set key=value ...]

CONFIG.toml holds run-config keys (top level, or under [run-config]); --set overrides
them. Every virtual client is a Flower SuperNode in Flower's Ray-based simulation.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

from core.config import ConfigError, resolve
from core.data import DatasetMissingError, load_dataset


def parse_value(text: str) -> Any:
    """A --set value as TOML would read it (numbers, booleans), else the raw string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def load_config(path: str | None, sets: list[str]) -> dict[str, Any]:
    """Keys from CONFIG.toml overlaid with ``key=value`` overrides, validated."""
    cfg: dict[str, Any] = {}
    if path:
        data = tomllib.loads(Path(path).read_text())
        cfg.update(data.get("run-config", {k: v for k, v in data.items() if not isinstance(v, dict)}))
    for item in sets:
        if "=" not in item:
            raise ConfigError(f"--set takes key=value, got {item!r}")
        key, value = item.split("=", 1)
        cfg[key.strip()] = parse_value(value.strip())
    return resolve(cfg)


def simulate(cfg: dict[str, Any], out_dir: str | Path, verbose: bool = False) -> dict[str, Any]:
    """Run ``cfg`` with ``num-clients`` virtual SuperNodes; returns summary.json's content."""
    from flwr.simulation import run_simulation

    from client.app import build_client_app
    from server.app import build_server_app

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    backend = {
        "client_resources": {"num_cpus": cfg["client-num-cpus"], "num_gpus": cfg["client-num-gpus"]},
        "init_args": {"include_dashboard": False, "logging_level": logging.WARNING},
    }
    run_simulation(
        server_app=build_server_app(cfg, out_dir),
        client_app=build_client_app(cfg),
        num_supernodes=cfg["num-clients"],
        backend_config=backend,
        verbose_logging=verbose,
    )
    summary = Path(out_dir) / "summary.json"
    if not summary.exists():
        raise RuntimeError(f"the run ended without writing {summary}; see the log above")
    return json.loads(summary.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="TOML file of run-config keys")
    parser.add_argument("--out", required=True, help="results folder to write")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a run-config key (repeatable)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.set)
    except (ConfigError, OSError, tomllib.TOMLDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        load_dataset(cfg["dataset"], cfg["data-dir"], cfg["seed"])  # a missing data set fails here, once
    except DatasetMissingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = simulate(cfg, args.out, args.verbose)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
