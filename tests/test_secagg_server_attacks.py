"""Issue 37, item 2: a server that deviates from SecAgg+ against the real client stage handler
(client/secure_aggregation.py). The crafted server sends what it likes in each stage message and
tries to rebuild one client's vector from what the client reveals; the client must refuse, by
rules it takes from its own run config, and reveal nothing of its own secrets.
Item 7 (first bullet): secure-aggregation with fewer than 3 clients a round is refused before start."""

from __future__ import annotations

from typing import Any

import flwr.simulation
import headway.simulation as simulation
import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict
from headway.client.secure_aggregation import SESSION, answer
from headway.core import protocol as P
from headway.core import secagg as S
from headway.core.config import ConfigError, resolve, resolve_settings
from headway.core.secagg_primitives import agree, combine_shares, encrypt, pack_pair
from headway.core.settings import Settings

from tests.conftest import needs_data
from tests.fakes import reply

VALUES = (np.arange(1, 11, dtype=np.float32) * 0.5).reshape(1, 10)  # the victim's statistics
FRAC = 20
A, B, C = 101, 102, 103


def cfg(**keys) -> Settings:
    """A client's run settings (the floor it holds the server to comes from here)."""
    return resolve_settings({"algorithm": "fedlog", "num-clients": 3, "secure-aggregation": "secagg+", "fedlog-clip": 2.0, **keys})


def train(_: RecordDict) -> RecordDict:
    return reply({"stats": VALUES}, None, 0)


def stage(name: str, **fields: Any) -> RecordDict:
    """A round-1 stage message with ``fields``, as a server that sends what it likes would write it."""
    return RecordDict({P.CONFIG: ConfigRecord({P.ROUND: 1}), P.SECAGG: ConfigRecord({P.SECAGG_STAGE: name, **fields})})


def collect(texts: dict[int, bytes]) -> RecordDict:
    fields = {P.IDS: list(texts), P.CIPHERTEXTS: list(texts.values()), P.SUM_NAMES: ["stats"], P.FRAC_BITS: FRAC}
    return stage(P.STAGE_COLLECT, **fields, **{P.SUM_UPDATE_NORM: 0.0})


def config_of(out: RecordDict) -> Any:
    """A reply's config record, its values as the stage wrote them (untyped: each stage's own fields)."""
    return out.config_records[P.CONFIG]


def steal_alone(state: RecordDict, run_config: Settings, threshold: int) -> np.ndarray:
    """The crafted server of item 2's first bullet: the victim alone in its neighbourhood, the
    given threshold; returns the victim's vector rebuilt from its masked vector and its own seed share."""
    keys = config_of(answer(stage(P.STAGE_SETUP, **{P.SECAGG_THRESHOLD: threshold}), A, 0, state, train, run_config))
    neighbours = {P.IDS: [A], P.PK1S: [keys[P.PK1]], P.PK2S: [keys[P.PK2]], P.SECAGG_THRESHOLD: threshold}
    answer(stage(P.STAGE_SHARE, **neighbours), A, 0, state, train, run_config)
    vec = answer(collect({}), A, 0, state, train, run_config).array_records[P.ARRAYS][P.MASKED].numpy()
    revealed = config_of(answer(stage(P.STAGE_UNMASK, **{P.ALIVE: [A], P.DROPPED: []}), A, 0, state, train, run_config))
    seed = combine_shares(list(revealed[P.SHARES]))
    return S.decode(vec - S.mask(seed, vec.size), FRAC)


@pytest.mark.parametrize("threshold", [1, 2])
def test_a_server_that_puts_a_client_alone_gets_a_refusal_not_its_vector(threshold):
    state = RecordDict()
    refused = "threshold 1, below the 2" if threshold == 1 else "names 1 neighbour.*fewer than the 3"
    with pytest.raises(S.SecAggError, match=refused):
        steal_alone(state, cfg(), threshold)
    assert P.SHARES not in str(state)  # nothing was revealed: the attack never reached unmask


def honest_until_unmask(run_config: Settings) -> tuple[dict[int, RecordDict], dict[int, ConfigRecord]]:
    """Three real clients through setup, share keys and collect, as an honest server runs them."""
    states = {v: RecordDict() for v in (A, B, C)}
    keys = {v: config_of(answer(stage(P.STAGE_SETUP, **{P.SECAGG_THRESHOLD: 2}), v, 0, states[v], train, run_config)) for v in states}
    ids = sorted(keys)
    share = {P.IDS: ids, P.PK1S: [keys[v][P.PK1] for v in ids], P.PK2S: [keys[v][P.PK2] for v in ids], P.SECAGG_THRESHOLD: 2}
    sent = {v: config_of(answer(stage(P.STAGE_SHARE, **share), v, 0, states[v], train, run_config)) for v in ids}
    relayed = S.relay_shares({v: dict(zip(sent[v][P.IDS], sent[v][P.CIPHERTEXTS], strict=True)) for v in ids})
    for v in ids:
        answer(collect(relayed[v]), v, 0, states[v], train, run_config)
    return states, keys


def test_a_client_named_dropped_or_alive_in_its_own_request_reveals_no_share_of_its_secrets():
    run_config = cfg()
    states, _ = honest_until_unmask(run_config)
    # before: A revealed its own private-key share, and with C's share of it (t = 2) the server rebuilt A's private key
    lie = stage(P.STAGE_UNMASK, **{P.ALIVE: [B, C], P.DROPPED: [A]})
    with pytest.raises(S.SecAggError, match=f"node {A}.*named dropped in its own unmask request"):
        answer(lie, A, 0, states[A], train, run_config)
    assert SESSION not in states[A]  # the round's secrets are gone: a second try is refused too
    with pytest.raises(S.SecAggError, match="starts again from setup"):
        answer(stage(P.STAGE_UNMASK, **{P.ALIVE: [B, C], P.DROPPED: []}), A, 0, states[A], train, run_config)
    # C, asked for its share of A's key, is left with one alive neighbour (B): below t = 2, so no honest round needs it
    with pytest.raises(S.SecAggError, match="1 neighbours alive, fewer than the threshold 2"):
        answer(stage(P.STAGE_UNMASK, **{P.ALIVE: [B], P.DROPPED: [A]}), C, 0, states[C], train, run_config)
    with pytest.raises(S.SecAggError, match="named alive in its own unmask request"):
        answer(stage(P.STAGE_UNMASK, **{P.ALIVE: [A, B, C], P.DROPPED: []}), B, 0, states[B], train, run_config)


def test_a_neighbourhood_or_threshold_below_what_the_run_config_implies_is_refused():
    run_config = cfg(**{"num-clients": 10, "min-replies": 5})  # the smallest round unmasked: 5 clients, k = 5, t = 3
    assert S.settings_floor(run_config) == S.Floor(5, 3, 0.5)
    with pytest.raises(S.SecAggError, match="threshold 2, below the 3 this client's run config implies"):
        honest_until_unmask(run_config)  # three clients, threshold 2: a valid-looking SecAgg+ round, but too small for this run
    state = RecordDict()
    keys = config_of(answer(stage(P.STAGE_SETUP, **{P.SECAGG_THRESHOLD: 3}), A, 0, state, train, run_config))
    others = [S.new_keys() for _ in range(3)]  # a neighbourhood of 4
    share = {
        P.IDS: [A, B, C, 104],
        P.PK1S: [keys[P.PK1]] + [k.pk1 for k in others],
        P.PK2S: [keys[P.PK2]] + [k.pk2 for k in others],
        P.SECAGG_THRESHOLD: 3,
    }
    with pytest.raises(S.SecAggError, match="names 4 neighbour.*fewer than the 5"):
        answer(stage(P.STAGE_SHARE, **share), A, 0, state, train, run_config)


def test_a_threshold_that_is_not_a_majority_of_the_share_holders_is_refused():
    run_config = cfg(**{"secagg-threshold": 0.7})
    state = RecordDict()
    keys = config_of(answer(stage(P.STAGE_SETUP, **{P.SECAGG_THRESHOLD: 3}), A, 0, state, train, run_config))
    others = [S.new_keys() for _ in range(6)]  # 6 holders: 0.7 of them needs threshold 5
    share = {
        P.IDS: [A, *range(200, 206)],
        P.PK1S: [keys[P.PK1]] + [k.pk1 for k in others],
        P.PK2S: [keys[P.PK2]] + [k.pk2 for k in others],
        P.SECAGG_THRESHOLD: 3,
    }
    with pytest.raises(S.SecAggError, match="not more than secagg-threshold=0.7 of the 6 share holders"):
        answer(stage(P.STAGE_SHARE, **share), A, 0, state, train, run_config)


def invented(keys: S.Keys, victim_pk2: bytes, me: int, to: int) -> bytes:
    """A share ciphertext from an invented node ``me`` to ``to``, made with the server's own keys."""
    return encrypt(agree(keys.sk2, victim_pk2), pack_pair(me, to, b"x" * 40, b"y" * 40))


def test_one_invented_neighbour_at_threshold_2_no_longer_unmasks_a_client():
    """Item 2's third bullet at the protocol's floor (t = 2). Before: {victim, one invented node} gave the server
    the invented node's share and the victim's own seed share, so its seed, and the pairwise mask was with its own
    key: the vector. Now that neighbourhood is refused; padded with a real client B, the server gets the seed (B's
    share and the invented one) but neither private key it needs for the victim-B mask: the victim will not name B
    dropped with fewer than t other neighbours alive, nor reveal a share of its own key."""
    run_config = cfg()
    fake, F = S.new_keys(), 999
    states = {v: RecordDict() for v in (A, B)}
    keys = {v: config_of(answer(stage(P.STAGE_SETUP, **{P.SECAGG_THRESHOLD: 2}), v, 0, states[v], train, run_config)) for v in states}
    alone = {P.IDS: [A, F], P.PK1S: [keys[A][P.PK1], fake.pk1], P.PK2S: [keys[A][P.PK2], fake.pk2], P.SECAGG_THRESHOLD: 2}
    with pytest.raises(S.SecAggError, match="names 2 neighbour"):
        answer(stage(P.STAGE_SHARE, **alone), A, 0, RecordDict({SESSION: states[A][SESSION]}), train, run_config)
    ids = [A, B, F]
    pk = {A: (keys[A][P.PK1], keys[A][P.PK2]), B: (keys[B][P.PK1], keys[B][P.PK2]), F: (fake.pk1, fake.pk2)}
    share = {P.IDS: ids, P.PK1S: [pk[v][0] for v in ids], P.PK2S: [pk[v][1] for v in ids], P.SECAGG_THRESHOLD: 2}
    sent = {v: config_of(answer(stage(P.STAGE_SHARE, **share), v, 0, states[v], train, run_config)) for v in (A, B)}
    texts = {v: dict(zip(sent[v][P.IDS], sent[v][P.CIPHERTEXTS], strict=True)) for v in (A, B)}
    held_by_fake = S.open_shares(F, fake, pk, {A: texts[A][F], B: texts[B][F]}, 2)  # the server reads what it sent to its own node
    vec = answer(collect({B: texts[B][A], F: invented(fake, keys[A][P.PK2], F, A)}), A, 0, states[A], train, run_config)
    masked = vec.array_records[P.ARRAYS][P.MASKED].numpy()
    answer(collect({A: texts[A][B], F: invented(fake, keys[B][P.PK2], F, B)}), B, 0, states[B], train, run_config)
    from_b = config_of(answer(stage(P.STAGE_UNMASK, **{P.ALIVE: [A, F], P.DROPPED: []}), B, 0, states[B], train, run_config))
    seed = combine_shares([dict(zip(from_b[P.IDS], from_b[P.SHARES], strict=True))[A], held_by_fake[A][0]])
    with pytest.raises(S.SecAggError, match="1 neighbours alive, fewer than the threshold 2"):  # B's key: the victim's share + the fake's
        answer(stage(P.STAGE_UNMASK, **{P.ALIVE: [F], P.DROPPED: [B]}), A, 0, states[A], train, run_config)
    unmasked = masked - S.mask(seed, masked.size)  # what the server can take off: the seed and the mask with its own node
    pairwise = S.mask(S.pair_key(fake.sk1, keys[A][P.PK1]), masked.size)
    unmasked = unmasked + pairwise if S.pair_sign(A, F) < 0 else unmasked - pairwise
    assert not np.allclose(S.decode(unmasked, FRAC), VALUES.ravel(), atol=1.0)  # the A-B mask still hides the vector


def test_fewer_than_three_clients_a_round_under_secagg_is_refused_before_start(tmp_path, capsys, monkeypatch, data_dir):
    def started(**kwargs):
        raise AssertionError("the simulation engine started")

    monkeypatch.setattr(flwr.simulation, "run_simulation", started)
    for sets in (["num-clients=1"], ["num-clients=2"], ["num-clients=10", "fraction-train=0.2"]):
        args = ["--out", str(tmp_path / "out"), "--set", f"data-dir={data_dir}", "--set", "secure-aggregation=secagg+"]
        for s in ["algorithm=fedlog", "dataset=mnist", "fedlog-clip=2.0", "num-server-rounds=1", *sets]:
            args += ["--set", s]
        code = simulation.main(args)
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "at least 3" in lines[0], err
        assert "Traceback" not in err and not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="asks 1 client"):
        cfg(**{"num-clients": 1})
    assert cfg().num_clients == 3  # three clients a round: accepted


def test_two_invented_holders_still_unmask_a_client_as_the_trust_model_says():
    """The residual the docs state (docs/secure-aggregation.md, what a deviating server can still do): a server
    holding s >= 2t - (k - 1) of a client's k - 1 share holders learns its vector, here k = 5, t = 3, s = 2,
    with honest B and C told different things (B: the victim is alive; C: it dropped). Every check passes."""
    run_config = cfg()
    fakes = {201: S.new_keys(), 202: S.new_keys()}
    real = (A, B, C)
    states = {v: RecordDict() for v in real}
    keys = {v: config_of(answer(stage(P.STAGE_SETUP, **{P.SECAGG_THRESHOLD: 3}), v, 0, states[v], train, run_config)) for v in real}
    pk = {v: (keys[v][P.PK1], keys[v][P.PK2]) for v in real} | {f: (k.pk1, k.pk2) for f, k in fakes.items()}
    ids = sorted(pk)
    share = {P.IDS: ids, P.PK1S: [pk[v][0] for v in ids], P.PK2S: [pk[v][1] for v in ids], P.SECAGG_THRESHOLD: 3}
    sent = {v: config_of(answer(stage(P.STAGE_SHARE, **share), v, 0, states[v], train, run_config)) for v in real}
    texts = {v: dict(zip(sent[v][P.IDS], sent[v][P.CIPHERTEXTS], strict=True)) for v in real}
    held = {f: S.open_shares(f, k, pk, {v: texts[v][f] for v in real}, 3) for f, k in fakes.items()}
    masked: dict[int, np.ndarray] = {}
    for v in real:
        relay = {u: texts[u][v] for u in real if u != v} | {f: invented(k, pk[v][1], f, v) for f, k in fakes.items()}
        masked[v] = answer(collect(relay), v, 0, states[v], train, run_config).array_records[P.ARRAYS][P.MASKED].numpy()

    def unmask(v: int, alive: list[int], dropped: list[int]) -> dict[int, bytes]:
        out = config_of(answer(stage(P.STAGE_UNMASK, **{P.ALIVE: alive, P.DROPPED: dropped}), v, 0, states[v], train, run_config))
        return dict(zip(out[P.IDS], out[P.SHARES], strict=True))

    seed = combine_shares([unmask(B, [A, 201, 202], [C])[A], held[201][A][0], held[202][A][0]])
    sk1 = combine_shares([unmask(C, [B, 201, 202], [A])[A], held[201][A][1], held[202][A][1]])
    assert S.seed_digest(seed) == keys[A][P.SEED_DIGEST]  # the victim's seed, from honest B and the two invented holders
    assert S._key_matches(sk1, pk[A][0])  # the victim's private key, from honest C and the two invented holders
    vec = masked[A] - S.mask(seed, masked[A].size)
    for peer in ids:
        if peer != A:
            pairwise = S.mask(S.pair_key(sk1, pk[peer][0]), vec.size)
            vec = vec - pairwise if S.pair_sign(A, peer) > 0 else vec + pairwise
    np.testing.assert_allclose(S.decode(vec, FRAC), VALUES.ravel(), atol=1e-5)


def _adult_client(node_config: dict, **keys: Any) -> tuple[Any, Any]:
    """The real ClientApp of a UCI Adult run submitted with ``keys``, and the context of a node whose operator set ``node_config``."""
    from flwr.app import Context
    from headway.client.app import build_client_app

    cfg = resolve({"algorithm": "fedavg", "dataset": "uci-adult", "body": "mlp", "num-clients": 3, "local-epochs": 1, **keys})
    ctx = Context(
        run_id=1, node_id=A, node_config={"partition-id": 0, "num-partitions": 3, **node_config}, state=RecordDict(), run_config={}
    )
    return build_client_app(cfg), ctx


def _ask(app: Any, ctx: Any, content: RecordDict) -> Any:
    from flwr.app import Message, MessageType

    return app(Message(content=content, dst_node_id=A, message_type=MessageType.TRAIN, group_id="1"), ctx)


@needs_data("uci-adult")
def test_a_node_that_pins_secure_aggregation_refuses_a_run_submitted_without_it(task_identity):
    """The run config is the submitter's: a server that wants plain updates submits secure-aggregation=off.
    A node whose operator pinned secure-aggregation=secagg+ in its node config sends nothing in the clear."""
    from flwr.app import ArrayRecord

    plain = RecordDict({P.ARRAYS: ArrayRecord(), P.CONFIG: ConfigRecord({P.ROUND: 1, P.PHASE: P.PHASE_TRAIN})})
    app, ctx = _adult_client({"secure-aggregation": "secagg+"})
    reply = _ask(app, ctx, plain)
    assert reply.has_error() and "pins secure-aggregation='secagg+'" in str(reply.error.reason)
    assert not reply.has_content()
    app, ctx = _adult_client({})  # without the pin the same message is answered in the clear, as the run asks
    assert not _ask(app, ctx, plain).has_error()


@needs_data("uci-adult")
def test_a_node_pinned_floor_outranks_a_lax_run_config(task_identity):
    """A submitter who lowers min-replies to 1 gets the protocol's floor (threshold 2) from the run config;
    a node that pins min-replies=5 holds the server to 5 clients' floor (threshold 3) whatever the run says."""
    keys = {"secure-aggregation": "secagg+", "min-replies": 1}
    app, ctx = _adult_client({"min-replies": 5}, **keys)
    reply = _ask(app, ctx, stage(P.STAGE_SETUP, **{P.SECAGG_THRESHOLD: 2}))
    assert reply.has_error() and "threshold 2, below the 3" in str(reply.error.reason)
    app, ctx = _adult_client({}, **keys)
    assert not _ask(app, ctx, stage(P.STAGE_SETUP, **{P.SECAGG_THRESHOLD: 2})).has_error()
    with pytest.raises(S.SecAggError, match="must be a number"):
        S.pinned_floor(cfg(), {"secagg-threshold": "half"})
    assert S.pinned_floor(cfg(**{"num-clients": 9, "min-replies": 7}), {"min-replies": "5"}).min_replies == 7  # the stricter one


def test_the_launcher_writes_the_nodes_secure_aggregation_pins(capsys):
    """`headway supernode --secure-aggregation secagg+ --min-replies 5` puts both pins in the node config, where the ClientApp reads them."""
    from flwr.common.config import parse_config_args

    from headway.deploy import main

    argv = ["supernode", "--superlink", "srv:9092", "--partition-id", "0", "--num-partitions", "3", "--insecure", "--dry-run"]
    main([*argv, "--secure-aggregation", "secagg+", "--min-replies", "5"])
    line = capsys.readouterr().out
    node_config = parse_config_args([line.split("--node-config ", 1)[1].split(" --isolation", 1)[0]])
    with pytest.raises(S.SecAggError, match="pins secure-aggregation"):
        S.pinned_floor(resolve_settings({"algorithm": "fedavg", "num-clients": 3}), node_config)
    assert S.settings_floor(S.pinned_floor(cfg(), node_config)).threshold == 3
