"""Bodies users bring (issue 24, part 4): an import path ``package.module:factory`` and
torchvision architectures by name (``torchvision:<arch>[@weights.pth]``); refusals as one
line naming the key, before Ray starts; a client's declared body never makes the server
import a module; and a real Flower simulation with the example body."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import flwr.simulation
import headway.simulation as simulation
import pytest
import torch
from headway.core.config import ConfigError, check_bodies, resolve, resolve_settings
from headway.core.models import BODIES, BodyError, TorchvisionBody, body_factory, build_body, build_model

from tests.fakes import FakeGrid, engine_for, make_strategy

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "custom_body"
EXAMPLE_BODY = "headway_example_body:small_cnn"

# a user module with a factory of every kind that must be refused (and one without out_dim)
BAD_BODIES = """
import torch
from torch import nn

not_callable = 3

def raises(input_shape, feature_dim):
    raise RuntimeError("needs a GPU\\nthat is not here")

def wrong_width(input_shape, feature_dim):  # ignores feature_dim: always 7 features
    return nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(input_shape).prod()), 7))

def not_2d(input_shape, feature_dim):
    return nn.Conv2d(input_shape[0], 2, 3)

def no_out_dim(input_shape, feature_dim):  # honours feature_dim, sets no out_dim
    return nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(input_shape).prod()), feature_dim or 12), nn.ReLU())
"""


@pytest.fixture
def example_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    """``bad_bodies`` importable (a module of this test only)."""
    (tmp_path / "bad_bodies.py").write_text(BAD_BODIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("bad_bodies", None)


# ----- 1. an import path -----------------------------------------------------------------
def test_an_import_path_body_builds_and_trains_one_step_in_a_real_model(example_on_path):
    model = build_model(EXAMPLE_BODY, (1, 28, 28), 32, 10, seed=3)
    assert model.body.out_dim == 32 and model.head.in_features == 32
    x, y = torch.rand(8, 1, 28, 28), torch.randint(0, 10, (8,))
    assert model.body(x).shape == (8, 32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and all(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert build_body(EXAMPLE_BODY, (3, 32, 32), 0).out_dim == 64  # feature-dim 0: the factory's own width
    again = build_model(EXAMPLE_BODY, (1, 28, 28), 32, 10, seed=3)  # seeded: every client builds the same model
    assert all(torch.equal(before[k], v) for k, v in again.state_dict().items())


def test_a_body_without_out_dim_gets_its_measured_width(user_modules):
    assert build_body("bad_bodies:no_out_dim", (1, 28, 28), 0).out_dim == 12
    assert build_body("bad_bodies:no_out_dim", (1, 28, 28), 5).out_dim == 5


def _net(body: torch.nn.Module) -> torch.nn.Module:
    """The torchvision network inside a ``torchvision:`` body."""
    assert isinstance(body, TorchvisionBody)
    return body.net


# ----- 2. torchvision architectures by name -------------------------------------------------
@pytest.mark.parametrize("arch, width", [("resnet18", 512), ("mobilenet_v3_small", 1024)])
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_torchvision_architectures_build_with_their_width_or_feature_dim(arch, width, shape):
    body = build_body(f"torchvision:{arch}", shape, 0)
    assert body.out_dim == width and body(torch.zeros(2, *shape)).shape == (2, width)
    first = next(m for m in body.modules() if isinstance(m, torch.nn.Conv2d))
    assert first.in_channels == shape[0]
    assert not any(isinstance(m, torch.nn.Linear) and m.out_features == 1000 for m in _net(body).modules())  # the classifier is gone
    projected = build_body(f"torchvision:{arch}", shape, 16).train()
    assert projected.out_dim == 16 and projected(torch.rand(3, *shape)).shape == (3, 16)  # trains (BatchNorm) at batch 3


def test_torchvision_resnet18_is_the_registry_resnet18():
    """Same construction as the registry's resnet18 (first convolution adapted to gray)."""
    ours, theirs = build_body("torchvision:resnet18", (1, 28, 28), 16, seed=4), build_body("resnet18", (1, 28, 28), 16, seed=4)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))


def test_a_local_weights_file_round_trips(tmp_path):
    from torchvision.models import get_model

    torch.manual_seed(123)
    state = get_model("resnet18", weights=None).state_dict()
    path = tmp_path / "resnet18.pth"
    torch.save(state, path)
    body = build_body(f"torchvision:resnet18@{path}", (3, 32, 32), 0, seed=0)
    loaded = _net(body).state_dict()
    assert set(loaded) == set(state) - {"fc.weight", "fc.bias"}
    assert all(torch.equal(loaded[k], state[k]) for k in loaded)
    assert not torch.equal(
        _net(build_body("torchvision:resnet18", (3, 32, 32), 0, seed=0)).get_parameter("conv1.weight"), state["conv1.weight"]
    )
    gray = build_body(f"torchvision:resnet18@{path}", (1, 28, 28), 0)  # the RGB filters summed for gray inputs
    assert torch.allclose(_net(gray).get_parameter("conv1.weight"), state["conv1.weight"].sum(1, keepdim=True))
    assert torch.equal(_net(gray).get_parameter("layer4.1.conv2.weight"), state["layer4.1.conv2.weight"])


def test_a_weights_file_that_is_missing_or_does_not_fit_is_refused_naming_it(tmp_path):
    from torchvision.models import get_model

    with pytest.raises(ConfigError, match="weights file '.*nope.pth' does not exist") as err:
        resolve({"body": f"torchvision:resnet18@{tmp_path / 'nope.pth'}"})
    assert "'body'" in str(err.value)
    other = tmp_path / "mobilenet.pth"
    torch.save(get_model("mobilenet_v3_small", weights=None).state_dict(), other)
    cfg = resolve_settings({"body": f"torchvision:resnet18@{other}"})
    with pytest.raises(ConfigError) as err:
        check_bodies(cfg, (3, 32, 32))
    assert "'body'" in str(err.value) and f"weights file '{other}' does not fit torchvision resnet18" in str(err.value)
    assert "\n" not in str(err.value)


# ----- 3. refusals: one line naming the key ---------------------------------------------
Refusal = tuple[dict[str, object], str, str]  # (run config, the key named, what the message says)
IMPORT_REFUSALS: list[Refusal] = [  # refused by resolve: the name does not resolve to a factory
    (
        {"body": "no_such_package.bodies:net"},
        "'body'",
        "module 'no_such_package.bodies' cannot be imported (ModuleNotFoundError: No module named 'no_such_package')",
    ),
    ({"bodies": "mnist-cnn,bad_bodies:missing"}, "'bodies'", "module 'bad_bodies' has no attribute 'missing'"),
    ({"body": "bad_bodies:not_callable"}, "'body'", "is of type int, not callable"),
    ({"body": "torchvision:resnet19"}, "'body'", "torchvision has no classification architecture 'resnet19'"),
]
BUILD_REFUSALS: list[Refusal] = [  # resolve admits them (they import); building them on the data's inputs refuses them
    ({"body": "bad_bodies:raises"}, "'body'", "the factory raised RuntimeError: needs a GPU that is not here"),
    ({"body": "bad_bodies:wrong_width", "feature-dim": 5}, "'body'", "outputs 7 features, but feature-dim=5"),
    ({"bodies": "bad_bodies:not_2d,mnist-cnn"}, "'bodies'", "must output a 2-D (batch, width) tensor"),
]


@pytest.mark.parametrize("cfg, key, reason", IMPORT_REFUSALS)
def test_a_body_that_does_not_resolve_is_refused_by_resolve(user_modules, cfg, key, reason):
    with pytest.raises(ConfigError) as err:
        resolve(cfg)
    text = str(err.value)
    print(text)
    assert text.startswith(f"run-config key {key}: body ") and reason in text and "\n" not in text
    with pytest.raises(BodyError):  # the one place that resolves a name
        body_factory(cfg.get("body") if "body" in cfg else cfg["bodies"].split(",")[1])


@pytest.mark.parametrize("cfg, key, reason", BUILD_REFUSALS)
def test_a_body_that_does_not_build_is_refused_by_check_bodies(user_modules, cfg, key, reason):
    resolved = resolve_settings(cfg)
    with pytest.raises(ConfigError) as err:
        check_bodies(resolved, (1, 28, 28))
    text = str(err.value)
    print(text)
    assert text.startswith(f"run-config key {key}: body ") and reason in text and "\n" not in text


@pytest.fixture
def no_engine(monkeypatch):
    def started(**kwargs):
        raise AssertionError("the simulation engine started")

    monkeypatch.setattr(flwr.simulation, "run_simulation", started)


@pytest.mark.parametrize("cfg, key, reason", IMPORT_REFUSALS[:3] + BUILD_REFUSALS)
def test_the_simulation_runner_refuses_them_before_ray_starts(tmp_path, capsys, no_engine, user_modules, data_dir, cfg, key, reason):
    args = ["--out", str(tmp_path / "out"), "--set", f"data-dir={data_dir}"]
    for k, v in {"dataset": "mnist", "num-clients": 2, "num-server-rounds": 1, "train-fraction": 0.01, **cfg}.items():
        args += ["--set", f"{k}={v}"]
    code = simulation.main(args)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: run-config key {key}: ") and reason in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_bodies_that_resolve_and_build_pass_preflight(example_on_path, user_modules):
    cfg = resolve_settings({"bodies": f"{EXAMPLE_BODY},torchvision:resnet18,bad_bodies:no_out_dim,mlp", "feature-dim": 12})
    check_bodies(cfg, (1, 28, 28))  # no error
    assert resolve({"body": "mnist-cnn"})["body"] in BODIES


# ----- 4. a client's declared body never makes the server import a module ------------------
@pytest.mark.parametrize("algorithm", ["fedlog", "fedproto", "lg-fedavg", "fedavg"])
def test_a_registration_naming_an_import_path_not_in_the_run_config_is_refused_without_importing_it(
    task_identity, tmp_path, monkeypatch, data_dir, algorithm
):
    (tmp_path / "planted_body.py").write_text("raise SystemExit('the server imported a module a client named')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    s = make_strategy(algorithm, **{"data-dir": data_dir})
    for declared in ("planted_body:net", "torchvision:resnet18", "planted_body:net ", "mnist-cnn:x"):
        problem = s.body_problem(declared)
        assert problem is not None and repr(declared) in problem, (declared, problem)
        if algorithm != "fedavg":  # FedAvg admits the run's one body only, and says so
            assert "not one of this run config's own body/bodies" in problem, (declared, problem)
    assert "planted_body" not in sys.modules
    engine = engine_for(s, FakeGrid(3, bodies=["mnist-cnn", "planted_body:net", "mnist-cnn"]))  # through registration
    assert sorted(c.partition_id for c in engine.registry.clients.values()) == [0, 2] and len(engine.registry.refused) == 1
    assert "planted_body" not in sys.modules


def test_a_registration_naming_the_run_configs_own_import_path_is_admitted(example_on_path, data_dir):
    s = make_strategy("fedlog", **{"data-dir": data_dir, "bodies": f"{EXAMPLE_BODY},mnist-cnn", "feature-dim": 50})
    assert s.body_problem(EXAMPLE_BODY) is None and s.body_problem("mnist-cnn") is None
    assert s.body_problem("mlp") is None  # registry names stay admitted (mlp honours feature-dim=50)
    assert "not one of this run config's own" in s.body_problem("torchvision:resnet18")
    assert "does not know" in s.body_problem("nope")


# ----- 5. a real Flower simulation with the example body ----------------------------------
@pytest.mark.integration
def test_fedlog_runs_the_example_body_in_a_flower_simulation(tmp_path, monkeypatch, data_dir):
    """As the example's README says: the module on PYTHONPATH of `headway run`
    (whose Ray workers build the clients' bodies); without it, refused before Ray starts."""
    sets = {
        "algorithm": "fedlog",
        "dataset": "mnist",
        "data-dir": data_dir,
        "body": EXAMPLE_BODY,
        "num-clients": 2,
        "num-server-rounds": 2,
        "train-fraction": 0.01,
        "partition": "iid",
        "local-epochs": 1,
        "seed": 0,
        "sample-timeout": 30.0,
    }
    cmd = [sys.executable, "-m", "headway", "run", "--out", str(tmp_path / "out")] + [
        a for k, v in sets.items() for a in ("--set", f"{k}={v}")
    ]
    monkeypatch.delenv("PYTHONPATH", raising=False)
    missing = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "No module named 'headway_example_body'" in missing.stderr and not (tmp_path / "out").exists(), (
        missing.stderr
    )
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLE))  # inherited by the runner and by Ray's workers
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    rounds = [json.loads(line) for line in (tmp_path / "out" / "rounds.jsonl").read_text().splitlines()]
    assert summary["status"] == "complete" and summary["failures"] == 0, summary
    assert summary["participants"] == {"0": EXAMPLE_BODY, "1": EXAMPLE_BODY}  # both clients registered (and ran) the example body
    assert summary["m"] == 65  # the example's 64 features and the constant 1
    assert [r["round"] for r in rounds] == [1, 2] and rounds[-1]["accuracy"] > 0.1, rounds  # chance on 10 classes (iid)
