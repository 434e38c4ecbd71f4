"""The compute floor (benchmarks/floor.py) does the simulation's client work: run through
Flower's engine and as the floor, FedLog gives the same accuracy round by round."""

from __future__ import annotations

import json

import numpy as np
import pytest
from headway.core.settings import Settings
from headway.simulation import simulate

from benchmarks.floor import CONFIG, load_cfg, repeated_mnist, run_floor, setup_sets

VARIANTS = {
    "fedlog": [],
    # FedLog-C with every wire option that changes what a client receives or sends
    "fedlog-c-sparse-float16": [
        "fedlog-alpha=0.5",
        "fedlog-uplink=sparse",
        "fedlog-uplink-dtype=float16",
        "fedlog-wire-dtype=float16",
        "fedlog-clip=4.0",
    ],
}


def config(data_dir: str, extra: list[str]) -> Settings:
    sets, _ = setup_sets(4, 2, data_dir)
    return load_cfg(CONFIG, [*sets, "local-epochs=1", f"data-dir={data_dir}", "sample-timeout=60", *extra])


@pytest.mark.system
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_floor_accuracy_equals_the_simulation_round_by_round(tmp_path, data_dir, variant):
    cfg = config(data_dir, VARIANTS[variant])
    simulate(cfg, tmp_path / "sim")
    sim = [json.loads(line)["accuracy"] for line in (tmp_path / "sim" / "rounds.jsonl").read_text().splitlines()]
    floor = [r["accuracy"] for r in run_floor(cfg, processes=2)]
    assert len(sim) == 2 and all(a is not None for a in sim)
    assert floor == sim  # exact: rounds.jsonl stores the accuracy as the float it is


@pytest.mark.system
def test_floor_in_one_process_equals_two(data_dir):
    cfg = config(data_dir, ["num-server-rounds=1"])
    one, two = ([r["accuracy"] for r in run_floor(cfg, processes=p)] for p in (1, 2))
    assert len(one) == 1 and one[0] is not None and one == two  # one round scored, not two empty lists


@pytest.mark.system
def test_repeated_mnist_source_for_more_clients_than_mnist_feeds(tmp_path, data_dir, monkeypatch):
    """Beyond 1 000 clients the setup reads MNIST repeated, each copy shifted, 60 images a client."""
    monkeypatch.setenv("HEADWAY_BENCH_CACHE", str(tmp_path))
    sets, data = setup_sets(2000, 1, data_dir)
    path = repeated_mnist(2, data_dir)
    assert f"dataset={path}" in sets and "train-fraction=1" in sets and "x2" in data
    with np.load(path) as z:
        x, y = z["x_train"], z["y_train"]
        assert x.shape == (120_000, 28, 28) and x.dtype == np.uint8 and len(z["x_test"]) == 20_000
    assert np.array_equal(y[:60_000], y[60_000:])
    assert np.array_equal(np.roll(x[:60_000], (0, 1), axis=(1, 2)), x[60_000:])
    assert not np.array_equal(x[:60_000], x[60_000:])
    cfg = load_cfg(CONFIG, [*sets, f"data-dir={data_dir}"])
    from headway.core.partition import make_partition
    from headway.core.run_data import load_run_dataset

    part = make_partition(load_run_dataset(cfg), cfg)
    sizes = [len(t) for t in part.train]  # the pathological split's shards: 60 a client on average, as in Table 1
    assert len(sizes) == 2000 and sum(sizes) == 120_000 and 50 <= min(sizes) <= max(sizes) <= 70


def test_committed_scale_results_name_the_bench_cache_not_this_machines_path(tmp_path, monkeypatch):
    """A scale run's config.json and summary.json name generated data by $HEADWAY_BENCH_CACHE."""
    from benchmarks.scale import portable

    monkeypatch.setenv("HEADWAY_BENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"dataset": str(tmp_path / "cache" / "mnist-x10.npz"), "seed": 0}))
    portable(out)
    assert json.loads((out / "config.json").read_text()) == {"dataset": "$HEADWAY_BENCH_CACHE/mnist-x10.npz", "seed": 0}


def test_scale_rows_name_their_flower_and_go_to_the_out_folder(tmp_path, monkeypatch):
    """Every row names the Flower it ran on and goes to --out's table, where a row written
    before the field existed still loads and is not run again."""
    import flwr

    from benchmarks import scale

    old = {"kind": "floor-2p", "clients": 3, "rounds": 1, "round1_seconds": 1.0, "seconds_per_round": 1.0, "accuracy": [0.5]}
    old |= {"peak_rss_gib": 1.0, "peak_pss_gib": 1.0}
    (tmp_path / "scale.jsonl").write_text(json.dumps(old) + "\n")
    fake = {**old, "kind": "simulation", "data": "d", "wall_seconds": 1.0, "bytes_per_round": 1}
    folders = []

    def run_simulation(*args: object) -> dict:
        folders.append(args[-1])
        return dict(fake)

    monkeypatch.setattr(scale, "run_floor", lambda *a: pytest.fail("the floor row is in the table already"))
    monkeypatch.setattr(scale, "run_simulation", run_simulation)
    monkeypatch.setattr(scale, "plot", lambda rows, path: path)
    assert scale.main(["--clients", "3", "--rounds", "1", "--out", str(tmp_path)]) == 0
    rows = scale.load_rows(tmp_path / "scale.jsonl")
    assert folders == [tmp_path.resolve()] and [r.get("flwr") for r in rows] == [None, flwr.__version__]
    assert f"Flower: {flwr.__version__}, not recorded." in (tmp_path / "scale.md").read_text()
