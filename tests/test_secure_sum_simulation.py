"""Issue 37 §1 through Flower's simulation engine (Ray) on UCI Adult: FedAvg under secure-aggregation=secagg+
with one client of 3 whose ClientApp puts a count of 10^6 and n·(−0.99·w) inside its masked vector in round 2
(the issue's attack, before the fix accepted with failures 0). The round must be refused with its reason, the
model kept, and the run complete with the honest rounds around it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import headway.client.app
import headway.simulation as simulation
import numpy as np
import pytest
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from headway.client.app import build_client_app as honest_client_app
from headway.client.app import partition_of
from headway.core import protocol as P
from headway.core import secagg as S
from headway.core.config import resolve_settings

from tests.conftest import needs_data

pytestmark = [pytest.mark.integration, pytest.mark.system]

LIAR, LYING_ROUND, CLAIMED = 2, 2, 1e6


def lie_inside_the_mask(msg: Message, out: Message) -> Message:
    """The honest masked vector plus the encoding of [CLAIMED·(−0.99·w) − (its honest update), CLAIMED − n]: masks add
    mod 2^64, so the server unmasks the sum with this client's part replaced by the lie (its honest part is left in:
    the lie dwarfs it)."""
    fields = msg.content.config_records[P.SECAGG]
    sent = msg.content.array_records[P.ARRAYS]
    names = [str(n) for n in fields[P.SUM_NAMES]]  # type: ignore[union-attr]
    w = np.concatenate([sent[k].numpy().astype(np.float64).ravel() for k in names])
    extra = S.encode(np.concatenate([CLAIMED * -0.99 * w, [CLAIMED]]), int(fields[P.FRAC_BITS]), np.random.default_rng())  # type: ignore[arg-type]
    record = out.content.array_records[P.ARRAYS]
    record[P.MASKED] = type(record[P.MASKED])(record[P.MASKED].numpy() + extra)
    return Message(content=out.content, reply_to=msg)


def lying_client_app(cfg: dict, state_dir: Path | None = None) -> ClientApp:
    """headway's ClientApp, except that partition LIAR lies inside its masked vector in round LYING_ROUND."""
    honest = honest_client_app(cfg, state_dir=state_dir)
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        out = honest(msg, context)
        fields = msg.content.config_records.get(P.SECAGG)
        collect = fields is not None and fields[P.SECAGG_STAGE] == P.STAGE_COLLECT
        if out.has_error() or not collect or partition_of(context) != LIAR:
            return out
        if P.as_int(msg.content.config_records[P.CONFIG][P.ROUND]) != LYING_ROUND:
            return out
        return lie_inside_the_mask(msg, out)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return honest(msg, context)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return honest(msg, context)

    return app


@needs_data("uci-adult")
def test_one_client_of_three_lying_inside_its_masked_vector_has_its_round_refused_and_the_run_completes(tmp_path, data_dir, monkeypatch):
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the liar's ClientApp crosses to Ray's actors by value
    monkeypatch.setattr(headway.client.app, "build_client_app", lying_client_app)
    cfg = resolve_settings(
        {
            "algorithm": "fedavg",
            "dataset": "uci-adult",
            "data-dir": data_dir,
            "body": "mlp",
            "partition": "iid",
            "num-clients": 3,
            "num-server-rounds": 3,
            "train-fraction": 0.3,
            "local-epochs": 1,
            "batch-size": 64,
            "optimizer": "adam",
            "lr": 0.01,
            "sample-timeout": 60.0,
            "secure-aggregation": "secagg+",
        }
    )
    try:
        summary = simulation.simulate(cfg, tmp_path)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    rounds = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert summary["status"] == "complete"
    assert [r["aggregated"] for r in rounds] == [True, False, True]
    refused = rounds[LYING_ROUND - 1]
    assert refused["failures"] >= 1
    reasons = json.dumps(refused)
    assert "not a sum of bounded updates" in reasons and "examples the clients in the sum can hold together" in reasons
    assert rounds[1]["accuracy"] == pytest.approx(rounds[0]["accuracy"])  # the model was kept
    assert (
        rounds[-1]["accuracy"] > 0.8
    )  # 0.856 here; with the lie accepted 0.764 after round 2 and 0.769 after round 3 (the majority class)
