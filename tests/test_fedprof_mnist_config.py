"""benchmarks/configs/fedprof-mnist.toml run as printed (``headway run`` with no --set) runs FedProf,
not the default method: an outside tester ran it and got FedLog."""

from __future__ import annotations

import tomllib

from headway.core.config import resolve_settings

from tests.conftest import ROOT


def test_the_fedprof_mnist_config_runs_fedprof_as_printed():
    run_config = tomllib.loads((ROOT / "benchmarks" / "configs" / "fedprof-mnist.toml").read_text())["run-config"]
    assert resolve_settings(run_config, import_bodies=False).algorithm == "fedprof"
