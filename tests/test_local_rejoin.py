"""A dataset=local node restarted without SuperNode authentication comes back under a new
Flower node id: the engine gives it the client index of the node that left, but only when it
declares the same data (issue 38: before, the index stayed taken and the node was refused
for the rest of the run with no reason logged)."""

from __future__ import annotations

import logging

from flwr.app import ConfigRecord, MessageType, RecordDict
from headway.core import protocol as P
from headway.strategies.base import TrainRound
from headway.strategies.discovery import discover

from tests.test_local_attacks import Script, ScriptedGrid, _stats_reply, image_profile, local_cfg, registered, text

PROFILES = [text(image_profile({"0": [6 + k, 2], "1": [6 - k, 2]})) for k in range(3)]  # three nodes, three different data folders


def _three_nodes():
    """Three local nodes registered in round 1 and their (strategy, engine, grid); each answers FedLog statistics."""
    cfg = local_cfg(classes="0,1")
    grid = ScriptedGrid([Script(p) for p in PROFILES])
    strategy, engine = registered(cfg, discover(grid, cfg).schema, grid)
    return strategy, engine, grid


def _train(strategy, engine, grid, rnd: int) -> list[int]:
    """Round ``rnd``'s training exchange with every registered connected node: the nodes whose replies were accepted."""
    for node in grid.nodes:
        grid.scripts[node].answer = lambda node, msg: _stats_reply(strategy, engine.partition_of(node), {0: 5.0, 1: 5.0}, 10)
    got = engine.exchange(
        P.PHASE_TRAIN,
        {n: RecordDict({P.CONFIG: ConfigRecord({P.ROUND: rnd})}) for n in engine.nodes()},
        MessageType.TRAIN,
        strategy.train_layout(TrainRound(rnd, engine, strategy.initial_state())),
    )
    return [r.node_id for r in got]


def _restart(grid: ScriptedGrid, old: int, new: int, profile: str) -> None:
    """Node ``old`` is gone from Flower's list; ``new`` connects, declaring ``profile``."""
    grid.nodes.remove(old)
    grid.nodes.append(new)
    grid.scripts[new] = Script(profile)


def test_a_restarted_node_with_its_own_data_takes_its_index_back_and_trains(task_identity, caplog):
    strategy, engine, grid = _three_nodes()
    index = engine.partition_of(202)
    assert _train(strategy, engine, grid, 1) == [201, 202, 203]
    engine.end_round()
    _restart(grid, 202, 204, PROFILES[1])  # kill -9 of node 202's launcher, restarted at once: a new node id
    with caplog.at_level(logging.INFO, logger="headway"):
        engine.begin_round(2)
    assert engine.partition_of(204) == index and 202 not in engine.registry.clients
    assert not engine.registry.refused, engine.registry.refused
    assert "registry: 3 clients registered (0 refused)" in caplog.text
    assert sorted(_train(strategy, engine, grid, 2)) == [201, 203, 204]
    assert engine.meter.absent == [] and not engine.meter.failures


def test_a_node_with_other_data_cannot_take_the_index_of_one_that_left(task_identity, caplog):
    strategy, engine, grid = _three_nodes()
    index = engine.partition_of(202)
    other = text(image_profile({"0": [6, 2], "1": [7, 2]}))  # same schema, different data
    _restart(grid, 202, 204, other)
    with caplog.at_level(logging.INFO, logger="headway"):
        engine.begin_round(2)
    assert 204 not in engine.registry.clients and engine.registry.by_partition(index) == 202  # kept for its own node
    reason = engine.registry.refused[204]
    assert f"client index {index} belongs to node 202, which has left" in reason and "data differs" in reason, reason
    assert "node 204 refused: " + reason in caplog.text  # the reason reaches the log, not just a count
    assert sorted(_train(strategy, engine, grid, 2)) == [201, 203]
    _restart(grid, 204, 205, PROFILES[1])  # the right node comes back later: it gets the index
    engine.begin_round(3)
    assert engine.partition_of(205) == index and sorted(_train(strategy, engine, grid, 3)) == [201, 203, 205]


def test_two_nodes_restarted_together_each_get_the_index_of_their_own_data(task_identity):
    strategy, engine, grid = _three_nodes()
    before = {p: engine.partition_of(n) for n, p in zip((201, 202, 203), PROFILES)}
    _restart(grid, 203, 204, PROFILES[2])  # 204 is asked first and offered 202's index first: the wrong one for its data
    _restart(grid, 202, 205, PROFILES[1])
    engine.begin_round(2)
    assert engine.partition_of(204) == before[PROFILES[2]] and engine.partition_of(205) == before[PROFILES[1]]
    assert not engine.registry.refused, engine.registry.refused
    assert sorted(_train(strategy, engine, grid, 2)) == [201, 204, 205]
