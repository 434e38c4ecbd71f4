"""core/secagg_primitives.py against answers computed apart from it: Shamir's shares against
PyCryptodome's Shamir called directly on known chunks (the padding written out by hand), the
key agreement and encryption against Flower's own implementation of the same construction
(ECDH + HKDF-SHA256, Fernet)."""

from __future__ import annotations

import base64
import itertools
import os
import struct

import pytest
from Crypto.Protocol.SecretSharing import Shamir
from headway.core import secagg_primitives as C

CHUNK = 16  # an element of GF(2^128), the size PyCryptodome shares
# lengths around the chunk size (a multiple of it pads a whole chunk), and secrets with leading zero bytes
SECRETS = [b"\x07", os.urandom(15), os.urandom(16), b"\0\0" + os.urandom(15), os.urandom(32), b"\0" * 130, os.urandom(306)]


def chunks(share: bytes) -> tuple[int, int, list[bytes]]:
    """(x, secret length, chunk shares) of a share, read by the layout the module documents, not by its parser."""
    x, length = struct.unpack_from("<II", share)
    return x, length, [share[i : i + CHUNK] for i in range(8, len(share), CHUNK)]


def framed(x: int, length: int, values: list[bytes]) -> bytes:
    """A share at ``x`` of a secret of ``length`` bytes, with the given chunk shares."""
    return struct.pack("<II", x, length) + b"".join(values)


def pkcs7(secret: bytes) -> bytes:
    """``secret`` padded to whole chunks by hand: n bytes of value n, 1 <= n <= 16."""
    n = CHUNK - len(secret) % CHUNK
    return secret + bytes([n]) * n


@pytest.mark.parametrize("secret", SECRETS, ids=lambda s: f"{len(s)}B")
def test_every_set_of_threshold_shares_rebuilds_the_secret(secret):
    for threshold, num in ((2, 4), (3, 5)):  # even and odd numbers of points to interpolate through
        shares = C.create_shares(secret, threshold, num)
        assert len({s[:4] for s in shares}) == num
        for subset in itertools.combinations(shares, threshold):
            assert C.combine_shares(list(subset)) == secret
        assert C.combine_shares(shares) == secret  # more than the threshold agree too


def test_shares_pycryptodome_makes_of_a_known_chunk_are_combined_by_ours_and_back():
    """A 15-byte secret pads to one chunk (secret + 0x01): PyCryptodome's own shares of that
    chunk, framed by the documented layout, rebuild the secret through combine_shares; and our
    shares of a 20-byte secret, chunk by chunk through PyCryptodome's combine, give its padding."""
    secret = b"fifteen bytes!!"
    theirs = Shamir.split(2, 3, pkcs7(secret), ssss=False)
    for pair in itertools.combinations(theirs, 2):
        assert C.combine_shares([framed(x, len(secret), [value]) for x, value in pair]) == secret
    secret = os.urandom(20)
    ours = [chunks(s) for s in C.create_shares(secret, 3, 4)]
    assert all(length == 20 and len(values) == 2 for _, length, values in ours)
    rebuilt = b"".join(Shamir.combine([(x, values[k]) for x, _, values in ours[1:]], ssss=False) for k in range(2))
    assert rebuilt == pkcs7(secret) == secret + b"\x0c" * 12


def test_fewer_than_threshold_shares_leave_every_secret_possible():
    """t = 3, shares at x = 1, 2: for ANY candidate secret there is a share at x = 3 that completes
    them to quadratics whose constant terms are the candidate's padded chunks, so the two shares
    cannot single out the secret; and combining just the two does not give it back. The completing
    value: in GF(2^128), of characteristic 2, x -> x + 3 swaps 0 with 3 and 1 with 2, so f(3) is the
    value at 0 of the quadratic through (3, c), (2, f(1)), (1, f(2)), which PyCryptodome computes."""
    secret = os.urandom(32)
    s1, s2, _ = C.create_shares(secret, 3, 3)
    (_, _, ys1), (_, _, ys2) = chunks(s1), chunks(s2)
    for candidate in (secret, os.urandom(32), b"\0" * 32, b"\xff" * 32):
        padded = [pkcs7(candidate)[i : i + CHUNK] for i in range(0, 48, CHUNK)]
        at3 = [Shamir.combine([(3, c), (2, y1), (1, y2)], ssss=False) for c, y1, y2 in zip(padded, ys1, ys2, strict=True)]
        assert C.combine_shares([s1, s2, framed(3, 32, at3)]) == candidate
    try:
        assert C.combine_shares([s1, s2]) != secret
    except ValueError:
        pass  # two points of a random quadratic usually rebuild bytes whose padding does not come back: also not the secret


def test_a_sharing_is_fresh_each_time():
    a, b = C.create_shares(b"same secret", 2, 3), C.create_shares(b"same secret", 2, 3)
    assert all(x != y for x, y in zip(a, b, strict=True))


def test_malformed_or_mismatched_shares_raise():
    secret = os.urandom(40)
    shares = C.create_shares(secret, 2, 4)
    other = C.create_shares(os.urandom(80), 2, 4)
    x0, _, ys0 = chunks(shares[0])
    x1, _, ys1 = chunks(shares[1])
    bad_padding = pkcs7(secret)[:-1] + b"\0"  # 48 bytes that are no PKCS#7 padding of anything
    unpadded = [Shamir.split(2, 2, bad_padding[i : i + CHUNK], ssss=False) for i in range(0, 48, CHUNK)]
    bad = {
        "no shares": [],
        "one x twice": [shares[0], shares[0]],
        "different secrets' lengths": [shares[0], other[1]],
        # consistent with the others (f(0) is the padded secret itself): only the refusal of x = 0 stops it
        "x = 0": [framed(0, 40, [pkcs7(secret)[i : i + CHUNK] for i in range(0, 48, CHUNK)]), shares[1]],
        "a length its padding contradicts": [framed(x0, 41, ys0), framed(x1, 41, ys1)],
        "padding that does not come back": [framed(k + 1, 40, [pairs[k][1] for pairs in unpadded]) for k in range(2)],
        "truncated": [shares[0][:-1], shares[1]],
        "a chunk too many": [shares[0] + bytes(CHUNK), shares[1] + bytes(CHUNK)],
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
