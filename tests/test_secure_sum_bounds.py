"""Issue 37, items 1 and 3: a client that lies INSIDE its masked vector under secure-aggregation=secagg+,
and a client that withholds its distributed-DP noise share.

The liar runs the real client stages (client/secure_aggregation.answer, core/secagg masking) and adds
the fixed-point encoding of what it wants on top of its honest masked vector: masks are additive mod
2^64, so the server unmasks exactly the sum with the lie in it, as it would from a client whose code was
edited to mask chosen values. The server's checks on the sum (core/sum_bounds.py) must refuse a sum past
the participants' bounds and accept one at them (what a liar can still do, docs/secure-aggregation.md)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from flwr.app import Message, RecordDict
from headway.client.secure_aggregation import answer
from headway.core import protocol as P
from headway.core import secagg as S
from headway.core.aggregate import float_norm
from headway.core.config import ConfigError, resolve, resolve_settings
from headway.core.fedlog import noise_sigma, releases, share_sigma
from headway.core.privacy import fedlog_sensitivity
from headway.core.sum_bounds import largest_mean_move
from headway.strategies.privacy import fedlog_dp_report, rdp_epsilon

from tests.fakes import FakeGrid, engine_for, make_strategy, reply

CLIENTS = 3
LIAR = 2

Train = Callable[[int, RecordDict], RecordDict]
Lie = Callable[[RecordDict, list[str]], np.ndarray]  # (train content, names summed) -> values to add to its honest ones


class Nodes:
    """Nodes 101.. answering every SecAgg+ stage with the real client code; ``train(pid, content)`` is a
    node's method reply. Partition ``LIAR`` adds ``lie(content, names)`` inside its masked vector."""

    def __init__(self, train: Train, lie: Lie | None = None):
        self.train, self.lie = train, lie
        self.states: dict[int, RecordDict] = {}

    def __call__(self, pid: int, msg: Message) -> RecordDict:
        fields = msg.content.config_records[P.SECAGG]
        state = self.states.setdefault(pid, RecordDict())
        out = answer(msg.content, msg.metadata.dst_node_id, pid, state, lambda c: self.train(pid, c))
        if pid == LIAR and self.lie is not None and fields[P.SECAGG_STAGE] == P.STAGE_COLLECT:
            names = [str(n) for n in fields[P.SUM_NAMES]]  # type: ignore[union-attr]
            extra = S.encode(self.lie(msg.content, names), int(fields[P.FRAC_BITS]), np.random.default_rng())  # type: ignore[arg-type]
            record = out.array_records[P.ARRAYS]
            record[P.MASKED] = type(record[P.MASKED])(record[P.MASKED].numpy() + extra)  # wraps mod 2^64, as masking does
        return out


def run_round(strategy, nodes: Nodes, server_round: int = 1):
    engine = engine_for(strategy, FakeGrid(CLIENTS, nodes), server_round)
    most = float(sum(engine.most_examples(v) for v in engine.nodes()))
    return strategy.train_round(server_round, strategy.initial_state(), engine), engine, most


# ----- FedAvg (and FedProx, FedPer, FedRep, LG-FedAvg: the same aggregate_sum) -------------------------


COUNTS = {0: 40, 1: 60, LIAR: 1}  # the liar's honest reply: the model sent back unchanged, count 1


def fedavg(**cfg):
    strategy = make_strategy("fedavg", **{"num-clients": CLIENTS, "secure-aggregation": "secagg+", "min-replies": 1, **cfg})
    sent = {k: v.numpy() for k, v in strategy.initial_arrays().items()}
    floats = [k for k, v in sent.items() if v.dtype.kind == "f"]
    rng = np.random.default_rng(0)
    deltas = {p: {k: 0.002 * rng.normal(size=sent[k].shape) for k in floats} for p in (0, 1)}

    def train(pid: int, content: RecordDict) -> RecordDict:
        arrays = {k: (v + deltas[pid][k]).astype(v.dtype) if pid in deltas and k in floats else v for k, v in sent.items()}
        return reply(arrays, COUNTS[pid], pid, loss=0.3)

    honest_sum = {k: sum(COUNTS[p] * deltas[p][k].astype(sent[k].dtype).astype(np.float64) for p in deltas) for k in floats}
    return strategy, sent, train, honest_sum


def flat(arrays: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    return np.concatenate([np.asarray(arrays[k], np.float64).ravel() for k in names])


def test_fedavg_the_issues_lie_a_million_examples_pulling_to_minus_w_is_refused_and_the_model_kept(task_identity):
    """Issue 37 §1: count 10^6 and n·(−0.99·w) inside the masked vector; before the fix accepted with failures 0."""
    strategy, sent, train, _ = fedavg()

    def lie(content: RecordDict, names: list[str]) -> np.ndarray:
        model = {k: v.numpy() for k, v in content.array_records[P.ARRAYS].items()}
        return np.concatenate([1e6 * -0.99 * flat(model, names), [1e6 - COUNTS[LIAR]]])

    step, engine, most = run_round(strategy, Nodes(train, lie))
    assert most < 1e6  # the premise: no three clients here can hold a million examples
    assert step.arrays is None
    assert any("not a sum of bounded updates" in f and f"above the {most:g} examples" in f for f in engine.meter.failures)


def fedavg_liar_aiming_at(honest_sum, count_of_sum: float, mean: dict[str, np.ndarray]) -> Lie:
    """A liar that makes the unmasked sum's count ``count_of_sum`` and its mean update ``mean``."""
    honest_n = COUNTS[0] + COUNTS[1]

    def lie(content: RecordDict, names: list[str]) -> np.ndarray:
        wanted = {k: mean[k] * count_of_sum - honest_sum[k] for k in names}
        return np.concatenate([flat(wanted, names), [count_of_sum - honest_n - COUNTS[LIAR]]])

    return lie


@pytest.mark.parametrize(("scale", "extra_count", "accepted"), [(1 - 1e-4, 0, True), (1 + 1e-3, 0, False), (0.5, 1, False)])
def test_fedavg_a_liar_at_the_bounds_is_accepted_and_just_past_them_refused(task_identity, scale, extra_count, accepted):
    """At the bound: the sum's count = Σ of the clients' caps and the mean update's norm just under the clip
    (accepted: the most one client can do); a norm 0.1 % past the clip, or one example past the caps, is refused."""
    strategy, sent, train, honest_sum = fedavg()
    clip = strategy.update_bound(2)[1] * max(float_norm(sent), 1.0)
    direction = {k: -sent[k].astype(np.float64) for k in honest_sum}  # towards minus the model, as in the issue
    size = float_norm(direction)
    mean = {k: v * scale * clip / size for k, v in direction.items()}
    probe, _, most = run_round(strategy, Nodes(train), server_round=2)  # the caps of these three clients
    assert probe.arrays is not None
    step, engine, _ = run_round(strategy, Nodes(train, fedavg_liar_aiming_at(honest_sum, most + extra_count, mean)), server_round=2)
    if not accepted:
        assert step.arrays is None and any("not a sum of bounded updates" in f for f in engine.meter.failures)
        return
    assert step.arrays is not None and not engine.meter.failures
    moved = {k: step.arrays[k].numpy().astype(np.float64) - sent[k] for k in honest_sum}
    np.testing.assert_allclose(float_norm(moved), scale * clip, rtol=1e-4)  # the liar set the mean where it wanted
    honest_mean = float_norm({k: v / (COUNTS[0] + COUNTS[1]) for k, v in honest_sum.items()})
    shift = float_norm({k: moved[k] - honest_sum[k] / (COUNTS[0] + COUNTS[1]) for k in honest_sum})
    assert clip - honest_mean <= shift <= largest_mean_move(clip, honest_mean) * (1 + 1e-6)  # the documented bound, reached


def test_fedavg_honest_clients_pass_the_sum_checks(task_identity):
    strategy, sent, train, honest_sum = fedavg()
    step, engine, most = run_round(strategy, Nodes(train))
    assert step.arrays is not None and not engine.meter.failures
    assert step.metrics["sum_examples"] == sum(COUNTS.values()) and step.metrics["sum_examples_bound"] == most


# ----- FedLog ----------------------------------------------------------------------------------------------


def fedlog_stats(pid: int) -> np.ndarray:
    """Real-looking T: class counts in column 0, ReLU feature sums within count × clip (clip 2)."""
    rng = np.random.default_rng(pid)
    stats = np.zeros((10, 51), np.float64)
    for c in rng.choice(10, 3, replace=False):
        n = int(rng.integers(5, 40))
        stats[c, 0], stats[c, 1:] = n, rng.uniform(0.0, 2.0, 50) * n * 0.9
    return stats


def fedlog(**cfg):
    return make_strategy("fedlog", **{"num-clients": CLIENTS, "secure-aggregation": "secagg+", "fedlog-clip": 2.0, "min-replies": 1, **cfg})


def fedlog_train(pid: int, content: RecordDict) -> RecordDict:
    """Honest statistics; the liar's own reply is empty (zeros), so what it adds is exactly its lie."""
    stats = np.zeros((10, 51)) if pid == LIAR else fedlog_stats(pid)
    return reply({P.STATS: stats.astype(np.float32)}, None, pid)


def test_fedlog_the_issues_lie_one_class_over_and_x1000_is_refused_and_the_head_kept(task_identity):
    """Issue 37 §1: statistics moved one class over and ×1000; before the fix accepted (accuracy 0.95 → 0.17)."""
    strategy = fedlog()
    before = strategy.initial_method_state().eta
    lie = lambda content, names: (np.roll(fedlog_stats(LIAR), 1, axis=0) * 1000).ravel()  # noqa: E731
    step, engine, most = run_round(strategy, Nodes(fedlog_train, lie))
    assert 1000 * fedlog_stats(LIAR)[:, 0].sum() > most  # the premise: more examples than the three can hold
    assert step.arrays is None and step.method.phi_sum is None
    np.testing.assert_array_equal(step.method.eta, before)
    assert any("not a sum of real statistics" in f and "can hold together" in f for f in engine.meter.failures)


@pytest.mark.parametrize(
    ("extra_count", "feature_scale", "accepted"), [(0, 1.0, True), (1, 1.0, False), (0, 1.001, False), (0, -0.001, False)]
)
def test_fedlog_a_liar_at_the_bounds_is_accepted_and_just_past_them_refused(task_identity, extra_count, feature_scale, accepted):
    """At the bound: the liar adds made-up examples of class 9 until the sum's count is Σ of the caps, every
    feature at the clip b (accepted: the most one client can do); one example more, features 0.1 % past b,
    or a negative feature sum under ReLU bodies is refused."""
    strategy = fedlog()
    probe, _, most = run_round(strategy, Nodes(fedlog_train))
    honest = np.sum([fedlog_stats(p) for p in range(CLIENTS) if p != LIAR], axis=0)
    made = most + extra_count - honest[:, 0].sum()  # the examples the liar invents

    def lie(content: RecordDict, names: list[str]) -> np.ndarray:
        fake = np.zeros((10, 51))
        fake[9, 0] = made
        fake[9, 1:] = feature_scale * 2.0 * (made + honest[9, 0]) - honest[9, 1:]  # the sum's class-9 features at b × count
        return fake.ravel()

    strategy = fedlog()
    step, engine, _ = run_round(strategy, Nodes(fedlog_train, lie))
    if not accepted:
        assert step.arrays is None and step.method.phi_sum is None
        assert any("not a sum of real statistics" in f for f in engine.meter.failures)
        return
    assert step.arrays is not None and not engine.meter.failures
    assert step.method.phi_sum[:, 0].sum() == most  # the liar's class fills every example the clients could hold
    np.testing.assert_allclose(step.method.phi_sum[9, 1:], 2.0 * step.method.phi_sum[9, 0], rtol=1e-9)


# ----- distributed DP with clients that withhold their noise (issue 37 §3) ---------------------------------


DP = {"fedlog-dp": "distributed", "min-replies": CLIENTS, "fedlog-epsilon": 50.0}


def test_withholding_must_leave_a_noising_client_and_needs_distributed_dp():
    base = {"algorithm": "fedlog", "num-clients": 3, "secure-aggregation": "secagg+", "fedlog-clip": 2.0}
    with pytest.raises(ConfigError, match="below min-replies=3"):
        resolve({**base, **DP, "fedlog-dp-withholding": 3})
    with pytest.raises(ConfigError, match="only distributed DP"):
        resolve({**base, "fedlog-dp": "central", "fedlog-dp-withholding": 1})
    cfg = resolve_settings({**base, **DP, "fedlog-dp-withholding": 2})
    assert share_sigma(cfg, 51) == pytest.approx(noise_sigma(cfg, 51))  # one noising client of three must carry all of σ


def test_a_client_that_withholds_its_share_leaves_the_sum_with_at_least_the_central_sigma(task_identity):
    """Two clients noise their statistics with the real share σ/√(3 − 1); the third (the attacker) adds none.
    The sum's noise must still have std >= σ (with fedlog-dp-withholding=0 it had σ·√(2/3) = 0.82σ)."""
    strategy = fedlog(**DP, **{"fedlog-dp-withholding": 1})
    sigma, share = noise_sigma(strategy.settings, 51), share_sigma(strategy.settings, 51)
    drawn: dict[int, np.ndarray] = {}

    def noisy(pid: int, content: RecordDict) -> RecordDict:
        drawn[pid] = np.zeros((10, 51)) if pid == LIAR else np.random.default_rng().normal(0.0, share, (10, 51))
        return reply({P.STATS: (fedlog_stats(pid) + drawn[pid]).astype(np.float32)}, None, pid)

    noise = []
    for _ in range(3):  # 3 × 510 entries: the std within ~2 %
        step, engine, _ = run_round(strategy, Nodes(noisy))
        assert step.arrays is not None and not engine.meter.failures
        noise.append(step.method.phi_sum - sum(fedlog_stats(p) for p in range(CLIENTS)))
    assert np.std(noise) == pytest.approx(sigma, rel=0.08)
    assert np.std(noise) >= 0.92 * sigma


@pytest.mark.parametrize("withholding", [0, 1])
def test_summary_epsilon_is_the_accountants_for_the_stated_withholding_and_says_what_more_would_cost(withholding):
    """Issue 37 §3's figures (min-replies 3, ε 10, 10 rounds): one skipper unplanned for turned a reported 4.06 into 5.32."""
    keys = {"algorithm": "fedlog", "num-clients": 3, "secure-aggregation": "secagg+", "fedlog-clip": 1.0, "fedlog-epsilon": 10.0}
    cfg = resolve_settings({**keys, **DP, "fedlog-epsilon": 10.0, "num-server-rounds": 10, "fedlog-dp-withholding": withholding})
    report = fedlog_dp_report(cfg, 51)
    assert report is not None
    sensitivity = fedlog_sensitivity(51, 1.0)
    noise_left = share_sigma(cfg, 51) * np.sqrt(3 - withholding)  # the smallest accepted sum, the stated skippers out
    assert report["epsilon_rdp"] == pytest.approx(rdp_epsilon(noise_left / sensitivity, releases(cfg), cfg.fedlog.delta)[0], rel=1e-12)
    assert report["epsilon_rdp"] == pytest.approx(4.061, abs=1e-3)
    assert report["withholding_clients"] == withholding and f"at most {withholding} of" in report["assumption"]
    beyond = report["epsilon_rdp_if_withholding"]
    assert beyond[str(withholding)] == pytest.approx(report["epsilon_rdp"])
    if withholding == 0:
        assert beyond["1"] == pytest.approx(5.323, abs=1e-3)  # the issue's real ε with one skipper
