"""A layer-sharing server holds and sends only the shared layers in every round, whether the round
aggregated or kept the model, in training, evaluation and LG-FedAvg's upload: an outside tester's
FedBABU run with trimmed-mean and one NaN client kept round 1, evaluation then sent the whole initial
model (the head included) and every FedBABU client refused it."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import MessageType, MetricRecord, RecordDict
from headway.core import protocol as P
from headway.core.layers import select

from tests.fakes import FakeGrid, make_strategy, reply

FAULTY = 0  # sends NaN in round 1: 4 valid replies of 5, too few for trimmed-mean-beta=0.2 to cut one at each end
CASES: dict[str, dict[str, object]] = {
    "fedbabu": {},
    "fedper": {},
    "fedrep": {},
    "lg-fedavg": {"lg-new-test": False},
    "lg-fedavg-warmup": {"lg-warmup-rounds": 1, "lg-new-test": True},  # round 1 whole models, round 2 (kept, last) the top layers
}


def _answers(kept_round: int):
    """Honest small updates, except partition ``FAULTY``'s NaN in ``kept_round``; evaluation scores 5 of 10; uploads stay silent."""

    def answer(pid: int, msg) -> RecordDict | None:
        config = msg.content["config"]
        if msg.metadata.message_type == MessageType.EVALUATE:
            if config.get(P.PHASE) == P.PHASE_UPLOAD:
                return None
            return RecordDict({P.METRICS: MetricRecord({P.NUM_EXAMPLES: 10, P.CORRECT: 5, P.PARTITION_ID: pid})})
        sent = {k: v.numpy() for k, v in msg.content["arrays"].items()}
        new = {k: v + (0.001 * (1 + 0.01 * pid) * np.abs(v)).astype(v.dtype) for k, v in sent.items()}
        if pid == FAULTY and config[P.ROUND] == kept_round:
            new = {k: np.full_like(v, np.nan) for k, v in new.items()}
        return reply(new, 10, pid)

    return answer


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_kept_round_sends_only_the_shared_layers_and_the_run_goes_on(task_identity, case):
    algorithm = case.removesuffix("-warmup")
    # lg-fedavg after a warm-up round: round 2, the last, is the first to share only the top layers; kept, the server
    # holds the warm-up model when it asks for the uploads
    first_kept, rounds = (2, 2) if case.endswith("-warmup") else (1, 3)
    s = make_strategy(algorithm, **{"num-clients": 5, "aggregation": "trimmed-mean", "num-server-rounds": rounds, **CASES[case]})
    grid = FakeGrid(5, _answers(first_kept))
    records: list[dict] = []
    s.start(grid=grid, initial_arrays=s.initial_arrays(), num_rounds=rounds, on_round=records.append)

    whole = s.template.state_dict()
    first = s.shared_layers(s.template, 1)
    assert set(s.initial_arrays()) == set(whole if first is None else select(whole, first))  # what the server holds from the start
    for msg in grid.sent:
        if msg.metadata.message_type == MessageType.QUERY:
            continue
        rnd = msg.content["config"][P.ROUND]
        assert isinstance(rnd, int)
        layers = s.shared_layers(s.template, rnd)
        want = set(whole if layers is None else select(whole, layers))
        got = set(msg.content["arrays"])
        assert got == want, (case, rnd, msg.metadata.message_type, msg.content["config"].get(P.PHASE), sorted(got ^ want))
    kept = records[first_kept - 1]
    assert kept["aggregated"] is False and kept["accuracy"] == 0.5, kept
    assert any("cuts floor(0.2 x 4) = 0 of 4 valid replies at each end; keeping the previous model" in r for r in kept["failure_reasons"])
    assert not any("evaluate" in r for rec in records for r in rec["failure_reasons"]), [rec["failure_reasons"] for rec in records]
    assert all(rec["aggregated"] for rec in records if rec["round"] != first_kept), records
