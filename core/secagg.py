"""SecAgg+ (Bell et al. 2020) as plain functions: the server learns the sum of the clients'
vectors and nothing else about any one of them, and survives clients that drop out after
sharing their keys.

Each round, every client makes two fresh key pairs, Shamir-shares a fresh mask seed and
its first private key among its other neighbours (a k-regular graph over the round's clients;
a client never holds, so never reveals, a share of its own secrets),
and sends ``x + PRG(seed) ± Σ PRG(shared key with each neighbour) mod 2^64``. The pairwise
masks cancel in the sum; the server removes each survivor's seed mask from shares of its
seed, and a dropped client's pairwise masks from shares of its private key.

Built from the primitives in core/secagg_primitives.py (``cryptography``'s EC key pairs,
ECDH + HKDF key agreement and Fernet encryption of the shares; PyCryptodome's Shamir secret
sharing over GF(2^128); the share framing), the steps of Flower's legacy ``secaggplus_mod``, with no
Flower import. Two departures from that mod, both to close gaps in it:
- masks come from ChaCha20 keyed with the whole 32-byte seed or shared key
  (``cryptography``), not Flower's ``secaggplus_utils.pseudo_rand_gen``, which folds the seed to
  32 bits for NumPy's ``RandomState`` (a mask of 2^32 possible values) and draws below
  ``num_range - 1`` (never the top value);
- the server can check every secret it rebuilds (a hash of the seed is sent with the
  public keys; a rebuilt private key must match its public key), so a client that sends
  a bad share is found rather than silently spoiling the sum; and a client refuses to
  reveal both secrets of one neighbour (asked as alive and as dropped in one request).
A client also checks what a deviating server announces against a floor it takes from its
own run config (:func:`client_floor`): a threshold of at least 2 and a majority of its share
holders, a neighbourhood no smaller than the config implies, and never itself named in an
unmask request. What no check here can stop (a server that invents neighbours' keys) is in
docs/secure-aggregation.md.

Values are fixed-point integers mod 2^64 (two's complement): ``frac`` fraction bits chosen
so that the largest possible |sum| stays below 2^62 (:func:`fraction_bits`), with
stochastic rounding from OS entropy (unbiased).
"""

from __future__ import annotations

import hashlib
import math
import os
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from headway.core import secagg_primitives as C
from headway.core.settings import Settings

MOD_BITS = 64  # arithmetic mod 2^64, numpy's uint64 wrap-around
HEADROOM_BITS = 62  # the largest |sum| a config may reach is below 2^62: one bit of margin for rounding
MAX_FRAC_BITS = 32
MIN_FRAC_BITS = 8  # coarser than 2^-8 per value is refused, not silently used
SEED_BYTES = 32
CURVE = C.CURVE
MIN_CLIENTS = 3  # a secret needs >= 2 shares to rebuild, all held by other clients: a secure sum needs 3 clients
MAX_KEY_BYTES = 1024  # a PEM public key of SECP384R1 is ~215 bytes; anything far larger is not a key


class SecAggError(ValueError):
    """A protocol step cannot go on: what was wrong, for the round's failure reasons."""


# ----- fixed point ---------------------------------------------------------------------


def fraction_bits(bound: float) -> int:
    """Fraction bits for sums whose entries never exceed ``bound`` in magnitude: the most
    (up to 32) that keep bound·2^f below 2^62. Raises SecAggError when fewer than 8 remain."""
    if not math.isfinite(bound) or bound <= 0:
        raise SecAggError(f"the bound on the summed values must be a positive finite number, got {bound}")
    frac = min(MAX_FRAC_BITS, HEADROOM_BITS - 1 - math.ceil(math.log2(bound)))
    if frac < MIN_FRAC_BITS:
        raise SecAggError(
            f"a sum bounded by {bound:.3g} leaves {frac} fraction bits in 64-bit fixed point (at least {MIN_FRAC_BITS} needed): "
            "it could overflow the modulus; lower the bound (e.g. the clip) or the number of clients per round"
        )
    return frac


def encode(values: np.ndarray, frac: int, rng: np.random.Generator) -> np.ndarray:
    """float values -> uint64 fixed point with ``frac`` fraction bits, rounded stochastically
    (E[decode(encode(v))] = v); integers are exact."""
    scaled = np.asarray(values, dtype=np.float64).ravel() * float(2**frac)
    low = np.floor(scaled)
    rounded = low + (rng.random(scaled.shape) < scaled - low)
    return rounded.astype(np.int64).view(np.uint64)


def decode(total: np.ndarray, frac: int) -> np.ndarray:
    """uint64 fixed point (a sum mod 2^64, read as two's complement) -> float64."""
    return np.asarray(total, dtype=np.uint64).view(np.int64).astype(np.float64) / float(2**frac)


# ----- masks -----------------------------------------------------------------------------


def mask(key: bytes, size: int) -> np.ndarray:
    """``size`` uniform uint64 values from ChaCha20 keyed with the 32-byte ``key``."""
    if len(key) != 32:
        raise SecAggError(f"a mask key has 32 bytes, got {len(key)}")
    stream = Cipher(algorithms.ChaCha20(key, b"\0" * 16), mode=None).encryptor()
    return np.frombuffer(stream.update(b"\0" * (8 * size)), dtype="<u8").astype(np.uint64)


def pair_key(private_key: bytes, public_key: bytes) -> bytes:
    """The 32-byte key two clients agree on (ECDH + HKDF), as raw bytes."""
    return C.agree(private_key, public_key)


def pair_sign(me: int, peer: int) -> int:
    """+1 when ``me`` adds the mask it shares with ``peer``, −1 when it subtracts it (Flower's rule: the larger id adds)."""
    return 1 if me > peer else -1


def seed_digest(seed: bytes) -> bytes:
    """What a client commits to about its seed with its public keys: SHA-256."""
    return hashlib.sha256(seed).digest()


# ----- the neighbour graph -------------------------------------------------------------------


def share_count(clients: int, wanted: int) -> int:
    """How many shares (neighbours, self included) each client makes: ``wanted`` when > 0,
    else 2·⌈log2 n⌉+1 (SecAgg+'s O(log n)); odd, at least 3, at most n."""
    k = wanted if wanted > 0 else 2 * math.ceil(math.log2(max(clients, 2))) + 1
    k += 1 - k % 2
    return max(min(k, clients), min(3, clients))


def threshold_for(holders: int, fraction: float) -> int:
    """Shares needed to rebuild a secret: more than ``fraction`` of its ``holders`` (the owner's
    other neighbours, one share each), at least 2; above ``holders`` when they are too few."""
    return max(2, min(holders, math.floor(fraction * holders) + 1))


@dataclass(frozen=True)
class Floor:
    """The least a client accepts from the server, taken from its own run config, never from a stage message."""

    neighbours: int  # announced neighbourhood, the client included
    threshold: int
    fraction: float  # the threshold must be more than this fraction of the announced share holders


def client_floor(min_replies: int, secagg_shares: int, secagg_threshold: float) -> Floor:
    """What the run config (``min-replies``, ``secagg-shares``, ``secagg-threshold``) implies for the smallest
    round an honest server unmasks, max(3, min-replies) clients: its neighbourhood size and threshold."""
    fraction = float(secagg_threshold)
    smallest = max(MIN_CLIENTS, int(min_replies))
    k = share_count(smallest, int(secagg_shares))
    return Floor(k, threshold_for(k - 1, fraction), fraction)


def settings_floor(cfg: Settings) -> Floor:
    """:func:`client_floor` of a run's settings."""
    return client_floor(cfg.min_replies, cfg.secagg_shares, cfg.secagg_threshold)


NODE_PINS = ("secure-aggregation", "min-replies", "secagg-shares", "secagg-threshold")  # node-config keys a node may pin


def pinned_floor(cfg: Settings, node_config: Mapping[str, Any]) -> Settings:
    """``cfg`` with this node's own pins (its node config, which whoever submits the run cannot change)
    applied: the stricter of the run's and the node's ``min-replies``, ``secagg-shares`` and
    ``secagg-threshold``. SecAggError when the node pins ``secure-aggregation=secagg+`` and the run is
    not under it, or when a pin is not a number."""
    pinned = str(node_config.get("secure-aggregation", "") or "").strip()
    if pinned not in ("", "off", "secagg+"):
        raise SecAggError(f"node config 'secure-aggregation' must be 'secagg+' (or left out), got {pinned!r}")
    if pinned == "secagg+" and cfg.secure_aggregation != "secagg+":
        raise SecAggError(
            f"this node pins secure-aggregation='secagg+' in its node config and the run has {cfg.secure_aggregation!r}: "
            "it sends nothing in the clear; submit the run with secure-aggregation='secagg+'"
        )
    return replace(
        cfg,
        min_replies=int(_stricter(node_config, "min-replies", int, cfg.min_replies)),
        secagg_shares=int(_stricter(node_config, "secagg-shares", int, cfg.secagg_shares)),
        secagg_threshold=float(_stricter(node_config, "secagg-threshold", float, cfg.secagg_threshold)),
    )


def _stricter(node_config: Mapping[str, Any], key: str, kind: type[int] | type[float], run_value: float) -> float:
    """The larger of the run's value of ``key`` and the node's pin of it (none: the run's); SecAggError when the pin is not a number."""
    if key not in node_config:
        return run_value
    try:
        value = kind(node_config[key])
    except (TypeError, ValueError):
        raise SecAggError(f"node config '{key}' must be a number, got {node_config[key]!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise SecAggError(f"node config '{key}' must be a finite number >= 0, got {node_config[key]!r}")
    return max(run_value, value)


def check_threshold(floor: Floor, threshold: int) -> None:
    """Setup: refuse a threshold below what this client's run config implies (at least 2)."""
    if threshold < max(2, floor.threshold):
        raise SecAggError(
            f"the server asks for threshold {threshold}, below the {max(2, floor.threshold)} this client's run config implies "
            f"(min-replies, secagg-shares, secagg-threshold): fewer shares would rebuild its secrets; refused"
        )


def check_neighbourhood(floor: Floor, size: int, threshold: int) -> None:
    """Share keys: refuse a neighbourhood (this client included) smaller than the run config implies, or one
    whose ``size - 1`` share holders the threshold is not more than ``floor.fraction`` of, or cannot reach."""
    if size < floor.neighbours:
        raise SecAggError(
            f"the server names {size} neighbour(s) (this client included), fewer than the {floor.neighbours} this client's run "
            "config implies (secagg-shares over max(3, min-replies) clients): its secrets would rest on too few clients; refused"
        )
    if threshold > size - 1:
        raise SecAggError(
            f"threshold {threshold} is above the {size - 1} other neighbours that would hold shares: nothing could be rebuilt"
        )
    if threshold < threshold_for(size - 1, floor.fraction):
        raise SecAggError(
            f"threshold {threshold} is not more than secagg-threshold={floor.fraction:g} of the {size - 1} share holders "
            "(at least 2): two disjoint groups of them could each rebuild a secret; refused"
        )


def neighbour_graph(nodes: Sequence[int], shares: int, rng: random.Random | None = None) -> dict[int, frozenset[int]]:
    """Each node's neighbours (itself included): a ring over the nodes in random order, each
    joined to the ``shares // 2`` before and after it (``shares`` = n: everyone)."""
    order = list(nodes)
    (rng or random.SystemRandom()).shuffle(order)
    n, half = len(order), shares // 2
    if shares >= n:
        return {v: frozenset(order) for v in order}
    return {v: frozenset(order[(i + j) % n] for j in range(-half, half + 1)) for i, v in enumerate(order)}


# ----- the client ------------------------------------------------------------------------------


@dataclass
class Keys:
    """A client's key pairs for one round: 1 for pairwise masks, 2 for encrypting shares."""

    sk1: bytes
    pk1: bytes
    sk2: bytes
    pk2: bytes


def new_keys() -> Keys:
    """Two fresh key pairs on :data:`CURVE` for one round (PEM bytes, as they travel)."""
    sk1, pk1 = C.new_key_pair()
    sk2, pk2 = C.new_key_pair()
    return Keys(sk1, pk1, sk2, pk2)


def share_secrets(
    me: int, keys: Keys, seed: bytes, neighbours: Mapping[int, tuple[bytes, bytes]], threshold: int, floor: Floor
) -> dict[int, bytes]:
    """Stage 1: Shamir shares of ``seed`` and ``keys.sk1``, one for each other neighbour and none
    for this client: {neighbour: ciphertext}, each encrypted to the neighbour's second public
    key. Refuses a neighbourhood or threshold below ``floor`` (:func:`check_neighbourhood`)."""
    if neighbours.get(me) != (keys.pk1, keys.pk2):
        raise SecAggError("the neighbour list does not carry this client's own public keys")
    check_threshold(floor, threshold)
    check_neighbourhood(floor, len(neighbours), threshold)
    if not (len(neighbours) - 1) / 2 < threshold:  # a majority: two disjoint sets of share holders could each rebuild a secret
        raise SecAggError(f"threshold {threshold} is not more than half of {len(neighbours) - 1} share holders")
    listed = [k for pair in neighbours.values() for k in pair]
    if len(set(listed)) != len(listed):
        raise SecAggError("two neighbours share a public key")
    order = sorted(set(neighbours) - {me})
    seed_shares = C.create_shares(seed, threshold, len(order))
    key_shares = C.create_shares(keys.sk1, threshold, len(order))
    out: dict[int, bytes] = {}
    for peer, seed_share, key_share in zip(order, seed_shares, key_shares, strict=True):
        secret = C.agree(keys.sk2, neighbours[peer][1])
        out[peer] = C.encrypt(secret, C.pack_pair(me, peer, seed_share, key_share))
    return out


def open_shares(
    me: int, keys: Keys, neighbours: Mapping[int, tuple[bytes, bytes]], ciphertexts: Mapping[int, bytes], threshold: int
) -> dict[int, tuple[bytes, bytes]]:
    """Stage 2: decrypt the shares the other neighbours sent this client; each must come
    from who the server says and be meant for this client. Fewer than ``threshold`` senders
    are refused: they are the only holders of this client's shares, too few to unmask it."""
    if len(ciphertexts) < threshold:
        raise SecAggError(f"shares from {len(ciphertexts)} neighbours, fewer than the threshold {threshold}")
    held: dict[int, tuple[bytes, bytes]] = {}
    for src, text in ciphertexts.items():
        if src == me or src not in neighbours:
            raise SecAggError(f"a share from node {src}, which is not a neighbour of this client")
        secret = C.agree(keys.sk2, neighbours[src][1])
        try:
            sender, dst, seed_share, key_share = C.unpack_pair(C.decrypt(secret, text))
        except ValueError:
            raise SecAggError(
                f"the share relayed as from node {src} does not decrypt with the key this client shares with node {src}, "
                "or is not a pair of shares"
            ) from None
        if sender != src or dst != me:
            raise SecAggError(f"the share relayed as from node {src} to node {me} says it is from node {sender} to node {dst}")
        held[src] = (seed_share, key_share)
    return held


def masked(me: int, keys: Keys, seed: bytes, encoded: np.ndarray, peers: Mapping[int, bytes]) -> np.ndarray:
    """Stage 2: the encoded vector plus the seed's mask and ± the mask shared with each
    peer (the neighbours whose shares this client holds: ``peers`` maps them to their first
    public key), mod 2^64."""
    out = np.asarray(encoded, dtype=np.uint64) + mask(seed, encoded.size)
    for peer, pk1 in peers.items():
        pairwise = mask(pair_key(keys.sk1, pk1), encoded.size)
        out = out + pairwise if pair_sign(me, peer) > 0 else out - pairwise
    return out


def reveal(
    me: int, held: Mapping[int, tuple[bytes, bytes]], alive: Iterable[int], dropped: Iterable[int], threshold: int
) -> dict[int, bytes]:
    """Stage 3: the seed share of every other neighbour that sent its masked vector and the key
    share of every one that did not. Refuses a request that names this client (it is answering,
    and holds no share of its own secrets), names one neighbour as both (the two secrets
    together unmask its vector), names a client it holds no share of, or names fewer alive
    neighbours than the threshold (then no honest server could rebuild this client's seed)."""
    alive, dropped = set(alive), set(dropped)
    if me in alive | dropped:
        named = "dropped" if me in dropped else "alive"
        raise SecAggError(
            f"this client (node {me}) is named {named} in its own unmask request: it answers, and never reveals a share of its own secrets"
        )
    if both := alive & dropped:
        raise SecAggError(f"node(s) {sorted(both)} named as both alive and dropped: revealing both secrets would unmask them")
    if unknown := (alive | dropped) - set(held):
        raise SecAggError(f"node(s) {sorted(unknown)} are not neighbours whose shares this client holds")
    if len(alive) < threshold:
        raise SecAggError(f"{len(alive)} neighbours alive, fewer than the threshold {threshold}")
    return {v: held[v][0] for v in alive} | {v: held[v][1] for v in dropped}


# ----- the server ------------------------------------------------------------------------------


def rebuild(shares: Sequence[bytes], threshold: int, valid: Callable[[bytes], bool]) -> bytes:
    """A secret from its shares, checked by ``valid``: from the first ``threshold`` of them
    (interpolation costs grow with the square of the shares used), and if that is not valid
    (a bad share), from every set that leaves one share out. Raises SecAggError."""
    if len(shares) < threshold:
        raise SecAggError(f"{len(shares)} shares, fewer than the threshold {threshold}")
    trials = [list(shares[:threshold])]
    if len(shares) > threshold:
        trials += [[s for j, s in enumerate(shares) if j != i] for i in range(len(shares))]
    for trial in trials:
        try:
            secret = C.combine_shares(trial)
        except ValueError:
            continue
        if valid(secret):
            return secret
    raise SecAggError("the shares do not rebuild a secret that matches what its owner committed to (a bad share among too few, or several)")


def unmask_sum(
    total: np.ndarray,
    alive: Iterable[int],
    dropped: Iterable[int],
    shares: Mapping[int, Sequence[bytes]],
    public_keys: Mapping[int, tuple[bytes, bytes]],
    digests: Mapping[int, bytes],
    peers: Mapping[int, Iterable[int]],
    threshold: int,
) -> np.ndarray:
    """The sum of the alive clients' encoded vectors from the sum of their masked ones:
    subtract each alive client's seed mask and cancel the pairwise masks alive clients share
    with dropped ones (``peers[v]``: whose shares v held, so whom it masked with). ``shares``
    maps each client to the shares of its secret the survivors revealed."""
    out = np.asarray(total, dtype=np.uint64).copy()
    for v in sorted(set(alive)):
        digest = digests[v]

        def is_seed(secret: bytes, digest: bytes = digest) -> bool:
            return len(secret) == SEED_BYTES and seed_digest(secret) == digest

        out = out - mask(rebuild(shares.get(v, []), threshold, is_seed), out.size)
    needed = {d for d in set(dropped) if any(d in set(peers[v]) for v in set(alive))}  # only dropped clients someone masked with
    for d in sorted(needed):
        pk1 = public_keys[d][0]

        def is_key(secret: bytes, pk1: bytes = pk1) -> bool:
            return _key_matches(secret, pk1)

        sk1 = rebuild(shares.get(d, []), threshold, is_key)
        for v in sorted(set(alive)):
            if d in set(peers[v]):
                pairwise = mask(pair_key(sk1, public_keys[v][0]), out.size)
                out = out - pairwise if pair_sign(v, d) > 0 else out + pairwise  # undo the sign v applied
    return out


def _key_matches(private: bytes, public: bytes) -> bool:
    try:
        return C.public_key_of(private) == public
    except ValueError:
        return False


def random_seed() -> bytes:
    """A fresh mask seed from OS entropy."""
    return os.urandom(SEED_BYTES)


# ----- the server's bookkeeping between stages -----------------------------------------------


def key_requests(graph: Mapping[int, frozenset[int]], keys: Mapping[int, tuple[bytes, bytes]]) -> dict[int, dict[int, tuple[bytes, bytes]]]:
    """Stage 1's message to each client that sent its keys: the keys of its neighbours that did (itself included)."""
    return {v: {u: keys[u] for u in graph[v] if u in keys} for v in keys}


def share_problem(me: int, asked: Mapping[int, tuple[bytes, bytes]], ciphertexts: Mapping[int, bytes]) -> str | None:
    """Why a client's stage-1 reply is not one ciphertext for each neighbour it was given (other than itself), or None."""
    want = set(asked) - {me}
    if set(ciphertexts) != want:
        return f"shares for nodes {sorted(set(ciphertexts) - want)[:5]} it was not given and none for {sorted(want - set(ciphertexts))[:5]}"
    return None


def relay_shares(sent: Mapping[int, Mapping[int, bytes]]) -> dict[int, dict[int, bytes]]:
    """Stage 2's shares for each client that sent its own: {receiver: {sender: ciphertext}}."""
    out: dict[int, dict[int, bytes]] = {v: {} for v in sent}
    for src, texts in sent.items():
        for dst, text in texts.items():
            if dst in out:
                out[dst][src] = text
    return out


def unmask_requests(peers: Mapping[int, Iterable[int]], collected: Iterable[int]) -> dict[int, tuple[list[int], list[int]]]:
    """Stage 3's question to each client whose masked vector arrived: which of the clients it
    holds shares of (``peers[v]``, never itself) are alive, which dropped after sharing."""
    done = set(collected)
    out = {}
    for v in sorted(done):
        held = set(peers[v]) - {v}
        out[v] = (sorted(held & done), sorted(held - done))
    return out


def gather_shares(
    requests: Mapping[int, tuple[list[int], list[int]]], answers: Mapping[int, Mapping[int, bytes]]
) -> dict[int, list[bytes]]:
    """Each client's revealed shares, from the answers that name exactly what they were asked."""
    out: dict[int, list[bytes]] = {}
    for v, revealed in answers.items():
        alive, dropped = requests[v]
        if set(revealed) != set(alive) | set(dropped):
            continue
        for owner, share in revealed.items():
            out.setdefault(owner, []).append(share)
    return out
