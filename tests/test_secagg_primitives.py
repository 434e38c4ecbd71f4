"""core/secagg_primitives.py against answers computed apart from it: Shamir's shares checked with
Lagrange's formula written out by hand for small thresholds, the key agreement and encryption
against Flower's own implementation of the same construction (ECDH + HKDF-SHA256, Fernet)."""

from __future__ import annotations

import base64
import itertools
import os

import pytest

from core import secagg_primitives as C

# lengths around the chunk size, and secrets with leading zero bytes (an integer would drop them)
SECRETS = [b"\x07", os.urandom(32), b"\0\0" + os.urandom(62), os.urandom(64), os.urandom(65), b"\0" * 130, os.urandom(306)]


def values(share: bytes) -> tuple[int, list[int]]:
    """(x, chunk values) of a share, read by the layout the module documents, not by its parser."""
    x = int.from_bytes(share[:4], "little")
    body = share[8:]
    return x, [int.from_bytes(body[i : i + C.VALUE_BYTES], "big") for i in range(0, len(body), C.VALUE_BYTES)]


def with_values(share: bytes, x: int, ys: list[int]) -> bytes:
    """A share at ``x`` with the given chunk values and the header's length of ``share``."""
    return x.to_bytes(4, "little") + share[4:8] + b"".join(y.to_bytes(C.VALUE_BYTES, "big") for y in ys)


@pytest.mark.parametrize("secret", SECRETS, ids=lambda s: f"{len(s)}B")
def test_every_set_of_threshold_shares_rebuilds_the_secret(secret):
    for threshold, num in ((2, 4), (3, 5)):  # even and odd: Lagrange's signs alternate with the number of points
        shares = C.create_shares(secret, threshold, num)
        assert len({s[:4] for s in shares}) == num
        for subset in itertools.combinations(shares, threshold):
            assert C.combine_shares(list(subset)) == secret
        assert C.combine_shares(shares) == secret  # more than the threshold agree too


def test_two_shares_of_a_line_give_the_secret_by_the_hand_written_formula():
    """t = 2: f(x) = s + a·x, so s = 2·f(1) − f(2) mod p, chunk by chunk (big-endian, 64 bytes each)."""
    secret = os.urandom(100)
    one, two = (values(s)[1] for s in C.create_shares(secret, 2, 2))
    chunks = [(2 * y1 - y2) % C.PRIME for y1, y2 in zip(one, two, strict=True)]
    assert chunks == [int.from_bytes(secret[:64], "big"), int.from_bytes(secret[64:], "big")]
    assert C.PRIME == 2**521 - 1 and pow(3, C.PRIME - 1, C.PRIME) == 1  # the Mersenne prime M521 (Fermat's test as a check)


def test_fewer_than_threshold_shares_leave_every_secret_possible():
    """t = 3, shares at x = 1, 2: for ANY candidate secret s' there is a value at x = 3 that completes
    them to a quadratic with f(0) = s' (Lagrange on 0, 1, 2: f(3) = s' − 3·f(1) + 3·f(2)), so the two
    shares cannot single out the secret; and combining just the two does not give it back."""
    secret = os.urandom(32)
    s1, s2, _ = C.create_shares(secret, 3, 3)
    (_, (y1,)), (_, (y2,)) = values(s1), values(s2)
    for candidate in (secret, os.urandom(32), b"\0" * 32, b"\xff" * 32):
        forged = with_values(s1, 3, [(int.from_bytes(candidate, "big") - 3 * y1 + 3 * y2) % C.PRIME])
        assert C.combine_shares([s1, s2, forged]) == candidate
    try:
        assert C.combine_shares([s1, s2]) != secret
    except ValueError:
        pass  # the line through two points of a random quadratic usually leaves the chunk's range: also not the secret


def test_a_sharing_is_fresh_each_time():
    a, b = C.create_shares(b"same secret", 2, 3), C.create_shares(b"same secret", 2, 3)
    assert all(x != y for x, y in zip(a, b, strict=True))


def test_malformed_or_mismatched_shares_raise():
    shares = C.create_shares(os.urandom(40), 2, 4)
    other = C.create_shares(os.urandom(80), 2, 4)
    x, ys = values(shares[0])
    bad = {
        "no shares": [],
        "one x twice": [shares[0], shares[0]],
        "different secrets' lengths": [shares[0], other[1]],
        "x = 0": [with_values(shares[0], 0, ys), shares[1]],
        "a value outside the field": [with_values(shares[0], x, [C.PRIME]), shares[1]],
        "truncated": [shares[0][:-1], shares[1]],
        "shorter than a header": [b"abc", shares[1]],
    }
    for name, case in bad.items():
        with pytest.raises(ValueError):
            C.combine_shares(case)
            pytest.fail(name)
    for threshold, num in ((0, 3), (4, 3)):
        with pytest.raises(ValueError):
            C.create_shares(b"s", threshold, num)
    with pytest.raises(ValueError):
        C.create_shares(b"", 2, 3)


def test_key_agreement_is_symmetric_private_to_the_pair_and_the_same_as_flowers():
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

    (ska, pka), (skb, pkb), (skc, pkc) = (C.new_key_pair() for _ in range(3))
    key = C.agree(ska, pkb)
    assert len(key) == 32 and key == C.agree(skb, pka)
    assert key != C.agree(ska, pkc) and key != C.agree(skc, pkb)
    assert base64.urlsafe_b64encode(key) == generate_shared_key(bytes_to_private_key(ska), bytes_to_public_key(pkb))
    assert C.load_public_key(pka).curve.name == C.CURVE and C.public_key_of(ska) == pka


def test_keys_that_are_not_ec_keys_are_refused_as_value_errors():
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    edwards = ed25519.Ed25519PrivateKey.generate()
    public = edwards.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    private = edwards.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    encrypted = C.load_private_key(C.new_key_pair()[0]).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")
    )
    for data in (public, b"not a key", b""):
        with pytest.raises(ValueError):
            C.load_public_key(data)
    for data in (private, encrypted, b"not a key"):
        with pytest.raises(ValueError):
            C.load_private_key(data)


def test_encryption_round_trips_and_rejects_tampering_and_other_keys():
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt

    key, other = os.urandom(32), os.urandom(32)
    text = b"two shares and who they are for"
    token = C.encrypt(key, text)
    assert C.decrypt(key, token) == text and text not in token
    assert decrypt(base64.urlsafe_b64encode(key), token) == text  # Flower's Fernet reads it: the same construction
    raw = bytearray(base64.urlsafe_b64decode(token))
    for i in (0, 9, 30, len(raw) - 1):  # version byte, IV, ciphertext, HMAC
        altered = raw.copy()
        altered[i] ^= 1
        with pytest.raises(ValueError):
            C.decrypt(key, base64.urlsafe_b64encode(bytes(altered)))
    with pytest.raises(ValueError):
        C.decrypt(other, token)


def test_a_pair_of_shares_frames_and_unframes():
    plain = C.pack_pair(2**64 - 1, 7, b"seed share", b"key share")
    assert C.unpack_pair(plain) == (2**64 - 1, 7, b"seed share", b"key share")
    assert C.unpack_pair(C.pack_pair(1, 2, b"", b"k")) == (1, 2, b"", b"k")
    for short in (plain[:19], plain[:25]):
        with pytest.raises(ValueError):
            C.unpack_pair(short)
