"""LG-FedAvg's fair representations (issue 41 §4, Table 4): protected columns never features and never
in a reply, the adversarial objective of Eq. 6 and its AUCs, the auxiliary head of Eqs 1-3, refusals."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import headway.client.env as client_env_module
import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from headway.client.env import ClientEnv, client_env, with_protected
from headway.client.procedures.lg_fedavg import LGFedAvgClient
from headway.core import fairness
from headway.core import protocol as P
from headway.core.config import ConfigError, resolve_settings
from headway.core.data import ADULT_LEVELS, SPECS, Dataset, builtin_spec, load_dataset
from headway.core.layers import select, top_layers
from headway.core.run_data import load_run_dataset, natural_split_problem, node_profile, run_spec


@pytest.fixture(autouse=True)
def one_thread():
    """Small models: one torch thread is many times faster than several on shared cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not (DATA / "uci-adult").is_dir(), reason="real data not present")


# ------------------------------------------------------------------ the maths
def test_roc_auc_matches_sklearn_with_ties():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    for _ in range(5):
        y = rng.integers(0, 2, 200)
        s = np.round(rng.normal(size=200) + y, 1)  # rounded: many ties
        assert fairness.roc_auc(s, y) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert np.isnan(fairness.roc_auc(np.ones(3), np.ones(3)))
    two = rng.integers(0, 2, (100, 2))
    scores = rng.normal(size=(100, 2)) + two
    assert fairness.mean_auc(scores, two) == pytest.approx(roc_auc_score(two, scores), abs=1e-12)  # sklearn's macro average


def test_encoding_one_level_against_the_rest():
    race = np.array(["White", "Black", "Asian-Pac-Islander", "White"])
    assert fairness.encode_protected(race, fairness.Protected("race"), race).tolist() == [1, 0, 0, 1]  # uci-adult: White
    assert fairness.encode_protected(race, fairness.Protected("race", "Black"), race).tolist() == [0, 1, 0, 0]
    band = np.array(["cold", "hot", "hot"])
    assert fairness.encode_protected(band, fairness.Protected("band"), band).tolist() == [0, 1, 1]  # most common level


def _one_line_refusal(err: pytest.ExceptionInfo[fairness.ProtectedError], *words: str) -> None:
    message = str(err.value)
    assert "\n" not in message and "'protected-columns'" in message and all(w in message for w in words), message


def test_named_level_no_training_row_holds_refused():
    """A level that never occurs (temp_band=tepid) would make P all zeros: refused, naming the column and the level."""
    band = np.array(["cold", "mild", "hot"])
    with pytest.raises(fairness.ProtectedError) as err:
        fairness.encode_protected(band, fairness.Protected("temp_band", "tepid"), band)
    _one_line_refusal(err, "'temp_band'", "'tepid'", "name a level the column holds")
    assert fairness.encode_protected(band, fairness.Protected("temp_band", "mild"), band).tolist() == [0, 1, 0]


def test_many_valued_column_refused_unless_a_level_is_named():
    """A continuous sensor (AT): 'its most common value against the rest' marks almost no row; refused, with what to do."""
    sensor = np.array([f"{t / 10:.1f}" for t in range(fairness.MAX_DEFAULT_LEVELS + 1)])
    with pytest.raises(fairness.ProtectedError) as err:
        fairness.encode_protected(sensor, fairness.Protected("AT"), sensor)
    _one_line_refusal(err, "'AT'", f"{len(sensor)} distinct values", "bin it into a category column", "AT=LEVEL")
    assert fairness.encode_protected(sensor, fairness.Protected("AT", "0.3"), sensor).sum() == 1  # a named level is the user's call
    few = sensor[: fairness.MAX_DEFAULT_LEVELS]
    assert fairness.encode_protected(few, fairness.Protected("AT"), few).sum() == 1  # at the limit: still a category
    country = np.array([str(i) for i in range(ADULT_LEVELS["native-country"])])
    fairness.encode_protected(country, fairness.Protected("native-country"), country)  # the paper's most-levelled column passes


@pytest.mark.parametrize(
    "cfg",
    [
        {"dataset": "uci-adult", "partition": "natural", "protected-columns": "race"},  # adult's own natural column
        {"dataset": "data/t.csv", "partition": "natural", "natural-column": "ambient", "protected-columns": "ambient=hot"},
    ],
)
def test_natural_split_by_a_protected_column_refused_on_the_server(cfg):
    """Clients split by P itself: P constant on each, no AUC anywhere; refused from the config alone, before any data is read."""
    with pytest.raises(ConfigError) as err:
        run_spec(resolve_settings(cfg))
    message = str(err.value)
    assert "\n" not in message and "'protected-columns'" in message and "natural-column" in message, message


@pytest.mark.parametrize(
    "cfg",
    [
        {"dataset": "uci-adult", "partition": "natural", "protected-columns": "sex"},
        {"dataset": "data/t.csv", "partition": "natural", "natural-column": "year", "protected-columns": "ambient"},
        {"dataset": "data/t.csv", "partition": "iid", "natural-column": "ambient", "protected-columns": "ambient"},
    ],
)
def test_natural_split_by_another_column_allowed(cfg):
    assert natural_split_problem(resolve_settings(cfg)) is None


def test_constant_protected_column_on_a_client_logged_without_values(monkeypatch):
    """A client whose test rows all hold one side of P has no AUC for it: one line on the node, naming the column only."""
    lines: list[str] = []
    monkeypatch.setattr(client_env_module.log, "warning", lambda fmt, *args: lines.append(fmt % args))
    zeros = np.zeros((4, 1), dtype=np.float32)
    ds = Dataset(
        "t", "classification", 2, (1,), zeros, np.zeros(4), zeros[:3], np.zeros(3),
        {"grp": np.array(["north", "south", "north", "south"])}, {"grp": np.array(["north", "north", "south"])},
    )  # fmt: skip
    env = ClientEnv(resolve_settings({"protected-columns": "grp=south"}), 7, "mlp", ds, *(torch.zeros(1),) * 4, torch.device("cpu"))
    varied = with_protected(env, np.arange(4), np.array([0, 2]))
    assert varied.p_test is not None and varied.p_test.ravel().tolist() == [0, 1] and not lines
    same = with_protected(env, np.arange(4), np.array([0, 1]))
    assert same.p_test is not None and same.p_test.ravel().tolist() == [0, 0]
    assert len(lines) == 1 and "'grp'" in lines[0] and "client 7" in lines[0] and "cannot be computed" in lines[0], lines
    assert "north" not in lines[0] and "south" not in lines[0]


def test_model_step_ascends_the_adversary_loss():
    """The model's step on L − λ·L_r raises the adversary's loss on the same batch (Eq. 6's max over θ_r is fought)."""
    torch.manual_seed(0)
    body, adv = torch.nn.Linear(4, 3), fairness.make_adversary(3, 1, seed=1)
    x, p = torch.randn(64, 4), (torch.rand(64, 1) > 0.5).float()
    x[:, 0] += 3 * p[:, 0]  # P is readable from x
    before = float(fairness.adversary_loss(adv, body(x), p).detach())
    opt = torch.optim.SGD(body.parameters(), lr=0.1)
    loss = fairness.fair_objective(torch.zeros(()), fairness.adversary_loss(adv, body(x), p), 1.0)
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert float(fairness.adversary_loss(adv, body(x), p).detach()) > before
    assert float(fairness.local_global_objective(torch.tensor(1.0), torch.tensor(2.0), 0.5)) == 2.0


# ------------------------------------------------------------------ refusals, one line each
@pytest.mark.parametrize(
    ("cfg", "says"),
    [
        ({"protected-columns": "race=,sex"}, "'protected-columns'"),
        ({"protected-columns": "race,race"}, "'protected-columns'"),
        ({"algorithm": "lg-fedavg", "lg-adversary-weight": 1.0}, "'protected-columns' is empty"),
        ({"algorithm": "lg-fedavg", "lg-adversary-weight": -1.0}, "'lg-adversary-weight'"),
    ],
)
def test_bad_keys_refused_in_one_line(cfg, says):
    with pytest.raises(ConfigError) as err:
        resolve_settings(cfg)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_builtin_without_columns_refused():
    with pytest.raises(ConfigError, match="'protected-columns'.*mnist"):
        run_spec(resolve_settings({"dataset": "mnist", "protected-columns": "race"}))
    with pytest.raises(ValueError, match="'protected-columns' names \\['age'\\]"):
        builtin_spec("uci-adult", ("age",))


# ------------------------------------------------------------------ protected columns are never features
@needs_data
def test_adult_protected_columns_leave_the_features():
    full = load_dataset("uci-adult", str(DATA))
    cut = load_dataset("uci-adult", str(DATA), protected=("race", "sex"))
    assert cut.x_train.shape[1] == full.x_train.shape[1] - ADULT_LEVELS["race"] - ADULT_LEVELS["sex"]
    assert builtin_spec("uci-adult", ("race", "sex")).input_shape == cut.input_shape and SPECS["uci-adult"] == builtin_spec("uci-adult")
    # the columns left are exactly the unprotected ones: removing race's and sex's one-hot blocks from the full matrix gives them
    start = 6 + sum(ADULT_LEVELS[c] for c in ("workclass", "education", "marital-status", "occupation", "relationship"))
    keep = np.r_[0:start, start + 7 : full.x_train.shape[1]]
    np.testing.assert_array_equal(full.x_train[:, keep], cut.x_train)
    assert cut.protected == ("race", "sex") and set(cut.attrs_train) >= {"race", "sex"}


def _gas_turbine_csv(tmp: Path) -> Path:
    """A user's table from the real gas-turbine data: label = CO above its median, protected = ambient-temperature band."""
    with open(DATA / "uci-gas-turbine" / "gt_2011.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))[:1200]
    co_median = float(np.median([float(r["CO"]) for r in rows]))
    at_median = float(np.median([float(r["AT"]) for r in rows]))
    path = tmp / "turbine.csv"
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["AP", "AH", "AFDP", "GTEP", "TIT", "TAT", "TEY", "CDP", "ambient", "co_high"])
        for r in rows:
            band = "hot" if float(r["AT"]) > at_median else "cold"
            out.writerow([r[c] for c in ("AP", "AH", "AFDP", "GTEP", "TIT", "TAT", "TEY", "CDP")] + [band, int(float(r["CO"]) > co_median)])
    return path


@needs_data
def test_user_csv_protected_column_is_not_a_feature_nor_in_the_profile(tmp_path):
    path = _gas_turbine_csv(tmp_path)
    cfg = resolve_settings({"dataset": str(path), "label-column": "co_high", "protected-columns": "ambient=hot"})
    ds = load_run_dataset(cfg)
    assert ds.input_shape == (8,) and ds.protected == ("ambient",)
    assert set(np.unique(ds.attrs_train["ambient"])) == {"cold", "hot"}
    profile = json.dumps(node_profile(str(path), cfg))  # what a node registers with: no trace of the column
    assert "ambient" not in profile and "hot" not in profile
    plain = load_run_dataset(resolve_settings({"dataset": str(path), "label-column": "co_high"}))
    assert plain.input_shape == (10,)  # without the key the column is an ordinary feature (two one-hot levels)


# ------------------------------------------------------------------ the client: replies, AUCs, λ
def _content(arrays: dict, server_round: int, phase: str = P.PHASE_TRAIN) -> RecordDict:
    return RecordDict({P.ARRAYS: ArrayRecord(arrays), P.CONFIG: ConfigRecord({P.ROUND: server_round, P.PHASE: phase})})


def _rounds(env, rounds: int) -> tuple[RecordDict, RecordDict, RecordDict]:
    """``rounds`` local rounds of one client against its own global layers (a one-client federation), then an evaluation."""
    client, state = LGFedAvgClient(), RecordDict()
    model = env.build_model()
    layers = top_layers(model, 1)
    shared = select({k: v.detach().clone() for k, v in model.state_dict().items()}, layers)
    reply = RecordDict()
    for r in range(1, rounds + 1):
        reply = client.train(env, _content(shared, r), state)
        shared = reply.array_records[P.ARRAYS].to_torch_state_dict()
    scores = client.evaluate(env, _content(shared, rounds, P.PHASE_EVALUATE), state)
    return reply, scores, state


def _adult_env(weight: float, protected: str = "race,sex", **extra):
    cfg = {
        "algorithm": "lg-fedavg",
        "dataset": "uci-adult",
        "data-dir": str(DATA),
        "protected-columns": protected,
        "lg-adversary-weight": weight,
        "num-clients": 10,
        "partition": "iid",
        "train-fraction": 0.46,
        "local-epochs": 1,
        "batch-size": 32,
        "lr": 0.01,
        "seed": 0,
        **extra,
    }
    return client_env(cfg, {"partition-id": 0, "num-partitions": 10})


@needs_data
def test_replies_carry_only_the_global_layers_and_scores():
    env = _adult_env(0.0)
    assert env.x_train.shape[1] == SPECS["uci-adult"].input_shape[0] - 7 and env.p_train is not None
    reply, scores, state = _rounds(env, 1)
    layers = top_layers(env.build_model(), 1)
    assert all(any(k.startswith(layer + ".") for layer in layers) for k in reply.array_records[P.ARRAYS])
    assert set(reply.metric_records[P.METRICS]) <= {P.NUM_EXAMPLES, P.PARTITION_ID, P.LOSS}
    assert not scores.array_records and set(scores.metric_records[P.METRICS]) <= {
        P.NUM_EXAMPLES,
        P.PARTITION_ID,
        P.LOSS,
        P.CORRECT,
        "class-auc",
        "adv-auc",
        "posthoc-adv-auc",
    }
    assert "lg-adversary" in state.array_records  # the adversary stays in the node's state


@needs_data
def test_with_weight_zero_the_reply_does_not_depend_on_p():
    """λ = 0: the model trains exactly as without an adversary, so shuffling P changes no byte of the reply."""
    env = _adult_env(0.0)
    a, _, _ = _rounds(env, 1)
    shuffled = type(env)(**{**env.__dict__, "p_train": env.p_train[torch.randperm(len(env.p_train))]})
    b, _, _ = _rounds(shuffled, 1)
    for k, v in a.array_records[P.ARRAYS].to_torch_state_dict().items():
        assert torch.equal(v, b.array_records[P.ARRAYS].to_torch_state_dict()[k])


@pytest.mark.system  # two small real trainings (~10 s on a busy 2-core machine)
@needs_data
def test_adversary_auc_falls_with_weight():
    """A small real run (one adult client, 3 rounds): λ = 30 (the authors') brings the adversary and the post-hoc AUC toward 0.5."""
    _, off, _ = _rounds(_adult_env(0.0), 3)
    _, on, _ = _rounds(_adult_env(30.0), 3)
    off_m = {k: float(v) for k, v in off.metric_records[P.METRICS].items()}  # type: ignore[arg-type]
    on_m = {k: float(v) for k, v in on.metric_records[P.METRICS].items()}  # type: ignore[arg-type]
    assert off_m["adv-auc"] > 0.6 and off_m["posthoc-adv-auc"] > 0.6
    assert on_m["posthoc-adv-auc"] < off_m["posthoc-adv-auc"] - 0.03
    assert abs(on_m["adv-auc"] - 0.5) < 0.05 < abs(off_m["adv-auc"] - 0.5)
    assert on_m["class-auc"] > 0.6  # still a classifier


@needs_data
def test_aux_head_trains_and_stays_local():
    env = _adult_env(0.0, protected="", **{"lg-aux-model": True, "lg-aux-weight": 0.5})
    reply, _, state = _rounds(env, 1)
    assert "lg-aux-head" in state.array_records and "lg-adversary" not in state.array_records
    assert not any("aux" in k for k in reply.array_records[P.ARRAYS])


# ------------------------------------------------------------------ the server: AUCs are untrusted numbers
def test_server_pools_aucs_and_refuses_one_outside_0_1(task_identity, data_dir):
    from flwr.app import MetricRecord

    from tests.fakes import FakeGrid, engine_for, make_strategy

    s = make_strategy("lg-fedavg", **{"data-dir": data_dir})

    def answer(pid, msg):
        adv = 7.0 if pid == 2 else 0.5 + 0.1 * pid  # client 2 claims an impossible AUC
        met = {"partition-id": pid, "num-examples": 100 * (pid + 1), "correct": 80, "adv-auc": adv, "class-auc": 0.9}
        return RecordDict({"metrics": MetricRecord(met)})

    engine = engine_for(s, FakeGrid(3, answer))
    out = s.evaluate_round(1, s.initial_state(), engine)
    assert out["eval_clients"] == 2 and "not an AUC in [0, 1]" in engine.meter.failures[0]
    assert out["adv_auc"] == pytest.approx((0.5 * 100 + 0.6 * 200) / 300) and out["class_auc"] == pytest.approx(0.9)
    assert "posthoc_adv_auc" not in out


@pytest.mark.system  # two small real trainings (~10 s on a busy 2-core machine)
@needs_data
def test_fairness_on_a_user_csv_with_its_own_protected_column(tmp_path):
    """The capability off uci-adult: a table from the gas-turbine data, its ambient-temperature band protected (not a feature)."""
    path = _gas_turbine_csv(tmp_path)
    scores = {}
    for weight in (0.0, 30.0):
        cfg = {
            "algorithm": "lg-fedavg",
            "dataset": str(path),
            "label-column": "co_high",
            "protected-columns": "ambient=hot",
            "lg-adversary-weight": weight,
            "num-clients": 2,
            "partition": "iid",
            "local-epochs": 1,
            "batch-size": 32,
            "lr": 0.01,
        }
        env = client_env(cfg, {"partition-id": 0, "num-partitions": 2})
        assert env.x_train.shape[1] == 8 and env.p_train is not None
        _, reply, _ = _rounds(env, 3)
        scores[weight] = {k: float(v) for k, v in reply.metric_records[P.METRICS].items()}  # type: ignore[arg-type]
    assert scores[0.0]["adv-auc"] > 0.65  # the band is readable from the other sensors' representation...
    assert scores[30.0]["adv-auc"] < scores[0.0]["adv-auc"] - 0.05  # ...less so against the adversary
    assert scores[30.0]["posthoc-adv-auc"] < scores[0.0]["posthoc-adv-auc"]
