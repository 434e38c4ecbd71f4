"""FedLog under secure-aggregation=secagg+ through the round engine and the real client
stage code (client/secure_aggregation.py), on a fake grid: what the server sees, the head
it gets, dropouts, hostile clients and refused configs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from headway.client.env import client_env
from headway.client.procedures.fedlog import feature_map, local_statistics
from headway.client.secure_aggregation import SESSION, answer, is_stage
from headway.client.state_store import load_state, save_state
from headway.core import protocol as P
from headway.core.aggregate import float_norm
from headway.core.config import ConfigError, resolve, resolve_settings
from headway.core.fedlog import noise_sigma, share_sigma, solve_head
from headway.core.prototypes import average_prototypes
from headway.core.settings import Settings
from headway.strategies.capabilities import ROBUST_AGGREGATION, SECURE_SUM
from headway.strategies.registry import able, check_capabilities

from tests.fakes import FakeGrid, engine_for, make_strategy, reply

SECURE = {"secure-aggregation": "secagg+", "fedlog-clip": 2.0, "min-replies": 1}
CLIENTS = 6


def client_stats(pid: int) -> np.ndarray:
    """A real-looking T: counts on the first column, feature sums within count × clip."""
    rng = np.random.default_rng(pid)
    stats = np.zeros((10, 51), np.float32)
    for c in rng.choice(10, 3, replace=False):
        n = int(rng.integers(5, 40))
        stats[c, 0] = n
        stats[c, 1:] = rng.uniform(0.0, 2.0, 50).astype(np.float32) * n * 0.9  # ReLU features within the clip
    return stats


class Clients:
    """Nodes 101.. running the real client stages; ``silent_at`` maps a partition to the stage it stops answering at."""

    def __init__(self, silent_at: dict[int, str] | None = None, hostile: dict[int, Callable[[RecordDict], RecordDict]] | None = None):
        self.states: dict[int, RecordDict] = {}
        self.silent_at = silent_at or {}
        self.hostile = hostile or {}
        self.seen: dict[int, np.ndarray] = {}  # the masked vectors the server received, by partition
        self.stages: list[str] = []  # every stage message a client got

    def __call__(self, pid: int, msg: Message):
        assert is_stage(msg.content), "under secure aggregation every train message is a protocol stage"
        stage = str(msg.content.config_records[P.SECAGG][P.SECAGG_STAGE])
        self.stages.append(stage)
        if self.silent_at.get(pid) == stage:
            return None
        state = self.states.setdefault(pid, RecordDict())
        out = answer(msg.content, msg.metadata.dst_node_id, pid, state, lambda c: reply({"stats": client_stats(pid)}, None, pid))
        if pid in self.hostile and stage == P.STAGE_COLLECT:
            out = self.hostile[pid](out)
        if stage == P.STAGE_COLLECT:
            self.seen[pid] = out.array_records[P.ARRAYS][P.MASKED].numpy()
        return out


def secure_round(clients: Clients, **cfg):
    s = make_strategy("fedlog", **{"num-clients": CLIENTS, **SECURE, **cfg})
    engine = engine_for(s, FakeGrid(CLIENTS, clients))
    return s, engine, s.train_round(1, s.initial_state(), engine)


def plain_head(strategy, pids) -> np.ndarray:
    phi = np.sum([client_stats(p).astype(np.float64) for p in pids], axis=0)
    return solve_head(phi, float(phi[:, 0].sum()), chi=strategy.settings.fedlog.prior_chi, nu=strategy.settings.fedlog.prior_nu)


FALSE_FAILURE = 1e-7  # the chance that assert_uniform_and_unrelated fails a correct masking (below one in a million)


def assert_uniform_and_unrelated(masked: list[np.ndarray], stats: list[np.ndarray], false_failure: float = FALSE_FAILURE) -> None:
    """The masked vectors look like what correct masking makes them: independent uniform
    values on [0, 2^64), unrelated to the statistics they hide. Each client's seed mask is
    uniform mod 2^64 and independent of the others', so u = vector / 2^64 is, over all
    clients together, independent uniforms on [0, 1) whatever the statistics are.

    Each check is a two-sided Hoeffding bound, P(|deviation| >= t) <= 2 exp(-2 t^2 / the sum
    of the terms' squared ranges), given an equal part of ``false_failure``, so a correct
    masking fails with probability at most ``false_failure`` (union bound). The masks come
    from OS entropy: no seed can make this test lucky or unlucky. Per client: the mean of u is
    near 1/2 (terms in [0, 1]; a missing mask fails here) and the mean of (u - 1/2)^2 near 1/12
    (terms in [0, 1/4]; a mask constant over the vector fails here). Over all clients:
    sum a_i (u_i - 1/2), with a each client's statistics less their mean, near 0 (terms in
    [-|a_i|/2, |a_i|/2]; a mask that lets the statistics show through fails here)."""
    tail = float(np.log(2.0 / (false_failure / (2 * len(masked) + 1))))
    units = [v.ravel().astype(np.float64) / 2.0**64 for v in masked]
    for pid, u in enumerate(units):
        mean, spread = u.mean(), np.mean((u - 0.5) ** 2)
        assert abs(mean - 0.5) < np.sqrt(tail / (2 * u.size)), (
            f"client {pid}: mean {mean:.4f} of its masked values is not that of uniform ones"
        )
        assert abs(spread - 1.0 / 12) < np.sqrt(tail / (32 * u.size)), f"client {pid}: spread {spread:.4f} of its masked values is not 1/12"
    u = np.concatenate(units)
    a = np.concatenate([s.ravel().astype(np.float64) - s.mean() for s in stats])
    cov = abs(float(a @ (u - 0.5)))
    assert cov < np.linalg.norm(a) * np.sqrt(tail / 2), f"the masked values follow the statistics (covariance {cov:.3g})"


def test_the_head_equals_the_plain_one_and_the_server_never_holds_a_clients_statistics(task_identity):
    clients = Clients()
    s, engine, step = secure_round(clients)
    assert step.clients == CLIENTS and not engine.meter.failures
    np.testing.assert_allclose(step.arrays[P.ETA].numpy(), plain_head(s, range(CLIENTS)).astype(np.float32), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(step.method.phi_sum, np.sum([client_stats(p) for p in range(CLIENTS)], axis=0), atol=1e-6)
    assert sorted(clients.seen) == list(range(CLIENTS)) and all(vec.dtype == np.uint64 for vec in clients.seen.values())
    assert_uniform_and_unrelated([clients.seen[p] for p in range(CLIENTS)], [client_stats(p) for p in range(CLIENTS)])
    for phase in (P.STAGE_SETUP, P.STAGE_SHARE, P.PHASE_TRAIN, P.STAGE_UNMASK):  # every stage is metered
        assert engine.meter.phase(phase)[0] > 0 and engine.meter.phase(phase)[1] > 0


def test_a_client_that_drops_after_sharing_its_keys_is_unmasked_through_its_neighbours(task_identity):
    clients = Clients(silent_at={2: P.STAGE_COLLECT})
    s, engine, step = secure_round(clients)
    assert step.clients == CLIENTS - 1
    survivors = [p for p in range(CLIENTS) if p != 2]
    np.testing.assert_allclose(step.arrays[P.ETA].numpy(), plain_head(s, survivors).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_a_client_that_drops_at_setup_or_after_collect_leaves_the_sum_whole(task_identity):
    s, _, step = secure_round(Clients(silent_at={0: P.STAGE_SETUP, 4: P.STAGE_UNMASK}))
    assert step.clients == CLIENTS - 1
    np.testing.assert_allclose(step.arrays[P.ETA].numpy(), plain_head(s, [1, 2, 3, 4, 5]).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_too_few_survivors_end_the_round_cleanly_and_keep_the_head(task_identity):
    clients = Clients(silent_at={p: P.STAGE_UNMASK for p in range(4)})  # 2 of 6 reveal: below every neighbourhood's threshold
    s, engine, step = secure_round(clients, **{"secagg-shares": 5})
    assert step.arrays is None
    assert any("secure aggregation" in f and "threshold" in f for f in engine.meter.failures)


def _replace_masked(out: RecordDict, vec: np.ndarray) -> RecordDict:
    record = out.array_records[P.ARRAYS]
    record[P.MASKED] = type(record[P.MASKED])(vec)
    return out


def test_a_garbage_masked_vector_is_caught_by_the_sum_check_and_changes_nothing(task_identity):
    def garbage(out: RecordDict) -> RecordDict:  # what it likes: random bits instead of its masked statistics
        return _replace_masked(
            out, np.random.default_rng(7).integers(0, 2**63, out.array_records[P.ARRAYS][P.MASKED].numpy().size, dtype=np.uint64)
        )

    s, engine, step = secure_round(Clients(hostile={3: garbage}))
    assert step.arrays is None and step.method.phi_sum is None
    assert any("not a sum of real statistics" in f for f in engine.meter.failures)


def test_poison_inside_the_bounds_goes_through_undetected_as_the_trust_model_says(task_identity):
    """docs/secure-aggregation.md: a client can add any plausible statistics to the sum; only implausible sums are caught."""
    frac_of: dict[str, int] = {}

    def poison(out: RecordDict) -> RecordDict:
        fake = np.zeros((10, 51))
        fake[0, 0], fake[0, 1:] = 100.0, 200.0  # 100 made-up examples of class 0, every feature at the clip
        extra = (np.round(fake.ravel() * 2.0 ** frac_of["frac"])).astype(np.int64).view(np.uint64)
        return _replace_masked(out, out.array_records[P.ARRAYS][P.MASKED].numpy() + extra)

    class Spy(Clients):
        def __call__(self, pid, msg):
            fields = msg.content.config_records[P.SECAGG]
            if P.FRAC_BITS in fields:
                frac_of["frac"] = int(fields[P.FRAC_BITS])
            return super().__call__(pid, msg)

    s, engine, step = secure_round(Spy(hostile={3: poison}))
    assert step.clients == CLIENTS and not engine.meter.failures
    honest = np.sum([client_stats(p).astype(np.float64) for p in range(CLIENTS)], axis=0)
    assert step.method.phi_sum[0, 0] == pytest.approx(honest[0, 0] + 100.0)


def test_a_client_refuses_stages_out_of_order_and_keeps_no_secret_on_disk(task_identity, tmp_path):
    s = make_strategy("fedlog", **{"num-clients": 3, **SECURE})
    state = RecordDict()
    setup = RecordDict({P.SECAGG: ConfigRecord({P.SECAGG_STAGE: P.STAGE_SETUP, P.SECAGG_THRESHOLD: 2})})
    out = answer(setup, 101, 0, state, lambda c: c)
    assert set(out.config_records[P.CONFIG]) == {P.PK1, P.PK2, P.SEED_DIGEST} and SESSION in state
    unmask = RecordDict({P.SECAGG: ConfigRecord({P.SECAGG_STAGE: P.STAGE_UNMASK, P.ALIVE: [101], P.DROPPED: []})})
    with pytest.raises(ValueError, match="starts again from setup"):
        answer(unmask, 101, 0, state, lambda c: c)
    save_state(state, tmp_path / "state")
    assert SESSION not in load_state(tmp_path / "state")
    assert s.settings.secure_aggregation == "secagg+"


@pytest.mark.parametrize(
    ("keys", "match"),
    [
        ({"algorithm": "fedprof"}, f"which only {', '.join(able(SECURE_SUM))} implement"),
        ({"algorithm": "lg-fedavg"}, "lg-new-test"),
        ({"algorithm": "fedlog", "fedlog-clip": 1e12}, "could overflow"),
        ({"algorithm": "fedlog", "fedlog-clip": 2.0, "secagg-threshold": 0.4}, "majority"),
        ({"algorithm": "fedavg", "aggregation": "median"}, "needs each client's update"),
        ({"algorithm": "fedavg", "client-sampling": "data-ratio"}, "client-sampling"),
        ({"algorithm": "fedlog", "fedlog-clip": 0.0}, "fedlog-clip"),
        ({"algorithm": "fedlog", "fedlog-clip": 2.0, "fedlog-uplink": "sparse"}, "dense"),
        ({"algorithm": "fedlog", "fedlog-clip": 2.0, "fedlog-dp": "local"}, "cannot be 'local'"),
        ({"algorithm": "fedlog", "fedlog-clip": 2.0, "client-evaluation": "with-next-train"}, "client-evaluation"),
    ],
)
def test_configs_that_cannot_run_under_secure_aggregation_are_refused(keys, match):
    with pytest.raises(ConfigError, match=match):
        # what the strategy implements: checked by the server
        check_capabilities(resolve_settings({"secure-aggregation": "secagg+", **keys}))


def test_a_sum_that_could_overflow_fails_the_round_before_any_client_is_asked(task_identity):
    """FedLog's bound is checked with the config (above); a model's update bound only in the round."""
    clients = Clients()
    s = make_strategy("fedavg", **{"num-clients": CLIENTS, "secure-aggregation": "secagg+", "min-replies": 1, "max-update-norm": 1e20})
    engine = engine_for(s, FakeGrid(CLIENTS, clients))
    step = s.train_round(2, s.initial_state(), engine)
    assert step.arrays is None and not clients.states
    assert any("overflow" in f for f in engine.meter.failures)


def test_each_key_stage_gets_an_eighth_of_the_deadline_and_training_leaves_unmask_its_share(task_identity):
    s = make_strategy("fedlog", **{"num-clients": CLIENTS, **SECURE, "round-timeout": 80.0})
    grid = FakeGrid(CLIENTS, Clients())
    s.train_round(1, s.initial_state(), engine_for(s, grid))
    setup, share, collect, unmask = grid.timeouts[-4:]
    assert setup <= 10.0 and share <= 10.0 and unmask <= 10.0  # a silent client costs a key stage 10 s, not the round
    assert 55.0 <= collect <= 70.0


def test_a_key_on_another_curve_is_refused_at_setup_and_the_round_goes_on(task_identity):
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    def p256(out: RecordDict) -> RecordDict:
        out.config_records[P.CONFIG][P.PK2] = public_key_to_bytes(ec.generate_private_key(ec.SECP256R1()).public_key())
        return out

    class Foreign(Clients):
        def __call__(self, pid, msg):
            out = super().__call__(pid, msg)
            if pid == 1 and msg.content.config_records[P.SECAGG][P.SECAGG_STAGE] == P.STAGE_SETUP:
                out = p256(out)
            return out

    s, engine, step = secure_round(Foreign())
    assert step.clients == CLIENTS - 1
    assert any("secp384r1" in f for f in engine.meter.failures)


def test_a_client_that_claims_to_have_forgotten_its_registration_at_unmask_does_not_stop_the_run(task_identity):
    from flwr.app import Error

    class Forgetful(Clients):
        def __call__(self, pid, msg):
            if pid == 2 and msg.content.config_records[P.SECAGG][P.SECAGG_STAGE] == P.STAGE_UNMASK:
                return Error(code=P.ERROR_UNREGISTERED, reason="forgot")
            return super().__call__(pid, msg)

    s, engine, step = secure_round(Forgetful())
    assert step.clients == CLIENTS  # its vector arrived, its seed came from its neighbours' shares
    np.testing.assert_allclose(step.arrays[P.ETA].numpy(), plain_head(s, range(CLIENTS)).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_fewer_vectors_than_min_replies_are_never_unmasked(task_identity):
    clients = Clients(silent_at={p: P.STAGE_COLLECT for p in range(3)})
    s, engine, step = secure_round(clients, **{"min-replies": 4})
    assert step.arrays is None
    assert any("fewer than min-replies=4; nothing is unmasked" in f for f in engine.meter.failures)
    assert P.STAGE_UNMASK not in clients.stages


def test_a_client_refuses_a_plain_training_message_in_a_secure_run(task_identity, data_dir):
    from flwr.app import ArrayRecord, Context, Message, MessageType
    from headway.client.app import build_client_app

    cfg = {"algorithm": "fedlog", "num-clients": 3, "train-fraction": 0.01, "local-epochs": 0, "data-dir": data_dir, **SECURE}
    app = build_client_app(resolve(cfg))
    content = RecordDict({P.ARRAYS: ArrayRecord(), P.CONFIG: ConfigRecord({P.ROUND: 1, P.PHASE: P.PHASE_TRAIN})})
    msg = Message(content=content, dst_node_id=101, message_type=MessageType.TRAIN, group_id="1")
    ctx = Context(run_id=1, node_id=101, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    reply = app(msg, ctx)
    assert reply.has_error() and "outside its protocol" in str(reply.error.reason)


def test_distributed_dp_needs_secure_aggregation():
    with pytest.raises(ConfigError, match="needs secure-aggregation"):
        resolve({"algorithm": "fedlog", "fedlog-dp": "distributed", "fedlog-clip": 2.0})
    cfg = resolve_settings(
        {"algorithm": "fedlog", "fedlog-dp": "distributed", "fedlog-clip": 2.0, "secure-aggregation": "secagg+", "min-replies": 4}
    )
    assert share_sigma(cfg, 51) == pytest.approx(noise_sigma(cfg, 51) / 2.0)
    assert share_sigma(replace(cfg, fedlog=replace(cfg.fedlog, dp="central")), 51) == 0.0


def test_distributed_dp_each_client_adds_its_share_from_os_entropy(data_dir):
    cfg = resolve(
        {"algorithm": "fedlog", "num-clients": 3, "train-fraction": 0.01, "local-epochs": 0, "data-dir": data_dir}
        | {"fedlog-dp": "distributed", "fedlog-clip": 2.0, "secure-aggregation": "secagg+", "min-replies": 2}
    )
    env = client_env(cfg, {"partition-id": 0})
    fmap = feature_map(env, None)
    clean = local_statistics(client_env({**cfg, "fedlog-dp": "off"}, {"partition-id": 0}), fmap)
    noise = [local_statistics(env, fmap) - clean for _ in range(2)]
    # both draws' 1,020 values: a correct σ misses rel=0.15 with probability 2e-11 (n s²/σ² is χ²(n−1))
    assert np.std(noise) == pytest.approx(share_sigma(Settings.from_config(cfg), clean.shape[1]), rel=0.15)
    assert not np.allclose(noise[0], noise[1])  # fresh each time: not derived from the run config


def test_distributed_dp_the_sum_carries_the_central_noise_and_the_server_accepts_it(task_identity):
    cfg = {"fedlog-dp": "distributed", "min-replies": 3, "fedlog-epsilon": 50.0}
    strategy = make_strategy("fedlog", **{"num-clients": CLIENTS, **SECURE, **cfg})
    share = share_sigma(strategy.settings, 51)
    drawn: dict[int, np.ndarray] = {}

    class Noisy(Clients):
        def __call__(self, pid, msg):
            fields = msg.content.config_records[P.SECAGG]
            if fields[P.SECAGG_STAGE] != P.STAGE_COLLECT:
                return super().__call__(pid, msg)
            # seeded: this test's own noise, so its σ check below is deterministic
            drawn[pid] = np.random.default_rng(100 + pid).normal(0.0, share, (10, 51))
            state = self.states[pid]
            return answer(
                msg.content, msg.metadata.dst_node_id, pid, state, lambda c: reply({"stats": client_stats(pid) + drawn[pid]}, None, pid)
            )

    engine = engine_for(strategy, FakeGrid(CLIENTS, Noisy()))
    step = strategy.train_round(1, strategy.initial_state(), engine)
    assert step.clients == CLIENTS and not engine.meter.failures
    honest = np.sum([client_stats(p).astype(np.float64) for p in range(CLIENTS)], axis=0)
    noise = step.method.phi_sum - honest
    np.testing.assert_allclose(noise, np.sum(list(drawn.values()), axis=0), atol=1e-3)  # the sum is exact up to rounding
    assert np.std(noise) == pytest.approx(share * np.sqrt(CLIENTS), rel=0.15)  # ≥ the central σ: share·√6 vs σ = share·√3


# the methods whose strategy averages model updates and can do it from their sum alone, read from the strategies
MODEL_AVERAGING = [name for name in able(SECURE_SUM) if name in able(ROBUST_AGGREGATION)]


@pytest.mark.parametrize("algorithm", MODEL_AVERAGING)
def test_model_averaging_gets_the_weighted_mean_of_the_updates_and_a_huge_update_is_clipped_to_the_bound(task_identity, algorithm):
    keys = {"num-clients": CLIENTS, "secure-aggregation": "secagg+", "min-replies": 1}
    if algorithm == "lg-fedavg":
        keys["lg-new-test"] = False  # no upload after the run
    strategy = make_strategy(algorithm, **keys)
    sent = {k: v.numpy() for k, v in strategy.shared(2, strategy.initial_arrays()).items()}
    counts = {p: 10 + 5 * p for p in range(CLIENTS)}
    rng = np.random.default_rng(0)
    deltas = {
        p: {k: (0.01 * rng.normal(size=v.shape)).astype(v.dtype) for k, v in sent.items() if v.dtype.kind == "f"} for p in range(CLIENTS)
    }

    def model(pid: int, scale: float = 1.0) -> RecordDict:
        return reply({k: v + scale * deltas[pid][k] if k in deltas[pid] else v for k, v in sent.items()}, counts[pid], pid, loss=0.3)

    class Avg(Clients):
        def __init__(self, scale: dict[int, float]):
            super().__init__()
            self.scale = scale

        def __call__(self, pid, msg):
            fields = msg.content.config_records[P.SECAGG]
            if fields[P.SECAGG_STAGE] != P.STAGE_COLLECT:
                return super().__call__(pid, msg)
            return answer(msg.content, msg.metadata.dst_node_id, pid, self.states[pid], lambda c: model(pid, self.scale.get(pid, 1.0)))

    def run(scale: dict[int, float]):
        engine = engine_for(strategy, FakeGrid(CLIENTS, Avg(scale)))
        return strategy.train_round(2, strategy.initial_state(), engine), engine

    step, engine = run({})
    assert step.clients == CLIENTS and not engine.meter.failures
    total = sum(counts.values())
    for k, v in sent.items():
        want = v + sum(counts[p] * deltas[p][k].astype(np.float64) for p in range(CLIENTS)) / total if k in deltas[0] else v
        np.testing.assert_allclose(step.arrays[k].numpy(), want.astype(v.dtype), rtol=1e-5, atol=1e-7)
    # one client sends a sign-flipped, 1000x update: clipped to the update bound on its own side, its pull is bounded
    step, _ = run({3: -1000.0})
    bound = strategy.settings.max_update_norm * max(float_norm(sent), 1.0)
    moved = float_norm({k: step.arrays[k].numpy().astype(np.float64) - v for k, v in sent.items() if k in deltas[0]})
    assert moved <= bound * counts[3] / total + 0.1 * bound


def test_fedproto_gets_the_count_weighted_prototypes(task_identity):
    strategy = make_strategy("fedproto", **{"num-clients": CLIENTS, "secure-aggregation": "secagg+", "min-replies": 1})
    rng = np.random.default_rng(3)
    made = {}
    for p in range(CLIENTS):
        counts = np.zeros(10, np.float32)
        held = rng.choice(10, 4, replace=False)
        counts[held] = rng.integers(1, 30, 4)
        protos = np.zeros((10, strategy.m), np.float32)
        protos[held] = rng.uniform(0, 3, (4, strategy.m))
        made[p] = (protos, counts)

    class Proto(Clients):
        def __call__(self, pid, msg):
            if msg.content.config_records[P.SECAGG][P.SECAGG_STAGE] != P.STAGE_COLLECT:
                return super().__call__(pid, msg)
            protos, counts = made[pid]
            train = lambda c: reply({P.PROTOTYPES: protos, P.CLASS_COUNTS: counts}, int(counts.sum()), pid, loss=0.1)  # noqa: E731
            return answer(msg.content, msg.metadata.dst_node_id, pid, self.states[pid], train)

    engine = engine_for(strategy, FakeGrid(CLIENTS, Proto()))
    step = strategy.train_round(1, strategy.initial_state(), engine)
    assert step.clients == CLIENTS and not engine.meter.failures
    want_protos, want_counts = average_prototypes([m[0] for m in made.values()], [m[1] for m in made.values()])
    np.testing.assert_array_equal(step.method.counts, want_counts)
    np.testing.assert_allclose(step.method.protos, want_protos, atol=1e-6)
