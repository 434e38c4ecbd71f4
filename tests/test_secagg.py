"""SecAgg+ maths (core/secagg.py) without Flower: the whole protocol between in-process
clients, with dropouts, bad shares and a server that asks for too much."""

from __future__ import annotations

import random

import numpy as np
import pytest
from headway.core import secagg as S

FLOOR = S.Floor(neighbours=3, threshold=2, fraction=0.5)  # the protocol's own floor: what min-replies=1, secagg-shares=0 imply


def run_protocol(
    vectors: dict[int, np.ndarray],
    shares: int,
    threshold: int,
    drop_before_sharing: frozenset[int] = frozenset(),
    drop_after_sharing: frozenset[int] = frozenset(),
    corrupt: dict[int, int] | None = None,
) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Every stage, as the server and clients run it; returns (the unmasked sum, the masked vectors the server saw)."""
    nodes = sorted(vectors)
    graph = S.neighbour_graph(nodes, shares, random.Random(0))
    keys = {v: S.new_keys() for v in nodes}
    seeds = {v: S.random_seed() for v in nodes}
    public = {v: (keys[v].pk1, keys[v].pk2) for v in nodes}
    digests = {v: S.seed_digest(seeds[v]) for v in nodes}
    asked = S.key_requests(graph, public)
    sent = {}
    for v in nodes:
        if v in drop_before_sharing:
            continue
        sent[v] = S.share_secrets(v, keys[v], seeds[v], asked[v], threshold, FLOOR)
        assert S.share_problem(v, asked[v], sent[v]) is None
    relayed = S.relay_shares(sent)
    held, seen = {}, {}
    for v, texts in relayed.items():
        held[v] = S.open_shares(v, keys[v], asked[v], texts, threshold)
        if v in drop_after_sharing:
            continue
        peers = {u: public[u][0] for u in texts}
        seen[v] = S.masked(v, keys[v], seeds[v], vectors[v], peers)
    total = np.zeros(next(iter(vectors.values())).size, dtype=np.uint64)
    for vec in seen.values():
        total = total + vec
    requests = S.unmask_requests({v: relayed[v].keys() for v in relayed}, seen)
    answers = {v: S.reveal(v, held[v], alive, dropped, threshold) for v, (alive, dropped) in requests.items()}
    for owner, liar in (corrupt or {}).items():  # a client that reveals a wrong share of ``owner``
        answers[liar] = {**answers[liar], owner: answers[liar][owner][:4] + bytes(len(answers[liar][owner]) - 4)}
    out = S.unmask_sum(total, seen, set(sent) - set(seen), S.gather_shares(requests, answers), public, digests, relayed, threshold)
    return out, seen


def encoded(n: int, size: int, frac: int = 20) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(1)
    return {100 + 7 * i: S.encode(rng.normal(0, 50, size), frac, rng) for i in range(n)}


def plain_sum(vectors: dict[int, np.ndarray], who) -> np.ndarray:
    total = np.zeros(next(iter(vectors.values())).size, dtype=np.uint64)
    for v in who:
        total = total + vectors[v]
    return total


def test_the_server_recovers_exactly_the_sum_of_the_survivors():
    # 6 holders of each secret, threshold 4: up to 2 of a client's neighbours may be lost (its own share is never used)
    vectors = encoded(9, 300)
    nodes = sorted(vectors)
    out, seen = run_protocol(
        vectors, shares=7, threshold=4, drop_before_sharing=frozenset({nodes[0]}), drop_after_sharing=frozenset({nodes[4]})
    )
    assert set(seen) == set(nodes) - {nodes[0], nodes[4]}
    np.testing.assert_array_equal(out, plain_sum(vectors, seen))
    np.testing.assert_allclose(S.decode(out, 20), sum(S.decode(vectors[v], 20) for v in seen), atol=1e-9)


def test_everyone_alive_and_everyone_neighbours():
    vectors = encoded(4, 50)
    out, seen = run_protocol(vectors, shares=4, threshold=3)
    assert len(seen) == 4
    np.testing.assert_array_equal(out, plain_sum(vectors, vectors))


def test_a_masked_vector_looks_uniform_and_unrelated_to_the_clients_values():
    vectors = encoded(6, 4000)
    _, seen = run_protocol(vectors, shares=5, threshold=3)
    for v, vec in seen.items():
        as_unit = vec.astype(np.float64) / 2.0**64
        assert abs(as_unit.mean() - 0.5) < 0.02 and abs(as_unit.var() - 1 / 12) < 0.005  # uniform on [0, 2^64)
        truth = S.decode(vectors[v], 20)
        assert abs(np.corrcoef(as_unit, truth)[0, 1]) < 0.06


def test_one_bad_share_is_found_and_left_out():
    vectors = encoded(7, 40)
    nodes = sorted(vectors)
    victim, liar = nodes[2], None
    # any survivor holding a share of the victim lies about it; the others' shares still rebuild its seed
    _, seen = run_protocol(vectors, shares=7, threshold=4)
    liar = next(v for v in seen if v != victim)
    out, seen = run_protocol(vectors, shares=7, threshold=4, corrupt={victim: liar})
    np.testing.assert_array_equal(out, plain_sum(vectors, seen))


def test_too_few_survivors_to_rebuild_is_an_error_not_a_wrong_sum():
    vectors = encoded(5, 10)
    nodes = sorted(vectors)
    with pytest.raises(S.SecAggError):
        run_protocol(vectors, shares=5, threshold=4, drop_after_sharing=frozenset(nodes[:2]))


def test_a_client_never_reveals_both_secrets_of_one_neighbour():
    held = {1: (b"seed-share", b"key-share"), 2: (b"s", b"k"), 3: (b"s", b"k")}
    assert S.reveal(7, held, [1, 2], [3], 2) == {1: b"seed-share", 2: b"s", 3: b"k"}
    with pytest.raises(S.SecAggError, match="both alive and dropped"):
        S.reveal(7, held, [1, 2], [1], 2)
    with pytest.raises(S.SecAggError, match="not neighbours"):
        S.reveal(7, held, [1, 2, 9], [], 2)
    with pytest.raises(S.SecAggError, match="fewer than the threshold"):
        S.reveal(7, held, [1], [2], 2)
    with pytest.raises(S.SecAggError, match="named dropped in its own unmask request"):
        S.reveal(7, held, [1, 2], [7], 2)
    with pytest.raises(S.SecAggError, match="named alive in its own unmask request"):
        S.reveal(7, held, [1, 2, 7], [], 2)


def test_a_relayed_share_must_come_from_who_the_server_says():
    nodes = [1, 2, 3]
    keys = {v: S.new_keys() for v in nodes}
    public = {v: (keys[v].pk1, keys[v].pk2) for v in nodes}
    sent = S.share_secrets(1, keys[1], S.random_seed(), public, 2, FLOOR)
    assert set(sent) == {2, 3}  # a share for each other neighbour, none for itself
    other = S.share_secrets(2, keys[2], S.random_seed(), public, 2, FLOOR)
    with pytest.raises(S.SecAggError, match="does not decrypt"):
        S.open_shares(3, keys[3], public, {1: other[3], 2: sent[3]}, 2)  # node 1's share to 3, passed off as node 2's
    with pytest.raises(S.SecAggError, match="not a neighbour"):
        S.open_shares(3, keys[3], {k: public[k] for k in (2, 3)}, {1: sent[3], 2: sent[3]}, 2)
    with pytest.raises(S.SecAggError, match="fewer than the threshold"):  # its only share holders: too few to ever unmask it
        S.open_shares(3, keys[3], public, {1: sent[3]}, 2)
    assert set(S.open_shares(3, keys[3], public, {1: sent[3], 2: other[3]}, 2)) == {1, 2}


def test_fixed_point_is_exact_on_integers_unbiased_and_refuses_what_could_overflow():
    rng = np.random.default_rng(0)
    counts = np.array([0, 1, 5, 2**20, -3], dtype=np.float64)
    np.testing.assert_array_equal(S.decode(S.encode(counts, 24, rng), 24), counts)
    x = np.full(20000, 0.3)
    got = S.decode(S.encode(x, 8, rng), 8)
    assert set(np.unique(got)) <= {76 / 256, 77 / 256} and abs(got.mean() - 0.3) < 1e-3
    assert S.fraction_bits(1.0) == S.MAX_FRAC_BITS
    frac = S.fraction_bits(1e12)
    assert 1e12 * 2.0**frac < 2.0**62 and frac >= S.MIN_FRAC_BITS
    with pytest.raises(S.SecAggError, match="overflow"):
        S.fraction_bits(2.0**60)


def test_share_counts_and_thresholds():
    assert S.share_count(200, 0) == 2 * 8 + 1  # 2·⌈log2 200⌉+1
    assert S.share_count(4, 0) == 4 and S.share_count(2, 0) == 2
    assert S.share_count(50, 6) == 7
    assert S.threshold_for(16, 0.5) == 9 and S.threshold_for(2, 0.5) == 2 and S.threshold_for(3, 0.5) == 2  # of the k - 1 holders
    assert S.threshold_for(1, 0.5) == 2  # above the one holder: a neighbourhood of 2 can never rebuild
    assert S.client_floor(min_replies=1, secagg_shares=0, secagg_threshold=0.5) == S.Floor(3, 2, 0.5)
    assert S.client_floor(min_replies=10, secagg_shares=0, secagg_threshold=0.5) == S.Floor(9, 5, 0.5)  # 2*4+1
    assert S.client_floor(min_replies=40, secagg_shares=7, secagg_threshold=0.7) == S.Floor(7, 5, 0.7)
    graph = S.neighbour_graph(list(range(20)), 5, random.Random(3))
    assert all(len(g) == 5 and v in g for v, g in graph.items())
    assert all((u in graph[v]) == (v in graph[u]) for u in graph for v in graph)
